"""A decoder's shape as its config says it (``genai_config.json``, else Optimum's
``config.json``, else the graph alone): layers, heads, vocabulary, names, special tokens.

``DecoderSpec`` is what the checks compare the graph and tokenizer with, and what the
text guard feeds the graph by (``central.quantize.llm``). Field names in refusals are the
config's own dotted paths (``model.decoder.num_hidden_layers``), so an operator finds
the line to fix."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from central.errors import BadRequest
from central.registry.decoder.graph import DecoderGraph

GENAI_CONFIG = "genai_config.json"
HF_CONFIG = "config.json"
#: Where the GenAI builder's config keeps the decoder's own fields.
_DECODER = "model.decoder"


@dataclass
class DecoderSpec:
    """One decoder: what to feed it, what it returns, and the figures the checks compare."""

    #: Which file the figures came from: genai_config.json, config.json or "graph".
    source: str
    num_layers: int
    vocab_size: int | None
    num_kv_heads: int | None = None
    num_attention_heads: int | None = None
    head_size: int | None = None
    context_length: int | None = None
    input_ids: str = "input_ids"
    attention_mask: str | None = "attention_mask"
    position_ids: str | None = None
    past_key: str = "past_key_values.%d.key"
    past_value: str = "past_key_values.%d.value"
    logits: str = "logits"
    present_key: str = "present.%d.key"
    present_value: str = "present.%d.value"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    #: The graph file the config names (GenAI's ``model.decoder.filename``), if any.
    filename: str | None = None

    def past_names(self, layer: int) -> tuple[str, str]:
        """The past key and value inputs of ``layer``."""
        return self.past_key % layer, self.past_value % layer

    def present_names(self, layer: int) -> tuple[str, str]:
        """The present key and value outputs of ``layer``."""
        return self.present_key % layer, self.present_value % layer

    def field_name(self, key: str) -> str:
        """How a refusal names a figure: ``genai_config.json: model.decoder.num_hidden_layers``."""
        paths = _GENAI_PATHS if self.source == GENAI_CONFIG else _HF_PATHS
        return f"{self.source}: {paths.get(key, key)}"

    def summary(self) -> dict[str, Any]:
        """The figures a push report shows."""
        return {
            "source": self.source,
            "layers": self.num_layers,
            "kv_heads": self.num_kv_heads,
            "attention_heads": self.num_attention_heads,
            "head_size": self.head_size,
            "vocab_size": self.vocab_size,
            "context_length": self.context_length,
            "bos_token_id": self.bos_token_id,
            "eos_token_ids": self.eos_token_ids,
            "pad_token_id": self.pad_token_id,
        }


_GENAI_PATHS = {
    "num_layers": f"{_DECODER}.num_hidden_layers",
    "num_kv_heads": f"{_DECODER}.num_key_value_heads",
    "num_attention_heads": f"{_DECODER}.num_attention_heads",
    "head_size": f"{_DECODER}.head_size",
    "vocab_size": "model.vocab_size",
    "context_length": "model.context_length",
    "bos_token_id": "model.bos_token_id",
    "eos_token_ids": "model.eos_token_id",
    "pad_token_id": "model.pad_token_id",
    "filename": f"{_DECODER}.filename",
    "input_ids": f"{_DECODER}.inputs.input_ids",
    "attention_mask": f"{_DECODER}.inputs.attention_mask",
    "position_ids": f"{_DECODER}.inputs.position_ids",
    "past_key": f"{_DECODER}.inputs.past_key_names",
    "past_value": f"{_DECODER}.inputs.past_value_names",
    "logits": f"{_DECODER}.outputs.logits",
    "present_key": f"{_DECODER}.outputs.present_key_names",
    "present_value": f"{_DECODER}.outputs.present_value_names",
}
_HF_PATHS = {
    "num_layers": "num_hidden_layers",
    "num_kv_heads": "num_key_value_heads",
    "num_attention_heads": "num_attention_heads",
    "head_size": "head_dim",
    "vocab_size": "vocab_size",
    "context_length": "max_position_embeddings",
    "bos_token_id": "bos_token_id",
    "eos_token_ids": "eos_token_id",
    "pad_token_id": "pad_token_id",
}


def read_json(path: Path) -> dict[str, Any]:
    """A companion JSON file as an object; 400 naming the file when it is not one."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequest(f"{path.name} must hold a JSON object")
    return value


def _int(value: Any, where: str, *, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"{where} must be a non-negative integer, got {value!r}")
    return value


def _ids(value: Any, where: str) -> list[int]:
    values = value if isinstance(value, list) else [] if value is None else [value]
    return [i for i in (_int(v, where, optional=False) for v in values) if i is not None]


def _name(value: Any, where: str, default: str | None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where} must be a name, got {value!r}")
    return value


def _pattern(value: Any, where: str, default: str) -> str:
    name = _name(value, where, default) or default
    if name.count("%d") != 1 or "%" in name.replace("%d", ""):
        raise BadRequest(f"{where} must name the layer with one %d (e.g. past_key_values.%d.key), got {name!r}")
    return name


