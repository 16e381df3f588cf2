"""Train the zoo's small models with torch and commit their weights (``make zoo-train``).

Optional and seeded. It needs torch, which the project itself never installs (its wheel
is gigabytes): run it from a separate virtual environment with torch, numpy,
scikit-learn, onnx and onnxruntime, with ``PYTHONPATH`` at the checkout so that the
project's own graph builders and data splits are used::

    PYTHONPATH=$PWD /path/to/torchvenv/bin/python scripts/train_zoo.py

For each model it mirrors the architecture in torch, trains it on the training split of
scikit-learn's digits, converts the weights into the builders' layout, builds the ONNX
graph from them with the same numpy builder the project uses at run time, checks that
ONNX Runtime's logits match torch's and measures test accuracy with ONNX Runtime, then
writes ``modelfleet/zoo/weights/<name>.npz``. A model below its accuracy floor, or whose
ONNX graph disagrees with torch, is not written."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn

from modelfleet.zoo import digits_data
from modelfleet.zoo.digits_data import DigitsSplit
from modelfleet.zoo.resnet import DIGITS_RESNET, ResNetConfig, resnet_blocks, resnet_graph
from modelfleet.zoo.trained import RESNET_MIN_ACCURACY, TRANSFORMER_MIN_ACCURACY
from modelfleet.zoo.transformer import DIGITS_TRANSFORMER, MASK_BIAS, MIN_COUNT, TransformerConfig, transformer_graph
from modelfleet.zoo.weights import save_weights, weights_path

SEED = 0
#: ONNX Runtime's logits against torch's, on the whole test split.
MAX_ABS_DIFF = 1e-3


def shifted(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each 8x8 image moved by up to one pixel in each direction (training augmentation)."""
    images = pixels.reshape(-1, 8, 8)
    out = np.zeros_like(images)
    for i, (dy, dx) in enumerate(rng.integers(-1, 2, size=(len(images), 2))):
        src = images[i, max(0, -dy) : 8 - max(0, dy), max(0, -dx) : 8 - max(0, dx)]
        out[i, max(0, dy) : max(0, dy) + src.shape[0], max(0, dx) : max(0, dx) + src.shape[1]] = src
    return out.reshape(-1, 64)


# ---------------------------------------------------------------- ResNet


class TorchBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int, projects: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.down = (
            nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch)) if projects else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (self.down(x) if self.down is not None else x))


class TorchResNet(nn.Module):
    def __init__(self, c: ResNetConfig) -> None:
        super().__init__()
        self.config = c
        self.stem_conv = nn.Conv2d(
            c.in_channels, c.stem_channels, c.stem_kernel, c.stem_stride, c.stem_kernel // 2, bias=False
        )
        self.stem_bn = nn.BatchNorm2d(c.stem_channels)
        self.specs = list(resnet_blocks(c))
        self.blocks = nn.ModuleList(TorchBlock(b.in_ch, b.out_ch, b.stride, b.projects) for b in self.specs)
        self.fc = nn.Linear(c.widths[-1], c.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem_bn(self.stem_conv(x)))
        if self.config.stem_pool:
            x = F.max_pool2d(x, 3, 2, 1)
        for block in self.blocks:
            x = block(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """The weights in ``resnet_shapes``' names and layout."""

        def bn(prefix: str, m: nn.BatchNorm2d) -> dict[str, np.ndarray]:
            assert m.running_mean is not None and m.running_var is not None
            values = {"scale": m.weight, "bias": m.bias, "mean": m.running_mean, "var": m.running_var}
            return {f"{prefix}.{k}": v.detach().numpy().copy() for k, v in values.items()}

        out = {"stem.conv.weight": self.stem_conv.weight.detach().numpy().copy(), **bn("stem.bn", self.stem_bn)}
        for spec, block in zip(self.specs, self.blocks, strict=True):
            p = spec.prefix
            out[f"{p}.conv1.weight"] = block.conv1.weight.detach().numpy().copy()
            out |= bn(f"{p}.bn1", block.bn1)
            out[f"{p}.conv2.weight"] = block.conv2.weight.detach().numpy().copy()
            out |= bn(f"{p}.bn2", block.bn2)
            if block.down is not None:
                out[f"{p}.down.conv.weight"] = block.down[0].weight.detach().numpy().copy()
                out |= bn(f"{p}.down.bn", block.down[1])
        out["fc.weight"] = self.fc.weight.detach().numpy().copy()
        out["fc.bias"] = self.fc.bias.detach().numpy().copy()
        return out


# ---------------------------------------------------------------- transformer


class TorchLayer(nn.Module):
    def __init__(self, c: TransformerConfig, dropout: float) -> None:
        super().__init__()
        d = c.hidden
        self.heads = c.heads
        self.query, self.key, self.value, self.output = (nn.Linear(d, d) for _ in range(4))
        self.attention_ln = nn.LayerNorm(d, eps=c.layer_norm_eps)
        self.ffn_in, self.ffn_out = nn.Linear(d, c.ffn), nn.Linear(c.ffn, d)
        self.ffn_ln = nn.LayerNorm(d, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
        context = (self.dropout(scores.softmax(-1)) @ v).transpose(1, 2).reshape(x.shape)
        x = self.attention_ln(self.dropout(self.output(context)) + x)
        return self.ffn_ln(self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))) + x)


