"""Models shipped as ONNX external data: the trained one, and the streamed builder of huge ones."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from modelfleet.zoo import ZooModel, build_huge_mlp, build_transformer_digits_external, eval_accuracy
from modelfleet.zoo.external import ALIGNMENT, DATA_FILE, external_data_files, huge_mlp_bytes, huge_mlp_layer


@pytest.fixture(scope="module")
def external(zoo_cache: Path) -> ZooModel:
    return build_transformer_digits_external(zoo_cache)


def test_the_weights_live_in_the_data_file(external: ZooModel, transformer_digits: ZooModel) -> None:
    assert external.files == (external.onnx_path, external.onnx_path.parent / DATA_FILE)
    assert external_data_files(external.onnx_path) == [DATA_FILE]
    graph_bytes, data_bytes = (p.stat().st_size for p in external.files)
    assert data_bytes > 10 * graph_bytes
    assert transformer_digits.size_bytes * 0.9 < external.size_bytes < transformer_digits.size_bytes * 1.2


def test_it_loads_with_its_data_next_to_it_and_keeps_its_accuracy(
    external: ZooModel, transformer_digits: ZooModel, tmp_path: Path
) -> None:
    for path in external.files:  # moved together, anywhere: the reference is relative
        shutil.copyfile(path, tmp_path / path.name)
    moved = replace(external, onnx_path=tmp_path / "model.onnx", data_files=(tmp_path / DATA_FILE,))
    assert eval_accuracy(moved) == transformer_digits.fp32_accuracy == external.fp32_accuracy


def test_without_its_data_file_loading_fails_naming_the_file(external: ZooModel, tmp_path: Path) -> None:
    shutil.copyfile(external.onnx_path, tmp_path / "model.onnx")
    with pytest.raises(Exception, match=r"model\.onnx\.data"):
        ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])


def test_the_huge_builder_streams_exact_weights_at_a_tiny_width(zoo_cache: Path) -> None:
    model = build_huge_mlp(zoo_cache, width=48, layers=3, seed=5, name="mlp-huge-tiny")
    proto = onnx.load(str(model.onnx_path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    for tensor in proto.graph.initializer:
        offset = int(next(e.value for e in tensor.external_data if e.key == "offset"))
        assert offset % ALIGNMENT == 0
    loaded = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(model.onnx_path)).graph.initializer}
    # Streamed in slices of 7 rows or all at once: the same matrix.
    assert np.array_equal(loaded["w1"], np.concatenate(list(huge_mlp_layer(5, 1, 48, 48, 7))))
    x = np.random.default_rng(0).standard_normal((4, 48), dtype=np.float32)
    expected = x
    for i in range(4):
        expected = expected @ loaded[f"w{i}"] + loaded[f"b{i}"]
        expected = np.maximum(expected, 0) if i < 3 else expected
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input": x})
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


def test_the_default_huge_model_is_past_protobufs_two_gib() -> None:
    assert huge_mlp_bytes(8192, 9) > 2 * 1024**3  # the bench builds it; a test never does
