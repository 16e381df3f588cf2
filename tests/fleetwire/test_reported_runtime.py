"""Runtime limits as edges report them: capped by an operator, judged against a model's
format, carried in the Register request and read back, and the push report's formats."""

from __future__ import annotations

from fleetwire.convert import register_request, runtime_from_pb
from fleetwire.runtime_limits import FORMATS_KEY, ModelFormat, RuntimeLimits, manifest_formats
from fleetwire.v1 import registry_pb2

PROBED = RuntimeLimits("onnxruntime 1.31.1", max_ir_version=13, max_opsets={"": 26, "ai.onnx.ml": 5})


def test_a_cap_only_lowers_and_says_so() -> None:
    capped = PROBED.capped(max_ir_version=9, max_opset=18)
    assert (capped.max_ir_version, capped.max_opset("ai.onnx"), capped.max_opset("ai.onnx.ml")) == (9, 18, 5)
    assert capped.runtime == "onnxruntime 1.31.1 (capped)" and capped.capped(max_opset=17).runtime == capped.runtime
    assert PROBED.capped() is PROBED and PROBED.capped(max_ir_version=20, max_opset=30) is PROBED


def test_a_format_newer_than_the_runtime_is_refused_with_the_reason() -> None:
    capped = PROBED.capped(max_opset=18)
    assert capped.refusal(ModelFormat(10, {"": 18, "ai.onnx.ml": 5})) is None
    assert capped.refusal(ModelFormat(10, {"": 19})) == (
        "opset 19 of ai.onnx is newer than opset 18, the newest onnxruntime 1.31.1 (capped) loads"
    )
    assert capped.refusal(ModelFormat(14, {"": 17})) is not None
    assert capped.refusal(ModelFormat(10, {"com.microsoft": 99})) is None  # not probed: not held against it


def test_the_register_request_carries_the_limits_and_an_old_edge_says_nothing() -> None:
    node = registry_pb2.NodeInfo(node_id="edge-0")
    request = registry_pb2.RegisterRequest.FromString(register_request(node, PROBED).SerializeToString())
    assert runtime_from_pb(request) == PROBED and request.node.node_id == "edge-0"
    assert runtime_from_pb(register_request(node, None)) is None
    assert RuntimeLimits.from_json(PROBED.as_json()) == PROBED


def test_formats_are_read_from_the_push_report_and_bad_entries_left_out() -> None:
    report = {"served": "fp32", FORMATS_KEY: {"fp32": {"ir_version": 10, "opsets": {"ai.onnx": 21}}, "int8": {}}}
    assert manifest_formats(report) == {"fp32": ModelFormat(10, {"": 21})}
    assert manifest_formats(None) == {} and manifest_formats({"served": "fp32"}) == {}