class TorchEncoder(nn.Module):
    def __init__(self, c: TransformerConfig, dropout: float = 0.1) -> None:
        super().__init__()
        self.word = nn.Embedding(c.vocab, c.hidden)
        self.position = nn.Embedding(c.max_positions, c.hidden)
        self.embeddings_ln = nn.LayerNorm(c.hidden, eps=c.layer_norm_eps)
        self.layers = nn.ModuleList(TorchLayer(c, dropout) for _ in range(c.layers))
        self.pooler = nn.Linear(c.hidden, c.hidden)
        self.classifier = nn.Linear(c.hidden, c.classes)
        self.dropout = nn.Dropout(dropout)
        self.pooling = c.pooling
        for module in self.modules():  # BERT's initialisation
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.embeddings_ln(self.word(ids) + self.position.weight[: ids.shape[1]])
        x = self.dropout(x)
        bias = (1.0 - mask[:, None, None, :].float()) * MASK_BIAS
        for layer in self.layers:
            x = layer(x, bias)
        if self.pooling == "mean":
            weights = mask[:, :, None].float()
            pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=MIN_COUNT)
        else:
            pooled = x[:, 0]
        return self.classifier(self.dropout(torch.tanh(self.pooler(pooled))))

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """The weights in ``transformer_shapes``' names; matrices transposed to ``[in, out]``."""

        def t(x: torch.Tensor) -> np.ndarray:
            return x.detach().numpy().copy()

        def linear(prefix: str, m: nn.Linear) -> dict[str, np.ndarray]:
            return {f"{prefix}.weight": t(m.weight).T.copy(), f"{prefix}.bias": t(m.bias)}

        def ln(prefix: str, m: nn.LayerNorm) -> dict[str, np.ndarray]:
            return {f"{prefix}.scale": t(m.weight), f"{prefix}.bias": t(m.bias)}

        out = {"embeddings.word": t(self.word.weight), "embeddings.position": t(self.position.weight)}
        out |= ln("embeddings.ln", self.embeddings_ln)
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, TorchLayer)
            p = f"layer{i}"
            for name in ("query", "key", "value", "output"):
                out |= linear(f"{p}.attention.{name}", getattr(layer, name))
            out |= ln(f"{p}.attention.ln", layer.attention_ln)
            out |= linear(f"{p}.ffn.in", layer.ffn_in) | linear(f"{p}.ffn.out", layer.ffn_out)
            out |= ln(f"{p}.ffn.ln", layer.ffn_ln)
        return out | linear("pooler", self.pooler) | linear("classifier", self.classifier)


# ---------------------------------------------------------------- training

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]
Epoch = Callable[[np.random.Generator], list[Batch]]


def fit(model: nn.Module, batches: Epoch, *, epochs: int, lr: float, weight_decay: float) -> None:
    """AdamW with a one-cycle schedule; ``batches(rng)`` makes one epoch's (augmented) batches."""
    rng = np.random.default_rng(SEED)
    steps = len(batches(np.random.default_rng(0)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * steps)
    for epoch in range(epochs):
        model.train()
        total = 0.0
        for inputs, labels in batches(rng):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(*inputs), labels, label_smoothing=0.05)
            loss.backward()
            optimizer.step()
            schedule.step()
            total += float(loss.detach())
        if epoch % 10 == 9 or epoch == epochs - 1:
            print(f"  epoch {epoch + 1}/{epochs}: loss {total / steps:.4f}", flush=True)


def _order(n: int, rng: np.random.Generator, batch: int) -> list[np.ndarray]:
    return np.array_split(rng.permutation(n), math.ceil(n / batch))


def resnet_batches(split: DigitsSplit, batch: int = 64) -> Epoch:
    """Every training image shifted by up to a pixel: the CNN learns to ignore where the digit sits."""

    def make(rng: np.random.Generator) -> list[Batch]:
        images = torch.from_numpy(digits_data.digit_images(shifted(split.train_x, rng)))
        labels = torch.from_numpy(split.train_y)
        return [((images[i],), labels[i]) for i in map(torch.from_numpy, _order(len(labels), rng, batch))]

    return make


