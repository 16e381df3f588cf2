"""INT8 recipes: which ones a push produces, and which one an unknown edge gets.

A recipe is one way of running ONNX Runtime's quantizer; its name is the artifact's
name in the manifest. Which recipe is fastest depends on the CPU (see
``central.quantize.cpu``), so central produces a few candidates per family, the
guard judges each, and every one that passes travels to the edges, which time them
on their own hardware. Static recipes need calibration data; a CNN without any gets
generated image-like inputs (dynamic INT8 runs convolutions at 0.2x FP32's speed),
an MLP or a transformer gets the dynamic recipe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from central.quantize.cpu import cpu_kind
from central.quantize.family import Family

U8S8_QDQ = "int8-u8s8-qdq"
S8S8_QDQ = "int8-s8s8-qdq"
U8S8_QOP = "int8-u8s8-qop"
DYNAMIC = "int8-dynamic"


@dataclass(frozen=True)
class Recipe:
    """One quantizer configuration (``quantize_static``/``quantize_dynamic`` arguments)."""

    name: str
    method: Literal["static", "dynamic"]
    #: QDQ (Q/DQ pairs ORT fuses into integer kernels) or QOperator (QLinearConv, ...).
    quant_format: Literal["QDQ", "QOperator"]
    activation_type: Literal["U8", "S8"]
    weight_type: Literal["S8", "U8"]
    #: 7-bit weights: avoids the saturation of x86's ``vpmaddubsw`` without VNNI.
    reduce_range: bool
    #: Tried first; per-tensor is the fallback (``quantizer._with_fallback``).
    per_channel: bool = True

    def describe(self) -> dict[str, Any]:
        """The recipe's fields for the artifact's report."""
        return {
            "recipe": self.name,
            "method": self.method,
            "format": self.quant_format,
            "activation_type": self.activation_type,
            "weight_type": self.weight_type,
            "reduce_range": self.reduce_range,
        }


RECIPES: dict[str, Recipe] = {
    U8S8_QDQ: Recipe(U8S8_QDQ, "static", "QDQ", "U8", "S8", reduce_range=True),
    S8S8_QDQ: Recipe(S8S8_QDQ, "static", "QDQ", "S8", "S8", reduce_range=False),
    U8S8_QOP: Recipe(U8S8_QOP, "static", "QOperator", "U8", "S8", reduce_range=True),
    # Dynamic INT8 is ORT's QOperator form (MatMulInteger, DynamicQuantizeMatMul, QAttention).
    DYNAMIC: Recipe(DYNAMIC, "dynamic", "QOperator", "U8", "S8", reduce_range=True),
}

#: What each family produces by default, in order (``QuantizeSettings.recipes``).
DEFAULT_RECIPES: dict[Family, list[str]] = {
    "cnn": [U8S8_QDQ, S8S8_QDQ, U8S8_QOP],
    "mlp": [U8S8_QDQ, S8S8_QDQ, DYNAMIC],
    "transformer": [DYNAMIC],
}

#: Fastest first, per CPU kind; ``(kind, family)`` overrides ``(kind, "*")``.
_PREFERENCE: dict[tuple[str, str], tuple[str, ...]] = {
    ("x86", "*"): (U8S8_QDQ, U8S8_QOP, DYNAMIC, S8S8_QDQ),
    ("x86-vnni", "*"): (S8S8_QDQ, U8S8_QDQ, DYNAMIC, U8S8_QOP),
    ("x86-vnni", "cnn"): (U8S8_QDQ, U8S8_QOP, S8S8_QDQ, DYNAMIC),
    ("arm-dot", "*"): (S8S8_QDQ, U8S8_QDQ, DYNAMIC, U8S8_QOP),
    ("arm", "*"): (U8S8_QDQ, S8S8_QDQ, DYNAMIC, U8S8_QOP),
}


def preference(flags: frozenset[str], family: Family) -> tuple[str, ...]:
    """Recipe names, fastest first on a CPU with ``flags``, for ``family``."""
    kind = cpu_kind(flags)
    return _PREFERENCE.get((kind, family)) or _PREFERENCE[(kind, "*")]


def by_preference(names: list[str], flags: frozenset[str], family: Family) -> list[str]:
    """``names`` sorted fastest first (names the table lacks keep their order, last)."""
    order = preference(flags, family)
    rank = {name: i for i, name in enumerate(order)}
    return sorted(names, key=lambda n: rank.get(n, len(order)))


def candidates(
    family: Family, *, calibrated: bool, configured: dict[Family, list[str]], limit: int, flags: frozenset[str]
) -> list[Recipe]:
    """The recipes to produce for one push, at most ``limit``.

    Static recipes need calibration; a CNN always gets it (generated when the
    operator sent none), other families fall back to the dynamic recipe. With
    ``limit`` 1 the one kept is the fastest on ``flags``."""
    names = [n for n in configured.get(family, DEFAULT_RECIPES[family]) if n in RECIPES]
    if not calibrated and family != "cnn":
        names = [n for n in names if RECIPES[n].method == "dynamic"] or [DYNAMIC]
    if limit == 1:
        names = by_preference(names, flags, family)
    return [RECIPES[n] for n in names[: max(1, limit)]]
