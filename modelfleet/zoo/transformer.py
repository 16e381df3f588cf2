"""A BERT-style transformer encoder classifier as an ONNX graph built from numpy weights.

The graph is what exporters write for BERT and its small cousins, operator for operator:
word and position embeddings (sliced to the sequence length at run time), LayerNorm,
post-LN encoder layers whose attention is MatMul/Reshape/Transpose/Softmax with an
additive ``(1 - mask) * -10000`` bias, an exact (Erf) GELU feed-forward, then pooling
(the mean of the unmasked positions, or the first token), a tanh pooler and a linear
classifier. Keeping that shape matters: ONNX
Runtime's transformer optimizer recognises it and fuses attention, which is what
quantizing such a model should start from.

Inputs are INT64 ``input_ids`` and ``attention_mask`` ``[batch, sequence]``, both axes
dynamic; the output is ``logits`` ``[batch, classes]``."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from modelfleet.zoo import digits_data
from modelfleet.zoo.graph import FLOAT, INT64, GraphBuilder

INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "logits"
#: The additive attention bias of masked positions, as BERT's exports use it.
MASK_BIAS = -10000.0
POOLINGS = ("mean", "cls")
#: Mean pooling divides by at least this (an all-zero mask gives zeros, not NaN).
MIN_COUNT = 1e-9


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of one encoder classifier."""

    vocab: int
    max_positions: int
    hidden: int
    heads: int
    layers: int
    ffn: int
    classes: int
    layer_norm_eps: float = 1e-12
    #: What the classifier reads: ``"mean"`` of the unmasked positions, or the first (``"cls"``) token.
    pooling: str = "mean"

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ValueError(f"hidden size {self.hidden} is not a multiple of {self.heads} heads")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {POOLINGS}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        return cls(**json.loads(text))


#: The digits-as-tokens classifier (``digits_data``): 2 layers of width 64, about 88k parameters.
DIGITS_TRANSFORMER = TransformerConfig(
    vocab=digits_data.VOCAB,
    max_positions=digits_data.MAX_TOKENS,
    hidden=64,
    heads=4,
    layers=2,
    ffn=128,
    classes=10,
)
#: MiniLM-L6-H384's shape (BERT's 30522-token vocabulary, 6 layers of width 384): 22.7M
#: parameters, 91 MB, a transformer people really deploy on CPUs.
MINILM = TransformerConfig(vocab=30522, max_positions=512, hidden=384, heads=12, layers=6, ffn=1536, classes=2)


