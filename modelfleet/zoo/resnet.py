"""ResNet-style CNNs as ONNX graphs built from numpy weights.

The layout follows torchvision's ResNet with basic blocks, the CNN most people push:
a stem convolution, stages of two-convolution residual blocks (a 1x1 projection where
the shape changes), global average pooling and a Gemm head. BatchNormalization stays a
node of its own, as exporters in training-aware mode write it, so the quantizer's
pre-processing and ONNX Runtime's optimizer do the folding they do on real exports.

One function gives the weights' names and shapes (``resnet_shapes``); a trained model
brings its weights in that layout (``scripts/train_zoo.py``), a benchmark model gets
seeded random ones (``random_resnet_weights``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from modelfleet.zoo.graph import FLOAT, GraphBuilder

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
BN_EPSILON = 1e-5
#: ImageNet's per-channel mean and standard deviation (RGB), as torchvision's transforms use them.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ResNetConfig:
    """The shape of one ResNet: channels, stem, and (width, blocks) per stage."""

    in_channels: int
    image_size: int
    classes: int
    stem_channels: int
    stem_kernel: int
    stem_stride: int
    #: A 3x3 stride-2 max pool after the stem, as in ResNet-18 at 224x224.
    stem_pool: bool
    widths: tuple[int, ...]
    blocks: tuple[int, ...]
    #: ImageNet's ``(x - mean) / std`` in front of the stem, as many exported vision models
    #: have: the model then takes raw RGB pixels in 0..1 (3 channels only).
    normalize: bool = False

    def __post_init__(self) -> None:
        if len(self.widths) != len(self.blocks):
            raise ValueError(f"{len(self.widths)} stage widths but {len(self.blocks)} block counts")
        if self.normalize and self.in_channels != len(IMAGENET_MEAN):
            raise ValueError(f"normalize needs 3 (RGB) input channels, not {self.in_channels}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ResNetConfig:
        raw = json.loads(text)
        raw["widths"], raw["blocks"] = tuple(raw["widths"]), tuple(raw["blocks"])
        return cls(**raw)


#: Digits upscaled to 1x32x32: three stages, one block each, about 78k parameters.
DIGITS_RESNET = ResNetConfig(1, 32, 10, 16, 3, 1, False, (16, 32, 64), (1, 1, 1))
#: ResNet-18's depth and widths at 3x224x224 and 1000 classes: 11.7M parameters, 47 MB.
RESNET18 = ResNetConfig(3, 224, 1000, 64, 7, 2, True, (64, 128, 256, 512), (2, 2, 2, 2))


@dataclass(frozen=True)
class ResNetBlock:
    """One basic block: its weights' name prefix, channels and stride."""

    prefix: str
    in_ch: int
    out_ch: int
    stride: int

    @property
    def projects(self) -> bool:
        """Whether the shortcut needs a 1x1 projection (the shape changes)."""
        return self.stride != 1 or self.in_ch != self.out_ch


def resnet_blocks(config: ResNetConfig) -> Iterator[ResNetBlock]:
    """The blocks in order: the first of each later stage halves the size."""
    in_ch = config.stem_channels
    for s, (width, count) in enumerate(zip(config.widths, config.blocks, strict=True)):
        for b in range(count):
            stride = 2 if s > 0 and b == 0 else 1
            yield ResNetBlock(f"stage{s}.block{b}", in_ch, width, stride)
            in_ch = width