def from_genai_config(config: dict[str, Any]) -> DecoderSpec:
    """The spec ONNX Runtime GenAI's ``genai_config.json`` describes; 400 naming the field."""
    model = config.get("model")
    decoder = model.get("decoder") if isinstance(model, dict) else None
    if not isinstance(model, dict) or not isinstance(decoder, dict):
        raise BadRequest(f"{GENAI_CONFIG}: has no {_DECODER} section")
    inputs = decoder.get("inputs") or {}
    outputs = decoder.get("outputs") or {}
    if not isinstance(inputs, dict) or not isinstance(outputs, dict):
        raise BadRequest(f"{GENAI_CONFIG}: {_DECODER}.inputs and .outputs must be objects")
    p = {k: f"{GENAI_CONFIG}: {v}" for k, v in _GENAI_PATHS.items()}
    layers = _int(decoder.get("num_hidden_layers"), p["num_layers"], optional=False)
    assert layers is not None
    return DecoderSpec(
        source=GENAI_CONFIG,
        num_layers=layers,
        vocab_size=_int(model.get("vocab_size"), p["vocab_size"]),
        num_kv_heads=_int(decoder.get("num_key_value_heads"), p["num_kv_heads"]),
        num_attention_heads=_int(decoder.get("num_attention_heads"), p["num_attention_heads"]),
        head_size=_int(decoder.get("head_size"), p["head_size"]),
        context_length=_int(model.get("context_length"), p["context_length"]),
        input_ids=_name(inputs.get("input_ids"), p["input_ids"], "input_ids") or "input_ids",
        attention_mask=_name(inputs.get("attention_mask"), p["attention_mask"], None),
        position_ids=_name(inputs.get("position_ids"), p["position_ids"], None),
        past_key=_pattern(inputs.get("past_key_names"), p["past_key"], "past_key_values.%d.key"),
        past_value=_pattern(inputs.get("past_value_names"), p["past_value"], "past_key_values.%d.value"),
        logits=_name(outputs.get("logits"), p["logits"], "logits") or "logits",
        present_key=_pattern(outputs.get("present_key_names"), p["present_key"], "present.%d.key"),
        present_value=_pattern(outputs.get("present_value_names"), p["present_value"], "present.%d.value"),
        bos_token_id=_int(model.get("bos_token_id"), p["bos_token_id"]),
        eos_token_ids=_ids(model.get("eos_token_id"), p["eos_token_ids"]),
        pad_token_id=_int(model.get("pad_token_id"), p["pad_token_id"]),
        filename=_name(decoder.get("filename"), p["filename"], None),
    )


def from_graph(graph: DecoderGraph, hf_config: dict[str, Any] | None) -> DecoderSpec:
    """The spec of a decoder pushed without ``genai_config.json``: names by convention, figures
    from Optimum's ``config.json`` when it came, else from the graph (layers from its KV pairs,
    vocabulary from its logits, heads and head size from its static cache shapes)."""
    past = next((t for n, t in graph.inputs.items() if n.startswith("past_key_values.")), None)
    shape = past.shape if past is not None and len(past.shape) == 4 else (None,) * 4
    logits = graph.outputs.get("logits")
    spec = DecoderSpec(
        source="graph",
        num_layers=len(graph.past_layers),
        vocab_size=logits.shape[-1] if logits is not None and logits.shape else None,
        num_kv_heads=shape[1],
        head_size=shape[3],
        attention_mask="attention_mask" if "attention_mask" in graph.inputs else None,
        position_ids="position_ids" if "position_ids" in graph.inputs else None,
    )
    return spec if hf_config is None else _with_hf_config(spec, hf_config)


def _with_hf_config(spec: DecoderSpec, config: dict[str, Any]) -> DecoderSpec:
    """``spec`` with the figures Optimum's ``config.json`` states (text configs may nest)."""
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    p = {k: f"{HF_CONFIG}: {v}" for k, v in _HF_PATHS.items()}
    heads = _int(text.get("num_attention_heads"), p["num_attention_heads"])
    hidden = _int(text.get("hidden_size"), f"{HF_CONFIG}: hidden_size")
    head_size = _int(text.get("head_dim"), p["head_size"])
    if head_size is None and heads and hidden:
        head_size = hidden // heads
    layers = _int(text.get("num_hidden_layers"), p["num_layers"])
    spec.source = HF_CONFIG
    spec.num_layers = spec.num_layers if layers is None else layers
    spec.vocab_size = _int(text.get("vocab_size"), p["vocab_size"]) or spec.vocab_size
    spec.num_attention_heads = heads
    spec.num_kv_heads = _int(text.get("num_key_value_heads"), p["num_kv_heads"]) or heads or spec.num_kv_heads
    spec.head_size = head_size or spec.head_size
    spec.context_length = _int(text.get("max_position_embeddings"), p["context_length"])
    spec.bos_token_id = _int(config.get("bos_token_id", text.get("bos_token_id")), p["bos_token_id"])
    spec.eos_token_ids = _ids(config.get("eos_token_id", text.get("eos_token_id")), p["eos_token_ids"])
    spec.pad_token_id = _int(config.get("pad_token_id", text.get("pad_token_id")), p["pad_token_id"])
    return spec
