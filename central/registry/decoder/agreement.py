"""Config ↔ graph agreement of a decoder: every input and output the config names exists,
one past/present pair per layer, the cache shapes and the logits' vocabulary match where
the graph states them. Each refusal is a 400 that names the config's field, e.g.
``genai_config.json: model.decoder.num_hidden_layers is 4 but the graph has 2
past_key_values pairs``."""

from __future__ import annotations

from central.errors import BadRequest
from central.registry.decoder.graph import DecoderGraph
from central.registry.decoder.spec import DecoderSpec
from fleetwire.manifest import MODEL_FILE

#: Graph inputs an engine knows how to feed besides the cache.
_FED = ("input_ids", "attention_mask", "position_ids")


def check_graph(spec: DecoderSpec, graph: DecoderGraph) -> None:
    """400 naming the field where ``spec`` and ``graph`` disagree (see the module docstring)."""
    if spec.filename is not None and spec.filename != MODEL_FILE:
        raise BadRequest(
            f"{spec.field_name('filename')} is {spec.filename!r} but a version's graph is {MODEL_FILE}; set it to"
            f" {MODEL_FILE!r}"
        )
    _check_names(spec, graph)
    _check_layers(spec, graph)
    _check_cache_shapes(spec, graph)
    _check_vocab(spec, graph)


def _check_names(spec: DecoderSpec, graph: DecoderGraph) -> None:
    for key in _FED:
        name = getattr(spec, key)
        if name is not None and name not in graph.inputs:
            raise BadRequest(f"{spec.field_name(key)} is {name!r} but the graph has no such input")
    if spec.logits not in graph.outputs:
        raise BadRequest(f"{spec.field_name('logits')} is {spec.logits!r} but the graph has no such output")
    cache = {n for layer in range(spec.num_layers) for n in spec.past_names(layer)}
    known = cache | {getattr(spec, key) for key in _FED}
    unknown = sorted(set(graph.inputs) - known)
    if unknown:
        raise BadRequest(
            f"the graph has an input {unknown[0]!r} the decoder's config does not name; a language model takes"
            " input_ids, attention_mask, position_ids and its KV cache"
        )


def _pairs(spec: DecoderSpec, graph: DecoderGraph) -> int:
    """How many layers the graph has a full past and present pair for, by the spec's names."""
    layer = 0
    while all(n in graph.inputs for n in spec.past_names(layer)) and all(
        n in graph.outputs for n in spec.present_names(layer)
    ):
        layer += 1
    return layer


def _check_layers(spec: DecoderSpec, graph: DecoderGraph) -> None:
    pairs = _pairs(spec, graph)
    if pairs != spec.num_layers:
        raise BadRequest(
            f"{spec.field_name('num_layers')} is {spec.num_layers} but the graph has {pairs} past_key_values pairs"
            f" ({spec.past_key} / {spec.present_key} and their values)"
        )
    if pairs == 0:
        raise BadRequest("the decoder's graph has no KV-cache inputs (past_key_values.0.key ...)")


def _check_cache_shapes(spec: DecoderSpec, graph: DecoderGraph) -> None:
    for layer in range(spec.num_layers):
        for name in (*spec.past_names(layer), *spec.present_names(layer)):
            tensor = graph.inputs.get(name) or graph.outputs[name]
            if len(tensor.shape) != 4:
                raise BadRequest(f"the graph's {name!r} has {len(tensor.shape)} dimensions; a KV cache has 4")
            for key, dim, label in (("num_kv_heads", 1, "KV heads"), ("head_size", 3, "head size")):
                stated, static = getattr(spec, key), tensor.shape[dim]
                if stated is not None and static is not None and stated != static:
                    raise BadRequest(
                        f"{spec.field_name(key)} is {stated} but the graph's {name!r} has {label} {static}"
                        f" (dimension {dim} of [batch, kv_heads, length, head_size])"
                    )
            if spec.num_kv_heads is None:
                spec.num_kv_heads = tensor.shape[1]
            if spec.head_size is None:
                spec.head_size = tensor.shape[3]


def _check_vocab(spec: DecoderSpec, graph: DecoderGraph) -> None:
    shape = graph.outputs[spec.logits].shape
    if len(shape) != 3:
        raise BadRequest(
            f"the graph's {spec.logits!r} has {len(shape)} dimensions; logits are [batch, sequence, vocab]"
        )
    if spec.vocab_size is None:
        spec.vocab_size = shape[-1]
    elif shape[-1] is not None and shape[-1] != spec.vocab_size:
        raise BadRequest(
            f"{spec.field_name('vocab_size')} is {spec.vocab_size} but the graph's logits have {shape[-1]}"
        )
    vocab = spec.vocab_size
    if vocab is None:
        raise BadRequest("the graph's logits do not state the vocabulary size and neither does the config")
    for key in ("bos_token_id", "pad_token_id"):
        value = getattr(spec, key)
        if value is not None and value >= vocab:
            raise BadRequest(f"{spec.field_name(key)} is {value}, outside the vocabulary of {vocab}")
    for eos in spec.eos_token_ids:
        if eos >= vocab:
            raise BadRequest(f"{spec.field_name('eos_token_ids')} is {eos}, outside the vocabulary of {vocab}")
