"""Weight-only INT4/INT8 candidates of a language model, made with ONNX Runtime's own
quantizer (``MatMulNBitsQuantizer``, its default round-to-nearest algorithm).

Every MatMul with a constant weight becomes a ``MatMulNBits``: the weight stored in 4 or
8 bits per value in blocks along its input dimension, one scale (and zero point) per
block, activations left in float. ``accuracy_level`` 4 lets ONNX Runtime compute those
MatMuls in int8 on AVX2/AVX-512 VNNI, which is what makes decode faster on a CPU (decode
reads every weight once per token: fewer bytes, fewer cycles). A decoder never gets the
static or dynamic INT8 recipes of tensor models (``central.quantize.recipes``): their
activation quantization of attention and logits costs a language model its accuracy."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from central.quantize.quantizer import model_bytes


@dataclass(frozen=True)
class TextRecipe:
    """One weight-only candidate: bits per weight and values per block."""

    name: str
    bits: int
    block_size: int
    symmetric: bool = False

    def describe(self) -> dict[str, object]:
        """The recipe as a report shows it."""
        return {
            "recipe": self.name,
            "method": "weight_only",
            "quantizer": "onnxruntime MatMulNBitsQuantizer (DEFAULT, round-to-nearest)",
            "bits": self.bits,
            "block_size": self.block_size,
            "symmetric": self.symmetric,
        }


#: Every recipe a language-model push may get (``quantize.text.recipes`` picks and orders).
TEXT_RECIPES: dict[str, TextRecipe] = {
    r.name: r
    for r in (
        TextRecipe("int4-b32", 4, 32),
        TextRecipe("int4-b128", 4, 128),
        TextRecipe("int8-wo", 8, 32, symmetric=True),
    )
}


@dataclass(frozen=True)
class WeightOnlyResult:
    """A candidate written: its graph, bytes on disk (graph plus data) and seconds taken."""

    path: Path
    bytes: int
    seconds: float
    quantized_nodes: int


def quantize_weights(
    source: Path, out: Path, recipe: TextRecipe, *, accuracy_level: int, external_data_bytes: int
) -> WeightOnlyResult:
    """Write ``recipe``'s candidate of ``source`` (a graph and its external data) to ``out``;
    into ``out`` plus ``model.onnx.data`` when the result may be larger than
    ``external_data_bytes`` (protobuf stops at 2 GiB)."""
    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    # The quantizer's module logs every node at INFO; a push report says what matters.
    logging.getLogger(MatMulNBitsQuantizer.__module__).setLevel(logging.WARNING)
    started = time.perf_counter()
    config = DefaultWeightOnlyQuantConfig(
        block_size=recipe.block_size,
        is_symmetric=recipe.symmetric,
        accuracy_level=accuracy_level,
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=("MatMul",),
        bits=recipe.bits,
    )
    model = onnx.load(str(source))  # the weights too: the quantizer reads them
    quantizer = MatMulNBitsQuantizer(model, algo_config=config)
    del model
    quantizer.process()
    out.parent.mkdir(parents=True, exist_ok=True)
    estimate = model_bytes(source) * recipe.bits // 32 * 2
    quantizer.model.save_model_to_file(str(out), use_external_data_format=estimate > external_data_bytes)
    nodes = sum(1 for n in quantizer.model.model.graph.node if n.op_type == "MatMulNBits")
    return WeightOnlyResult(out, model_bytes(out), round(time.perf_counter() - started, 4), nodes)
