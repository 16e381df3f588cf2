"""What the installed ONNX Runtime loads (probed), and the oldest IR version a model's
content needs: the two facts a push is judged by before the checker's word is trusted."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from central.registry.ir_features import UNKNOWN_IR, required_ir_version
from fleetwire.runtime_limits import ML_DOMAIN, runtime_limits
from support.onnx_versions import dense_model, with_initializer_type


def _loads(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def test_the_limits_are_exactly_where_onnx_runtime_stops_loading() -> None:
    limits = runtime_limits()
    assert limits.runtime == f"onnxruntime {ort.__version__}"
    newest_ir, newest_opset = limits.max_ir_version, limits.max_opset("")
    assert newest_opset is not None and newest_opset >= 17 and limits.max_opset("ai.onnx") == newest_opset
    assert _loads(dense_model(newest_opset, newest_ir))
    assert not _loads(dense_model(newest_opset, newest_ir + 1))
    assert not _loads(dense_model(newest_opset + 1, newest_ir))
    assert limits.max_opset(ML_DOMAIN) is not None and limits.max_opset("com.example") is None


def test_a_plain_float_model_needs_only_what_its_opset_needs() -> None:
    model = dense_model(17)  # stamped with the installed onnx's newest IR version
    assert model.ir_version == onnx.IR_VERSION
    need = required_ir_version(model)
    assert need.ir_version == helper.find_min_ir_version_for(list(model.opset_import)) == 8
    assert need.why == "its opset imports"


@pytest.mark.parametrize(
    ("data_type", "ir_version"),
    [(TensorProto.FLOAT8E4M3FN, 9), (TensorProto.INT4, 10), (25, 13), (27, 14)],  # 25: UINT2, 27: FLOAT6E2M3
)
def test_a_newer_data_type_needs_the_ir_version_that_added_it(data_type: int, ir_version: int) -> None:
    model = with_initializer_type(dense_model(17), data_type)
    need = required_ir_version(model)
    assert need.ir_version == ir_version
    assert "'extra'" in need.why and TensorProto.DataType.Name(data_type) in need.why


def test_a_cast_to_a_newer_type_counts_and_an_unknown_type_is_never_safe() -> None:
    model = dense_model(21)  # opset 21 needs IR 10
    model.graph.node.append(helper.make_node("Cast", ["probabilities"], ["narrow"], to=25))  # UINT2: IR 13
    need = required_ir_version(model)
    assert need.ir_version == 13 and "to=UINT2" in need.why
    unknown = with_initializer_type(dense_model(17), 99)
    assert required_ir_version(unknown).ir_version == UNKNOWN_IR
