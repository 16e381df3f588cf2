"""A Llama decoder's dimensions and weights: by Hugging Face's names, or seeded random ones.

``DecoderShape`` names the dimensions of ``LlamaConfig``; ``WeightSource`` hands the graph writer
each initializer in the GenAI builder's layout (``[in, out]`` MatMul weights, Q, K and V packed),
from a ``LlamaForCausalLM`` state dict or drawn from a seed, one tensor at a time."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

#: Standard deviation of the random weights (Hugging Face's ``initializer_range`` for Llama).
INIT_STD = 0.02


@dataclass(frozen=True)
class DecoderShape:
    """The dimensions of a Llama decoder (Hugging Face ``LlamaConfig``'s, by other names)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    #: Tokens in the vocabulary; ``None``: as many as the tokenizer the model is written with.
    vocab: int | None = None
    #: Longest sequence (prompt and generated): the length of the rotary caches.
    context: int = 2048
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads or (self.hidden // self.heads) % 2:
            raise ValueError(
                f"hidden {self.hidden} must split into {self.heads} heads of an even size, in groups of kv"
            )

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    @property
    def qkv_width(self) -> int:
        """Columns of the packed Q, K, V projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_size

    def parameters(self) -> int:
        """Weights in the graph (rotary caches aside), with untied embedding and LM head."""
        vocab = self.vocab or 0
        per_layer = self.hidden * (self.qkv_width + self.hidden + 3 * self.intermediate) + 2 * self.hidden
        return self.layers * per_layer + 2 * vocab * self.hidden + self.hidden


#: Weights by Hugging Face name, in Hugging Face's layout (``[out, in]`` for projections).
Weights = dict[str, np.ndarray]

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def hf_weight_shapes(shape: DecoderShape) -> dict[str, tuple[int, ...]]:
    """The tensors of ``LlamaForCausalLM``'s state dict for ``shape`` (``vocab`` resolved)."""
    if shape.vocab is None:
        raise ValueError("the shape's vocabulary size is not resolved")
    h, kv = shape.hidden, shape.kv_heads * shape.head_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab, h)}
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (shape.intermediate, h),
            p + "mlp.up_proj.weight": (shape.intermediate, h),
            p + "mlp.down_proj.weight": (h, shape.intermediate),
        }
    shapes |= {"model.norm.weight": (h,), "lm_head.weight": (shape.vocab, h)}
    return shapes


def rotary_caches(shape: DecoderShape) -> tuple[np.ndarray, np.ndarray]:
    """``[context, head_size / 2]`` cos and sin of position times frequency, as the builder makes them."""
    dim = shape.head_size
    inv_freq = np.float32(1.0) / (np.float32(shape.rope_theta) ** (np.arange(0, dim, 2).astype(np.float32) / dim))
    freqs = np.outer(np.arange(shape.context, dtype=np.float32), inv_freq.astype(np.float32))
    # cos and sin in float64, rounded once: within one float32 step of torch's (which the builder uses).
    return np.cos(freqs, dtype=np.float64).astype(np.float32), np.sin(freqs, dtype=np.float64).astype(np.float32)


class WeightSource:
    """Each graph initializer, in the builder's layout, from given weights or seeded random ones.

    ``layer_seeds`` (layer index → seed) draws those layers' random weights from another seed,
    the rest from ``seed``: a "fine-tune" of the model ``seed`` alone makes, with every other
    tensor byte for byte the same (and, the data file being laid out tensor by tensor, every
    byte outside the changed layers' ranges)."""

    def __init__(
        self, shape: DecoderShape, seed: int, weights: Weights | None, layer_seeds: Mapping[int, int] | None = None
    ) -> None:
        self.shapes = hf_weight_shapes(shape)
        self.seed, self.weights = seed, weights
        self.layer_seeds = dict(layer_seeds or {})
        if outside := sorted(i for i in self.layer_seeds if not 0 <= i < shape.layers):
            raise ValueError(f"layer_seeds name layers {outside} outside the model's {shape.layers}")
        if weights is not None:
            given = weights.keys() | ({"lm_head.weight"} if "lm_head.weight" not in weights else set())
            missing = sorted(self.shapes.keys() - given)
            if missing:
                raise ValueError(f"weights miss {missing[:3]}{' …' if len(missing) > 3 else ''}")

    def hf(self, name: str) -> np.ndarray:
        """One tensor by its Hugging Face name (a tied LM head is the embedding)."""
        shape = self.shapes[name]
        if self.weights is not None:
            if name == "lm_head.weight" and name not in self.weights:
                name = "model.embed_tokens.weight"
            array = np.asarray(self.weights[name], dtype=np.float32)
            if array.shape != shape:
                raise ValueError(f"weight {name}: shape {array.shape}, expected {shape}")
            return array
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            return np.ones(shape, np.float32)
        rng = np.random.default_rng([self._seed_of(name), list(self.shapes).index(name)])
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(INIT_STD)

    def _seed_of(self, name: str) -> int:
        """The seed of ``name``'s layer (``layer_seeds``), else the model's."""
        layer = _LAYER.match(name)
        return self.layer_seeds.get(int(layer.group(1)), self.seed) if layer else self.seed

    def matmul(self, *names: str) -> np.ndarray:
        """The ``[in, out]`` MatMul weight of one or more ``[out, in]`` projections, packed side by side."""
        return np.concatenate([self.hf(n) for n in names], axis=0).T
