"""modelfleet edge node: serves ONNX models over OIP REST and KServe gRPC, follows central's
desired state, fetches and seeds chunks among peers. See docs/architecture.md (Edge layout)
for what each subpackage does; ``edge_node.server`` runs one."""
