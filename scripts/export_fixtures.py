"""Export the test fixtures of what torch writes (``make fixtures-export``).

Two small models, exported exactly as a new user would: torch's default exporter
(``torch.onnx.export(..., dynamic_shapes=...)``, the dynamo-based one since torch 2.9),
which writes ``model.onnx`` plus ``model.onnx.data``. The tests that quantize them run
without torch; this script needs it, so run it from a separate virtual environment with
torch, transformers, onnx, onnxscript and onnxruntime::

    /path/to/torchvenv/bin/python scripts/export_fixtures.py

* ``bert/``: transformers' ``BertForSequenceClassification`` (random init, seeded),
  2 layers, hidden 128, 2 labels. Its classifier is a ``Gemm`` with ``transB=1`` and a
  non-square weight, and the exporter records ``value_info`` for every initializer: the
  two together are what broke ORT's dynamic quantizer (issue 25).
* ``bert-opset23/``: a smaller one (1 layer, hidden 64) at ``opset_version=23``, where the
  exporter writes attention as the standard ``Attention`` operator, which ORT's
  quantizer mistakes for its own ``com.microsoft`` one.
* ``cnn/``: a ResNet-style CNN (Conv, BatchNorm, ReLU, residual Add, global average
  pool, Linear) on 3x32x32 images, random init, seeded.

Each model is checked against torch with ONNX Runtime before it is kept, and
``--out DIR --bert-layers 6 --bert-hidden 384`` exports the issue's full-size BERT
(about 90 MB, not for committing) for ``python -m bench.exported --model DIR/bert``."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

SEED = 0
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "exported"
MAX_ABS_DIFF = 1e-3
SEQUENCE = 16
IMAGE = 32


class Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with BatchNorm, a projection when the shape changes."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.project = (
            nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))
            if stride != 1 or in_ch != out_ch
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.project(x))


class SmallResNet(nn.Module):
    """Stem, three stages of basic blocks, global average pool, a linear head."""

    def __init__(self, widths: tuple[int, ...] = (16, 32, 64), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        blocks, channels = [], widths[0]
        for i, width in enumerate(widths):
            blocks += [Block(channels, width, 1 if i == 0 else 2), Block(width, width, 1)]
            channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


class ResNet18(nn.Module):
    """ResNet-18's architecture (torchvision's, written out: its PyPI wheel does not load beside
    torch 2.13 here): a 7x7 stride-2 stem and max-pool, four stages of two basic blocks."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, channels = [], 64
        for i, width in enumerate((64, 128, 256, 512)):
            blocks += [Block(channels, width, 1 if i == 0 else 2), Block(width, width, 1)]
            channels = width
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def _randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Running statistics and affine parameters away from the identity, as trained ones are."""
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            module.running_var.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
            module.weight.data.copy_(torch.rand(n, generator=generator) * 0.5 + 0.75)
            module.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)


def _export(
    model: nn.Module, args: tuple[torch.Tensor, ...], names: list[str], dims: tuple, out: Path, opset: int | None = None
) -> Path:
    """``torch.onnx.export`` with its defaults (dynamo, external data); the graph's path."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    path = out / "model.onnx"
    options = {} if opset is None else {"opset_version": opset}
    torch.onnx.export(
        model, args, str(path), input_names=names, output_names=["logits"], dynamic_shapes=dims, **options
    )
    return path


def _check(path: Path, model: nn.Module, feeds: dict[str, np.ndarray]) -> float:
    """Largest absolute difference between ONNX Runtime's logits and torch's."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["logits"], feeds)
    with torch.no_grad():
        expected = model(*(torch.from_numpy(v) for v in feeds.values()))
    expected = expected.logits if hasattr(expected, "logits") else expected
    return float(np.max(np.abs(got - expected.numpy())))


def export_bert(out: Path, layers: int, hidden: int, vocab: int, opset: int | None = None) -> tuple[Path, float]:
    """A random BertForSequenceClassification with dynamic batch and sequence."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(2, hidden // 32),
        intermediate_size=4 * hidden, max_position_embeddings=512, num_labels=2,
    )  # fmt: skip
    model = BertForSequenceClassification(config).eval()
    ids = torch.randint(0, vocab, (2, SEQUENCE), generator=torch.Generator().manual_seed(SEED))
    mask = torch.ones_like(ids)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    dims = ({0: batch, 1: seq}, {0: batch, 1: seq})
    path = _export(model, (ids, mask), ["input_ids", "attention_mask"], dims, out, opset)
    rng = np.random.default_rng(SEED)
    feeds = {
        "input_ids": rng.integers(0, vocab, (3, 24)).astype(np.int64),
        "attention_mask": np.ones((3, 24), np.int64),
    }
    feeds["attention_mask"][1, 20:] = 0
    return path, _check(path, model, feeds)


def export_cnn(out: Path, full: bool = False) -> tuple[Path, float]:
    """The seeded SmallResNet (``full``: ResNet-18 at 224) with a dynamic batch."""
    torch.manual_seed(SEED)
    model = ResNet18() if full else SmallResNet()
    image = 224 if full else IMAGE
    _randomize_batchnorm(model, torch.Generator().manual_seed(SEED))
    model.eval()
    x = torch.randn(2, 3, image, image, generator=torch.Generator().manual_seed(SEED))
    path = _export(model, (x,), ["image"], ({0: torch.export.Dim("batch")},), out)
    feeds = {"image": np.random.default_rng(SEED).standard_normal((3, 3, image, image)).astype(np.float32)}
    return path, _check(path, model, feeds)


def main(argv: list[str] | None = None) -> int:
    """Export both fixtures (or the BERT alone at another size), check them, print what was written."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=OUT, help="where bert/ and cnn/ go")
    p.add_argument("--bert-layers", type=int, default=2)
    p.add_argument("--bert-hidden", type=int, default=128)
    p.add_argument("--bert-vocab", type=int, default=2048)
    p.add_argument("--bert-only", action="store_true", help="export the BERT alone (larger sizes, for benchmarks)")
    p.add_argument("--resnet18", action="store_true", help="with --bert-only: also ResNet-18 at 224 (benchmarks)")
    args = p.parse_args(argv)
    exported = {"bert": export_bert(args.out / "bert", args.bert_layers, args.bert_hidden, args.bert_vocab)}
    if args.resnet18:
        exported["resnet18"] = export_cnn(args.out / "resnet18", full=True)
    if not args.bert_only:
        exported["bert-opset23"] = export_bert(args.out / "bert-opset23", 1, 64, 512, opset=23)
        exported["cnn"] = export_cnn(args.out / "cnn")
    failed = False
    for name, (path, diff) in exported.items():
        files = {f.name: f.stat().st_size for f in sorted(path.parent.iterdir())}
        print(f"{name}: {json.dumps(files)} max |ort - torch| {diff:.2e}")
        if diff > MAX_ABS_DIFF:
            print(f"{name}: ONNX Runtime disagrees with torch ({diff:.2e} > {MAX_ABS_DIFF})", file=sys.stderr)
            shutil.rmtree(path.parent)
            failed = True
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
