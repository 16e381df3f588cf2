"""Generated inputs respect the model: ids in the vocabulary, 0/1 masks with a prefix of
ones, realistic dynamic sizes (and the operator's), image-like pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from quant_models import bert, cnn

from central.errors import BadRequest
from central.quantize.synthetic import DEFAULT_SEQUENCE, Sizes, check_dims, generated_samples, input_hints
from central.registry.validate import signature


def _generated(path: Path, n: int, sizes: Sizes | None = None) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    inputs, _ = signature(model)
    return generated_samples(inputs, n, 0, hints=input_hints(model), sizes=sizes)


def test_transformer_inputs_respect_vocab_mask_and_sequence(tmp_path: Path) -> None:
    path = bert(tmp_path / "bert.onnx", vocab=50)
    samples = _generated(path, 64)
    ids, mask = samples["input_ids"], samples["attention_mask"]
    assert ids.shape == mask.shape == (64, DEFAULT_SEQUENCE) and ids.dtype == mask.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 50 and len(np.unique(ids)) > 40
    assert set(np.unique(mask)) == {0, 1} and mask[:, 0].all()
    lengths = mask.sum(axis=1)
    assert (np.diff(mask, axis=1) <= 0).all()  # ones, then zeros: a prefix
    assert len(np.unique(lengths)) > 5 and lengths.max() == DEFAULT_SEQUENCE
    assert (ids[mask == 0] == 0).all()  # padding ids, as a tokenizer writes them
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert np.isfinite(session.run(None, samples)[0]).all()  # every id is a valid row


def test_operator_dims_override_defaults_and_unknown_names_are_refused(tmp_path: Path) -> None:
    path = bert(tmp_path / "bert.onnx")
    assert _generated(path, 4, Sizes({"sequence": 128}))["input_ids"].shape == (4, 128)
    hints = input_hints(onnx.load(str(path)))
    assert hints.dynamic_names == {"sequence"}
    check_dims({"sequence": 128}, hints)
    with pytest.raises(
        BadRequest, match=r"--dim seq=64: the model has no dynamic dimension 'seq' \(it has: sequence\)"
    ):
        check_dims({"seq": 64}, hints)


def test_images_are_smooth_and_in_a_pixel_range(tmp_path: Path) -> None:
    plain = _generated(cnn(tmp_path / "cnn.onnx", image_size=32), 16)["input"]
    assert plain.shape == (16, 3, 32, 32) and plain.dtype == np.float32
    # No normalisation in the graph: the images come ImageNet-normalised, about -2..2.5.
    assert -2.1 < plain.min() < 0 < plain.max() < 2.5
    normalizing = _generated(cnn(tmp_path / "norm.onnx", image_size=32, normalize=True), 16)["input"]
    assert normalizing.min() >= 0.0 and normalizing.max() <= 1.0 and normalizing.std() > 0.1  # raw pixels 0..1
    # Smooth: neighbouring pixels differ far less than the pixels spread (in noise, ~1.1x as much).
    steps = np.abs(np.diff(normalizing, axis=3)).mean()
    assert steps < 0.4 * normalizing.std()


def test_dynamic_image_size_defaults_and_can_be_set(tmp_path: Path) -> None:
    path = cnn(tmp_path / "cnn.onnx", image_size=32)
    model = onnx.load(str(path))
    for i, dim in enumerate(model.graph.input[0].type.tensor_type.shape.dim[2:]):
        dim.ClearField("dim_value")
        dim.dim_param = ("height", "width")[i]
    onnx.save(model, str(path))
    assert _generated(path, 2)["input"].shape == (2, 3, 224, 224)
    assert _generated(path, 2, Sizes({"height": 48, "width": 64}))["input"].shape == (2, 3, 48, 64)


def test_seeded_and_other_inputs_stay_normal(tmp_path: Path) -> None:
    from modelfleet.zoo import build_mlp

    path = build_mlp(tmp_path / "mlp.onnx", width=16, hidden_layers=1)
    a, b = _generated(path, 500), _generated(path, 500)
    assert np.array_equal(a["input"], b["input"])
    assert abs(float(a["input"].mean())) < 0.05 and 0.9 < float(a["input"].std()) < 1.1
