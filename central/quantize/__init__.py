"""Quantization at central: FP32 uploads get INT8 candidates per recipe, each judged
by an accuracy guard on real (or model-respecting generated) inputs; every one that
passes travels to the edges, which serve the fastest on their own CPU."""

from __future__ import annotations

from central.errors import AccuracyGuardFailed, QuantizationFailed
from central.quantize.calibration import CalibrationData, load_calibration, split
from central.quantize.family import Family, detect_family
from central.quantize.guard import compare
from central.quantize.guard_step import GuardStep
from central.quantize.quantizer import QuantizationError, QuantizationResult, quantize
from central.quantize.recipes import RECIPES, Recipe
from central.quantize.step import QuantizeStep
from central.quantize.synthetic import generated_samples
from central.quantize.verdict import GuardVerdict, Measure, judge, wilson_lower_bound

__all__ = [
    "RECIPES",
    "AccuracyGuardFailed",
    "CalibrationData",
    "Family",
    "GuardStep",
    "GuardVerdict",
    "Measure",
    "QuantizationError",
    "QuantizationFailed",
    "QuantizationResult",
    "QuantizeSettings",
    "QuantizeStep",
    "Recipe",
    "compare",
    "detect_family",
    "generated_samples",
    "judge",
    "load_calibration",
    "quantize",
    "split",
    "wilson_lower_bound",
]
