"""``central.quantize.normalize`` on small graphs built with ``onnx.helper``: each kind of
exporter leftover is cleaned, said in the changes, and the cleaned graph computes what
the pushed one did; a clean graph is handed back untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from central.quantize.normalize import normalize
from central.registry.validate import signature


def _model(
    path: Path, *, output_shape: list[int | str] | None = None, names: tuple[str, str] = ("mm", "relu"),
    weight_value_info: bool = False, weight_as_input: bool = False, width: int = 4,
) -> Path:  # fmt: skip
    """input [batch, 16] → MatMul(w [16, width]) → Relu → logits, with the leftovers asked for."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, width)).astype(np.float32), "w")
    w_info = helper.make_tensor_value_info("w", TensorProto.FLOAT, [16, width])
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "w"], ["hidden"], name=names[0]),
            helper.make_node("Relu", ["hidden"], ["logits"], name=names[1]),
        ],
        "g",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16]),
            *([w_info] if weight_as_input else []),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, output_shape or ["batch", width])],
        initializer=[weight],
        value_info=[w_info] if weight_value_info else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _run(path: Path) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["logits"], {"input": x})[0])


def test_a_clean_graph_is_handed_back_untouched(tmp_path: Path) -> None:
    model = _model(tmp_path / "clean.onnx")
    cleaned = normalize(model, tmp_path / "out" / "model.onnx")
    assert cleaned.path == model and cleaned.changes == [] and cleaned.shape_inference == "strict"
    assert not (tmp_path / "out").exists()


def test_value_info_is_dropped_and_the_report_counts_the_initializers(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", weight_value_info=True)
    cleaned = normalize(model, tmp_path / "out" / "model.onnx")
    assert cleaned.changes == [
        "dropped 1 value_info entries (1 of them initializers'): recorded shapes the quantizer's rewrites make stale"
    ]
    assert len(onnx.load(str(cleaned.path)).graph.value_info) == 0
    np.testing.assert_array_equal(_run(cleaned.path), _run(model))


def test_an_output_shape_that_contradicts_inference_is_relaxed_keeping_rank_and_type(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", output_shape=["batch", 3])
    cleaned = normalize(model, tmp_path / "out" / "model.onnx")
    assert cleaned.shape_inference == "relaxed"
    assert len(cleaned.changes) == 1 and cleaned.changes[0].startswith("relaxed the recorded shapes of outputs logits")
    (output,) = onnx.load(str(cleaned.path)).graph.output
    dims = output.type.tensor_type.shape.dim
    assert len(dims) == 2 and not any(d.HasField("dim_value") or d.HasField("dim_param") for d in dims)
    assert output.type.tensor_type.elem_type == TensorProto.FLOAT
    np.testing.assert_array_equal(_run(cleaned.path), _run(model))


def test_repeated_and_missing_node_names_become_unique(tmp_path: Path) -> None:
    for names in (("same", "same"), ("", "")):
        model = _model(tmp_path / f"m{names[0]}.onnx", names=names)
        cleaned = normalize(model, tmp_path / f"out{names[0]}" / "model.onnx")
        got = [n.name for n in onnx.load(str(cleaned.path)).graph.node]
        assert all(got) and len(set(got)) == 2
        assert "renamed 1 repeated" in cleaned.changes[0] if names[0] else "named 2 unnamed" in cleaned.changes[0]


def test_initializers_listed_as_inputs_leave_the_inputs_but_not_the_signature(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", weight_as_input=True)
    cleaned = normalize(model, tmp_path / "out" / "model.onnx")
    assert cleaned.changes == ["took 1 initializers out of the graph inputs (ONNX Runtime folds no overridable weight)"]
    assert [i.name for i in onnx.load(str(cleaned.path)).graph.input] == ["input"]
    assert signature(onnx.load(str(cleaned.path))) == signature(onnx.load(str(model)))


def test_a_large_model_is_written_with_its_weights_in_a_data_file(tmp_path: Path) -> None:
    model = _model(tmp_path / "m.onnx", weight_value_info=True, width=64)  # 4 KiB: above ONNX's inline limit
    cleaned = normalize(model, tmp_path / "out" / "model.onnx", external_data=True)
    graph = onnx.load(str(cleaned.path), load_external_data=False)
    assert {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"} == {
        "model.onnx.data"
    }
    np.testing.assert_array_equal(_run(cleaned.path), _run(model))
