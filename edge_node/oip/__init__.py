"""The Open Inference Protocol v2 (KServe / Triton / MLServer): one inference service
(``dataplane``) behind REST (``routes``) and KServe v2 gRPC (``grpc_servicer``).

Nothing is imported here: the REST routes import FastAPI, which an edge loads off its event
loop while its models load (see ``edge_node.server``); import the module you need."""
