"""Language-model pushes: whether a push is a decoder, and whether its config, graph and
tokenizer agree.

A push is a **decoder** when it brings ``genai_config.json`` (ONNX Runtime GenAI's
builder) or its graph has KV-cache inputs and outputs by the conventional names
(``past_key_values.<i>.key`` / ``present.<i>.key``, as Optimum exports them). Its figures
come from ``genai_config.json``, else Optimum's ``config.json``, else the graph
(``spec``); they must agree with the graph (``agreement``) and the tokenizer
(``tokenizer``). Companion files that come with a graph that is not a decoder are refused."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from central.errors import BadRequest
from central.registry.decoder.agreement import check_graph
from central.registry.decoder.graph import DecoderGraph, read_graph
from central.registry.decoder.spec import GENAI_CONFIG, HF_CONFIG, DecoderSpec, from_genai_config, from_graph, read_json
from central.registry.decoder.tokenizer import TOKENIZER, check_tokenizer

__all__ = ["GENAI_CONFIG", "TOKENIZER", "DecoderGraph", "DecoderInfo", "DecoderSpec", "inspect_decoder"]


@dataclass
class DecoderInfo:
    """A checked decoder push: its spec and what the push report says of it."""

    spec: DecoderSpec
    report: dict[str, Any]


def inspect_decoder(directory: Path, model: onnx.ModelProto, companions: list[str]) -> DecoderInfo | None:
    """The decoder's checked spec, None for a model that is not one; 400 naming the field
    on a disagreement, or on companion files that came with a model that is not a decoder."""
    graph = read_graph(model)
    if GENAI_CONFIG in companions:
        spec = from_genai_config(read_json(directory / GENAI_CONFIG))
    elif graph.looks_like_decoder:
        spec = from_graph(graph, read_json(directory / HF_CONFIG) if HF_CONFIG in companions else None)
    elif companions:
        raise BadRequest(
            f"file {companions[0]!r} came with the push but the graph is not a language model (no"
            f" past_key_values inputs and present outputs, no {GENAI_CONFIG}) and references no such data file"
        )
    else:
        return None
    check_graph(spec, graph)
    tokenizer = check_tokenizer(spec, directory, companions)
    return DecoderInfo(spec, {**spec.summary(), **tokenizer, "files": companions})