def transformer_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape; matrices are ``[in, out]`` (what MatMul takes)."""
    d, f = config.hidden, config.ffn
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word": (config.vocab, d),
        "embeddings.position": (config.max_positions, d),
        "embeddings.ln.scale": (d,),
        "embeddings.ln.bias": (d,),
    }
    for i in range(config.layers):
        p = f"layer{i}"
        for proj in ("query", "key", "value", "output"):
            shapes[f"{p}.attention.{proj}.weight"] = (d, d)
            shapes[f"{p}.attention.{proj}.bias"] = (d,)
        shapes |= {f"{p}.attention.ln.scale": (d,), f"{p}.attention.ln.bias": (d,)}
        shapes |= {f"{p}.ffn.in.weight": (d, f), f"{p}.ffn.in.bias": (f,)}
        shapes |= {f"{p}.ffn.out.weight": (f, d), f"{p}.ffn.out.bias": (d,)}
        shapes |= {f"{p}.ffn.ln.scale": (d,), f"{p}.ffn.ln.bias": (d,)}
    shapes |= {"pooler.weight": (d, d), "pooler.bias": (d,)}
    shapes |= {"classifier.weight": (d, config.classes), "classifier.bias": (config.classes,)}
    return shapes


def random_transformer_weights(config: TransformerConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded weights drawn as BERT initialises them: normal(0, 0.02), LayerNorm at identity."""
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in transformer_shapes(config).items():
        if name.endswith(".scale"):
            weights[name] = np.ones(shape, np.float32)
        elif name.endswith(".bias"):
            weights[name] = np.zeros(shape, np.float32)
        else:
            weights[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype(np.float32)
    return weights


class _Encoder:
    """Adds one classifier's nodes to a ``GraphBuilder``."""

    def __init__(self, g: GraphBuilder, config: TransformerConfig, weights: dict[str, np.ndarray]) -> None:
        self.g, self.c, self.w = g, config, weights

    def param(self, name: str) -> str:
        return self.g.weight(name, self.w[name])

    def linear(self, x: str, prefix: str) -> str:
        mm = self.g.op("MatMul", [x, self.param(f"{prefix}.weight")], f"{prefix}.matmul")
        return self.g.op("Add", [mm, self.param(f"{prefix}.bias")], f"{prefix}.add")

    def layer_norm(self, x: str, prefix: str) -> str:
        scale, bias = self.param(f"{prefix}.scale"), self.param(f"{prefix}.bias")
        return self.g.op("LayerNormalization", [x, scale, bias], prefix, axis=-1, epsilon=self.c.layer_norm_eps)

    def embeddings(self) -> str:
        g = self.g
        words = g.op("Gather", [self.param("embeddings.word"), "input_ids"], "embeddings.word.gather")
        seq_len = g.op("Shape", ["input_ids"], "embeddings.seq_len", start=1, end=2)
        zero = g.const("embeddings.zero", [0])
        positions = g.op("Slice", [self.param("embeddings.position"), zero, seq_len, zero], "embeddings.position.slice")
        return self.layer_norm(g.op("Add", [words, positions], "embeddings.add"), "embeddings.ln")

    def mask_bias(self) -> str:
        """``[batch, 1, 1, seq]``: 0 where the mask is 1, ``MASK_BIAS`` where it is 0."""
        g = self.g
        # One Unsqueeze per axis, as ``mask[:, None, None, :]`` exports: the fusion matches that.
        mask = g.op("Unsqueeze", ["attention_mask", g.const("mask.axis1", [1])], "mask.unsqueeze1")
        mask = g.op("Unsqueeze", [mask, g.const("mask.axis2", [2])], "mask.unsqueeze2")
        mask = g.op("Cast", [mask], "mask.cast", to=FLOAT)
        inverted = g.op("Sub", [g.const("mask.one", 1.0, np.float32), mask], "mask.invert")
        return g.op("Mul", [inverted, g.const("mask.bias", MASK_BIAS, np.float32)], "mask.bias")

    def heads(self, x: str, prefix: str, perm: list[int]) -> str:
        g, c = self.g, self.c
        shape = g.const(f"{prefix}.shape", [0, 0, c.heads, c.hidden // c.heads])
        return g.op("Transpose", [g.op("Reshape", [x, shape], f"{prefix}.reshape")], f"{prefix}.transpose", perm=perm)

    def attention(self, x: str, bias: str, p: str) -> str:
        g, c = self.g, self.c
        q = self.heads(self.linear(x, f"{p}.query"), f"{p}.query", [0, 2, 1, 3])
        k = self.heads(self.linear(x, f"{p}.key"), f"{p}.key", [0, 2, 3, 1])
        v = self.heads(self.linear(x, f"{p}.value"), f"{p}.value", [0, 2, 1, 3])
        scores = g.op("MatMul", [q, k], f"{p}.scores")
        scale = g.const(f"{p}.scale", math.sqrt(c.hidden // c.heads), np.float32)
        scores = g.op("Add", [g.op("Div", [scores, scale], f"{p}.scaled"), bias], f"{p}.masked")
        probs = g.op("Softmax", [scores], f"{p}.softmax", axis=-1)
        context = g.op("Transpose", [g.op("MatMul", [probs, v], f"{p}.context")], f"{p}.context.t", perm=[0, 2, 1, 3])
        merged = g.op("Reshape", [context, g.const(f"{p}.merge", [0, 0, c.hidden])], f"{p}.merge")
        out = g.op("Add", [self.linear(merged, f"{p}.output"), x], f"{p}.residual")
        return self.layer_norm(out, f"{p}.ln")

    def gelu(self, x: str, p: str) -> str:
        """``x * 0.5 * (1 + erf(x / sqrt(2)))``, written out as exporters do at opset 17."""
        g = self.g
        erf = g.op("Erf", [g.op("Div", [x, g.const(f"{p}.sqrt2", math.sqrt(2.0), np.float32)], f"{p}.div")], f"{p}.erf")
        one_plus = g.op("Add", [erf, g.const(f"{p}.one", 1.0, np.float32)], f"{p}.add1")
        return g.op("Mul", [g.op("Mul", [x, one_plus], f"{p}.mul"), g.const(f"{p}.half", 0.5, np.float32)], f"{p}.gelu")

    def ffn(self, x: str, p: str) -> str:
        hidden = self.gelu(self.linear(x, f"{p}.in"), f"{p}.act")
        out = self.g.op("Add", [self.linear(hidden, f"{p}.out"), x], f"{p}.residual")
        return self.layer_norm(out, f"{p}.ln")

    def mean_pool(self, x: str) -> str:
        """The average of the unmasked positions (sentence-transformers' pooling)."""
        g = self.g
        mask = g.op("Unsqueeze", ["attention_mask", g.const("pool.axis", [2])], "pool.unsqueeze")
        mask = g.op("Cast", [mask], "pool.cast", to=FLOAT)
        axes = g.const("pool.axes", [1])
        total = g.op("ReduceSum", [g.op("Mul", [x, mask], "pool.masked"), axes], "pool.sum", keepdims=0)
        count = g.op("ReduceSum", [mask, axes], "pool.count", keepdims=0)
        count = g.op("Max", [count, g.const("pool.min_count", MIN_COUNT, np.float32)], "pool.clamp")
        return g.op("Div", [total, count], "pool.mean")

    def classify(self, x: str) -> str:
        g = self.g
        if self.c.pooling == "mean":
            pooled = self.mean_pool(x)
        else:
            pooled = g.op("Gather", [x, g.const("pooler.index", 0)], "pooler.first", axis=1)
        return self.linear(g.op("Tanh", [self.linear(pooled, "pooler")], "pooler.tanh"), "classifier")


def transformer_graph(
    config: TransformerConfig, weights: dict[str, np.ndarray], name: str = "encoder"
) -> onnx.ModelProto:
    """The ONNX model for ``config`` with ``weights`` (see ``transformer_shapes``)."""
    expected = transformer_shapes(config)
    wrong = {k: v.shape for k, v in weights.items() if expected.get(k) != v.shape}
    missing = expected.keys() - weights.keys()
    if wrong or missing:
        raise ValueError(f"weights do not fit {config}: missing {sorted(missing)}, unexpected {wrong}")
    g = GraphBuilder(name)
    enc = _Encoder(g, config, weights)
    x, bias = enc.embeddings(), enc.mask_bias()
    for i in range(config.layers):
        x = enc.ffn(enc.attention(x, bias, f"layer{i}.attention"), f"layer{i}.ffn")
    logits = enc.classify(x)
    dims = ["batch", "sequence"]
    return g.model(
        [(INPUT_NAMES[0], INT64, dims), (INPUT_NAMES[1], INT64, dims)],
        [(OUTPUT_NAME, FLOAT, ["batch", config.classes])],
        rename={logits: OUTPUT_NAME},
    )


def parameter_count(config: TransformerConfig) -> int:
    """All weights of the model."""
    return sum(int(np.prod(s)) for s in transformer_shapes(config).values())
