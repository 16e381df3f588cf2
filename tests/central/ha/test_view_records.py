"""A registration as replicas share it (``ha_nodes``): what the edge's runtime loads goes with
it, so every replica plans the same artifacts for the node; a row without it (an older replica
wrote it, or an edge that did not say) reads as unknown."""

from __future__ import annotations

from central.ha.view import record_from_json, record_to_json
from central.membership.nodes import NodeRecord
from fleetwire.runtime_limits import RuntimeLimits

RUNTIME = RuntimeLimits("onnxruntime 1.17.0", max_ir_version=9, max_opsets={"": 20, "ai.onnx.ml": 4})


def test_a_registration_keeps_its_runtime_through_the_shared_store() -> None:
    record = NodeRecord("edge-0", "127.0.0.1:1", "127.0.0.1:2", hardware_class="x86_64/avx2/2c/cpu", runtime=RUNTIME)
    back = record_from_json("edge-0", record_to_json(record))
    assert back.runtime == RUNTIME and back.hardware_class == record.hardware_class


def test_a_row_without_a_readable_runtime_reads_as_unknown() -> None:
    body = record_to_json(NodeRecord("edge-0", "127.0.0.1:1", "127.0.0.1:2"))
    assert body["runtime"] is None and record_from_json("edge-0", body).runtime is None
    for bad in ({"runtime": "x"}, {"max_ir_version": 9}, None, "onnxruntime"):
        assert record_from_json("edge-0", {**body, "runtime": bad}).runtime is None
