"""Models for the quantization tests: small classifiers, built with ``onnx.helper``, that
INT8 gets wrong on purpose, the trained digits classifier, and the zoo's ResNet-style CNN
and BERT-style encoder at sizes a test can afford (seeded random weights)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelfleet.zoo import build_digits, write_random_resnet, write_random_transformer
from modelfleet.zoo.digits import DigitsModel
from modelfleet.zoo.resnet import ResNetConfig
from modelfleet.zoo.transformer import TransformerConfig

#: Two stages of one basic block each, at 3x32x32 and 10 classes (about 10k parameters).
SMALL_CNN = ResNetConfig(
    in_channels=3, image_size=32, classes=10, stem_channels=8, stem_kernel=3, stem_stride=1, stem_pool=False,
    widths=(8, 16), blocks=(1, 1),
)  # fmt: skip
#: One encoder layer of width 32 over a 100-token vocabulary, 4 classes.
SMALL_BERT = TransformerConfig(vocab=100, max_positions=128, hidden=32, heads=2, layers=1, ffn=128, classes=4)


def save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def fragile(tmp_path: Path, samples: int = 100) -> tuple[Path, Path]:
    """A classifier INT8 cannot reproduce (class 9's logit spans -1600, so the INT8
    step of the output swamps classes 0-8), and a calibration file for it."""
    w = (np.random.default_rng(0).standard_normal((16, 10)) * 0.01).astype(np.float32)
    w[:, 9] = -100.0
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["logits"])],
        "fragile",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    np.savez(tmp_path / "fragile.npz", input=np.random.default_rng(1).random((samples, 16), dtype=np.float32))
    return save(graph, tmp_path / "fragile.onnx"), tmp_path / "fragile.npz"


def fragile_head(tmp_path: Path) -> tuple[Path, Path]:
    """Two hidden layers, then the fragile head: fails with every layer in INT8, passes
    once the first and last layers (the sensitive ones) stay in FP32."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((2, 16, 16)) * 0.25).astype(np.float32)
    w3 = (rng.standard_normal((16, 10)) * 0.01).astype(np.float32)
    w3[:, 9] = -100.0
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "w1"], ["h1"], name="first"),
            helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
            helper.make_node("MatMul", ["r1", "w2"], ["h2"], name="hidden"),
            helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
            helper.make_node("MatMul", ["r2", "w3"], ["logits"], name="head"),
        ],
        "fragile_head",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(w, n) for n, w in (("w1", w1), ("w2", w2), ("w3", w3))],
    )
    np.savez(tmp_path / "head.npz", input=rng.random((1000, 16), dtype=np.float32))
    return save(graph, tmp_path / "head.onnx"), tmp_path / "head.npz"


def digits_model(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    """The zoo's digits classifier; same cache path as the zoo tests, so it is trained once per session."""
    return build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")


def cnn(path: Path, **changes: object) -> Path:
    """``SMALL_CNN`` with ``changes`` (``image_size``, ``widths``, ``normalize``...) written to ``path``."""
    return write_random_resnet(path, replace(SMALL_CNN, **changes))


def bert(path: Path, **changes: object) -> Path:
    """``SMALL_BERT`` with ``changes`` (``vocab``, ``layers``...) written to ``path``."""
    return write_random_transformer(path, replace(SMALL_BERT, **changes))
