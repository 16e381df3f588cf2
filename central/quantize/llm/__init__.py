"""Quantization of language models (pushes of kind ``decoder``): weight-only INT4/INT8
candidates made with ONNX Runtime's ``MatMulNBitsQuantizer``, judged on held-out text by
perplexity ratio and greedy-token agreement, each with a confidence bound."""

from __future__ import annotations

from central.quantize.llm.guard import TextRun, TextVerdict, judge_text, run_text
from central.quantize.llm.step import TextGuardStep, TextPlan, TextQuantizeStep
from central.quantize.llm.text import TextWindows, builtin_text, held_out_text, token_windows
from central.quantize.llm.weight_only import TEXT_RECIPES, TextRecipe, quantize_weights

__all__ = [
    "TEXT_RECIPES",
    "TextGuardStep",
    "TextPlan",
    "TextQuantizeStep",
    "TextRecipe",
    "TextRun",
    "TextVerdict",
    "TextWindows",
    "builtin_text",
    "held_out_text",
    "judge_text",
    "quantize_weights",
    "run_text",
    "token_windows",
]
