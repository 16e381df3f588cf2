"""The ResNet-style CNNs: the one trained on digits, and the family at other sizes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from central.quantize.calibration import MIN_SAMPLES
from modelfleet.zoo import ZooModel, build_resnet_random, eval_accuracy, write_random_resnet
from modelfleet.zoo.resnet import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    RESNET18,
    ResNetConfig,
    parameter_count,
    random_resnet_weights,
    resnet_graph,
)

#: ResNet-18's family at a width and size a test can afford: 7x7 stride-2 stem, max pool, 4 stages of 2 blocks.
TINY_RESNET18 = ResNetConfig(3, 64, 20, 8, 7, 2, True, (8, 16, 24, 32), (2, 2, 2, 2))


def _session(model: ZooModel) -> ort.InferenceSession:
    return ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])


def test_trained_resnet_reaches_its_accuracy_on_the_held_out_split(resnet_digits: ZooModel) -> None:
    assert resnet_digits.family == "cnn" and resnet_digits.input_names == ("input",)
    assert resnet_digits.fp32_accuracy is not None and resnet_digits.fp32_accuracy >= 0.97
    assert eval_accuracy(resnet_digits) == resnet_digits.fp32_accuracy
    assert resnet_digits.eval_path is not None and resnet_digits.calibration_path is not None
    with np.load(resnet_digits.eval_path) as data:
        assert sorted(data.files) == ["input", "label"]
        assert data["input"].shape == (450, 1, 32, 32) and data["input"].dtype == np.float32
        assert data["label"].dtype == np.int64 and set(data["label"].tolist()) == set(range(10))
    with np.load(resnet_digits.calibration_path) as data:
        assert data.files == ["input"] and data["input"].shape == (256, 1, 32, 32)


def test_trained_resnet_is_conv_batchnorm_relu_residual_pool_gemm(resnet_digits: ZooModel) -> None:
    model = onnx.load(str(resnet_digits.onnx_path))
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "BatchNormalization", "Relu", "Add", "GlobalAveragePool", "Gemm"} <= ops
    assert [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", 1, 32, 32]


def test_batch_axis_is_dynamic(resnet_digits: ZooModel) -> None:
    session = _session(resnet_digits)
    assert resnet_digits.eval_path is not None
    with np.load(resnet_digits.eval_path) as data:
        images = data["input"][:8]
    (eight,) = session.run(None, {"input": images})
    (one,) = session.run(None, {"input": images[3:4]})
    assert eight.shape == (8, 10) and one.shape == (1, 10)
    np.testing.assert_allclose(one[0], eight[3], rtol=1e-4, atol=1e-5)


def test_resnet18_family_at_a_tiny_width_runs_any_batch(zoo_cache: Path) -> None:
    model = build_resnet_random(zoo_cache, config=TINY_RESNET18, name="resnet18-tiny")
    assert model.fp32_accuracy is None and model.eval_path is None and model.calibration_path is not None
    session = _session(model)
    with np.load(model.calibration_path) as data:
        images = data["input"]
    assert images.shape[1:] == (3, 64, 64) and len(images) >= MIN_SAMPLES  # enough for central to take it
    (logits,) = session.run(None, {"input": images[:8]})
    (single,) = session.run(None, {"input": images[:1]})
    assert logits.shape == (8, 20) and np.all(np.isfinite(logits))
    np.testing.assert_allclose(single[0], logits[0], rtol=1e-4, atol=1e-4)
    ops = [n.op_type for n in onnx.load(str(model.onnx_path)).graph.node]
    assert ops.count("MaxPool") == 1 and ops.count("Add") == 8  # one residual add per basic block


def test_the_224_model_has_resnet18s_parameter_count() -> None:
    # torchvision's resnet18 has 11,689,512 parameters; built by the bench, never here.
    assert parameter_count(RESNET18) == 11_689_512


def test_random_weights_are_seeded() -> None:
    a, b = random_resnet_weights(TINY_RESNET18, 1), random_resnet_weights(TINY_RESNET18, 1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["fc.weight"], random_resnet_weights(TINY_RESNET18, 2)["fc.weight"])


def test_weights_that_do_not_fit_the_config_are_refused() -> None:
    weights = random_resnet_weights(TINY_RESNET18)
    weights["fc.weight"] = weights["fc.weight"][:, :-1]
    del weights["stem.bn.var"]
    with pytest.raises(ValueError, match=r"missing \['stem.bn.var'\].*fc.weight"):
        resnet_graph(TINY_RESNET18, weights)


def test_normalize_puts_imagenets_transform_in_front_of_the_same_network(tmp_path: Path) -> None:
    plain = TINY_RESNET18
    normalizing = replace(plain, normalize=True)
    write_random_resnet(tmp_path / "plain.onnx", plain, seed=3)
    write_random_resnet(tmp_path / "norm.onnx", normalizing, seed=3)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "norm.onnx")).graph.node]
    assert ops[:3] == ["Sub", "Div", "Conv"]  # what exporters write, and what central's pixel detection reads
    pixels = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)
    mean, std = (np.reshape(v, (1, 3, 1, 1)).astype(np.float32) for v in (IMAGENET_MEAN, IMAGENET_STD))
    (raw,) = ort.InferenceSession(str(tmp_path / "norm.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input": pixels}
    )
    (normalized,) = ort.InferenceSession(str(tmp_path / "plain.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"input": (pixels - mean) / std}
    )
    np.testing.assert_allclose(raw, normalized, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="normalize needs 3 \\(RGB\\) input channels, not 1"):
        replace(normalizing, in_channels=1)