def _bn_shapes(prefix: str, channels: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.{p}": (channels,) for p in ("scale", "bias", "mean", "var")}


def resnet_shapes(config: ResNetConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape, in graph order (convolutions are OIHW, the head ``[classes, features]``)."""
    k = config.stem_kernel
    shapes: dict[str, tuple[int, ...]] = {"stem.conv.weight": (config.stem_channels, config.in_channels, k, k)}
    shapes |= _bn_shapes("stem.bn", config.stem_channels)
    for blk in resnet_blocks(config):
        shapes[f"{blk.prefix}.conv1.weight"] = (blk.out_ch, blk.in_ch, 3, 3)
        shapes |= _bn_shapes(f"{blk.prefix}.bn1", blk.out_ch)
        shapes[f"{blk.prefix}.conv2.weight"] = (blk.out_ch, blk.out_ch, 3, 3)
        shapes |= _bn_shapes(f"{blk.prefix}.bn2", blk.out_ch)
        if blk.projects:
            shapes[f"{blk.prefix}.down.conv.weight"] = (blk.out_ch, blk.in_ch, 1, 1)
            shapes |= _bn_shapes(f"{blk.prefix}.down.bn", blk.out_ch)
    shapes["fc.weight"] = (config.classes, config.widths[-1])
    shapes["fc.bias"] = (config.classes,)
    return shapes


def random_resnet_weights(config: ResNetConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded He-initialised weights with plausible BatchNorm statistics.

    The second BatchNorm of each block scales by 0.5 so that the residual sums stay in
    a range like a trained network's instead of doubling their variance per block."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in resnet_shapes(config).items():
        if name.endswith("conv.weight") or name.endswith(("conv1.weight", "conv2.weight")):
            fan_in = int(np.prod(shape[1:]))
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        elif name == "fc.weight":
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[1]))
        elif name.endswith(".scale"):
            w = np.full(shape, 0.5 if ".bn2." in name else 1.0, np.float32)
        elif name.endswith(".var"):
            w = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:  # BatchNorm bias and mean, the head's bias
            w = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)).astype(np.float32)
        weights[name] = w.astype(np.float32)
    return weights


def _conv_bn(g: GraphBuilder, x: str, w: dict[str, np.ndarray], prefix: str, bn: str, stride: int) -> str:
    weight = w[f"{prefix}.weight"]
    pad = weight.shape[-1] // 2
    conv = g.op(
        "Conv",
        [x, g.weight(f"{prefix}.weight", weight)],
        prefix,
        kernel_shape=list(weight.shape[-2:]),
        strides=[stride, stride],
        pads=[pad] * 4,
    )
    params = [g.weight(f"{bn}.{p}", w[f"{bn}.{p}"]) for p in ("scale", "bias", "mean", "var")]
    return g.op("BatchNormalization", [conv, *params], bn, epsilon=BN_EPSILON)


def _block(g: GraphBuilder, x: str, w: dict[str, np.ndarray], blk: ResNetBlock) -> str:
    p = blk.prefix
    y = g.op("Relu", [_conv_bn(g, x, w, f"{p}.conv1", f"{p}.bn1", blk.stride)], f"{p}.relu1")
    y = _conv_bn(g, y, w, f"{p}.conv2", f"{p}.bn2", 1)
    shortcut = _conv_bn(g, x, w, f"{p}.down.conv", f"{p}.down.bn", blk.stride) if blk.projects else x
    return g.op("Relu", [g.op("Add", [y, shortcut], f"{p}.add")], f"{p}.relu2")


def _normalize(g: GraphBuilder, x: str) -> str:
    """``(x - mean) / std`` per channel: a Sub and a Div on the input, as exporters write the transform."""
    mean = g.const("normalize.mean", np.reshape(IMAGENET_MEAN, (1, 3, 1, 1)), np.float32)
    std = g.const("normalize.std", np.reshape(IMAGENET_STD, (1, 3, 1, 1)), np.float32)
    return g.op("Div", [g.op("Sub", [x, mean], "normalize.sub"), std], "normalize.div")


def resnet_graph(config: ResNetConfig, weights: dict[str, np.ndarray], name: str = "resnet") -> onnx.ModelProto:
    """The ONNX model: ``input`` float32 ``[batch, C, H, W]`` → ``logits`` ``[batch, classes]``.

    Height and width are fixed (the head's size does not depend on them, but the models
    are trained and benchmarked at one size); the batch axis is dynamic."""
    expected = resnet_shapes(config)
    wrong = {k: v.shape for k, v in weights.items() if expected.get(k) != v.shape}
    missing = expected.keys() - weights.keys()
    if wrong or missing:
        raise ValueError(f"weights do not fit {config}: missing {sorted(missing)}, unexpected {wrong}")
    g = GraphBuilder(name)
    x = _normalize(g, INPUT_NAME) if config.normalize else INPUT_NAME
    x = g.op("Relu", [_conv_bn(g, x, weights, "stem.conv", "stem.bn", config.stem_stride)], "stem.relu")
    if config.stem_pool:
        x = g.op("MaxPool", [x], "stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for blk in resnet_blocks(config):
        x = _block(g, x, weights, blk)
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x], "pool")], "flatten", axis=1)
    fc = [g.weight("fc.weight", weights["fc.weight"]), g.weight("fc.bias", weights["fc.bias"])]
    logits = g.op("Gemm", [pooled, *fc], "fc", transB=1)
    size = config.image_size
    return g.model(
        [(INPUT_NAME, FLOAT, ["batch", config.in_channels, size, size])],
        [(OUTPUT_NAME, FLOAT, ["batch", config.classes])],
        rename={logits: OUTPUT_NAME},
    )


def parameter_count(config: ResNetConfig) -> int:
    """Learned parameters (BatchNorm running statistics excluded), as torchvision counts them."""
    return sum(int(np.prod(s)) for n, s in resnet_shapes(config).items() if not n.endswith((".mean", ".var")))
