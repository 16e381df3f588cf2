"""Quantization at central: FP32 uploads get an INT8 artifact that passed an accuracy guard."""

from __future__ import annotations

from central.errors import AccuracyGuardFailed, QuantizationFailed
from central.quantize.calibration import CalibrationData, generated_samples, load_calibration, split
from central.quantize.guard import Agreement, measure_agreement
from central.quantize.quantizer import QuantizationError, QuantizationResult, quantize
from central.quantize.step import QuantizeStep

__all__ = [
    "AccuracyGuardFailed",
    "Agreement",
    "CalibrationData",
    "QuantizationError",
    "QuantizationFailed",
    "QuantizationResult",
    "QuantizeStep",
    "generated_samples",
    "load_calibration",
    "measure_agreement",
    "quantize",
    "split",
]