def token_augmented(pixels: np.ndarray, rng: np.random.Generator, shift: float = 0.3, drop: float = 0.1) -> np.ndarray:
    """A share of the images shifted, then some lit pixels dropped (tokens removed).

    Lighter than the CNN's: a token names its pixel's position, so a shifted image is a
    different set of tokens altogether, and shifting every image made the encoder learn
    each digit nine times over (82 % after 60 epochs instead of 96 %)."""
    moved = shifted(pixels, rng)
    pick = rng.random(len(pixels)) < shift
    out = np.where(pick[:, None], moved, pixels)
    return np.where(rng.random(out.shape) < drop, 0, out).astype(pixels.dtype)


def transformer_batches(split: DigitsSplit, batch: int = 32) -> Epoch:
    def make(rng: np.random.Generator) -> list[Batch]:
        pixels = token_augmented(split.train_x, rng)
        out = []
        for rows in _order(len(pixels), rng, batch):
            ids, mask = digits_data.digit_tokens(pixels[rows])
            out.append(((torch.from_numpy(ids), torch.from_numpy(mask)), torch.from_numpy(split.train_y[rows])))
        return out

    return make


def check_and_save(
    name: str,
    model: TorchResNet | TorchEncoder,
    config_json: str,
    graph: bytes,
    inputs: dict[str, np.ndarray],
    labels: np.ndarray,
    min_accuracy: float,
    epochs: int,
) -> float:
    """Compare ONNX Runtime with torch on the test split; write the weights if both hold."""
    model.eval()
    with torch.no_grad():
        expected = model(*(torch.from_numpy(v) for v in inputs.values())).numpy()
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], inputs)
    diff = float(np.abs(logits - expected).max())
    accuracy = float(np.mean(logits.argmax(1) == labels))
    torch_accuracy = float(np.mean(expected.argmax(1) == labels))
    print(f"{name}: ONNX Runtime test accuracy {accuracy:.4f} (torch {torch_accuracy:.4f}), max |diff| {diff:.2e}")
    if diff > MAX_ABS_DIFF:
        raise SystemExit(f"{name}: ONNX graph and torch disagree by {diff:.2e} > {MAX_ABS_DIFF}")
    if accuracy < min_accuracy:
        raise SystemExit(f"{name}: test accuracy {accuracy:.4f} below {min_accuracy}")
    meta = {
        "test_accuracy": accuracy,
        "max_abs_diff_vs_torch": diff,
        "torch": torch.__version__,
        "seed": SEED,
        "epochs": epochs,
    }
    save_weights(weights_path(name), model.numpy_weights(), config_json, meta)
    print(f"  wrote {weights_path(name)} ({weights_path(name).stat().st_size:,} bytes)")
    return accuracy


def train_resnet(split: DigitsSplit, epochs: int) -> float:
    torch.manual_seed(SEED)
    model = TorchResNet(DIGITS_RESNET)
    start = time.monotonic()
    fit(model, resnet_batches(split), epochs=epochs, lr=3e-3, weight_decay=5e-4)
    print(f"  trained in {time.monotonic() - start:.0f} s")
    model.eval()
    graph = resnet_graph(DIGITS_RESNET, model.numpy_weights(), name="resnet_digits").SerializeToString()
    inputs = {"input": digits_data.digit_images(split.test_x)}
    return check_and_save(
        "resnet_digits", model, DIGITS_RESNET.to_json(), graph, inputs, split.test_y, RESNET_MIN_ACCURACY, epochs
    )


def train_transformer(split: DigitsSplit, epochs: int) -> float:
    torch.manual_seed(SEED)
    model = TorchEncoder(DIGITS_TRANSFORMER)
    start = time.monotonic()
    fit(model, transformer_batches(split), epochs=epochs, lr=3e-3, weight_decay=1e-2)
    print(f"  trained in {time.monotonic() - start:.0f} s")
    model.eval()
    graph = transformer_graph(DIGITS_TRANSFORMER, model.numpy_weights(), name="transformer_digits")
    ids, mask = digits_data.digit_tokens(split.test_x)
    inputs = {"input_ids": ids, "attention_mask": mask}
    return check_and_save(
        "transformer_digits",
        model,
        DIGITS_TRANSFORMER.to_json(),
        graph.SerializeToString(),
        inputs,
        split.test_y,
        TRANSFORMER_MIN_ACCURACY,
        epochs,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["resnet", "transformer"], help="Train one model only.")
    parser.add_argument("--resnet-epochs", type=int, default=30)
    parser.add_argument("--transformer-epochs", type=int, default=80)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    split = digits_data.digits_split()
    if args.only in (None, "resnet"):
        train_resnet(split, args.resnet_epochs)
    if args.only in (None, "transformer"):
        train_transformer(split, args.transformer_epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
