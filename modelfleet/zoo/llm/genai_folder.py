"""The folder ONNX Runtime GenAI's model builder writes: the decoder graph, ``genai_config.json``
and the tokenizer's files (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``).

``write_decoder`` makes one from a tokenizer folder and a ``DecoderShape``, with seeded random
weights or given ones; ``genai_config`` has the builder's keys and defaults, so the GenAI runtime
(``og.Model``) loads the folder as it loads the builder's."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelfleet.zoo.llm.decoder_graph import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    PAST_KEY,
    PAST_VALUE,
    PRESENT_KEY,
    PRESENT_VALUE,
    write_decoder_graph,
)
from modelfleet.zoo.llm.decoder_shape import DecoderShape, Weights

GENAI_CONFIG = "genai_config.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
#: Copied from the tokenizer folder when present (``chat_template.jinja`` is optional).
TOKENIZER_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, CHAT_TEMPLATE)


def tokenizer_vocab(tokenizer_dir: Path) -> dict[str, int]:
    """Every token of ``tokenizer.json`` (the model's vocabulary and the added special tokens) by id."""
    spec = json.loads((tokenizer_dir / TOKENIZER_JSON).read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    vocab |= {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    return vocab


def special_token_ids(tokenizer_dir: Path) -> tuple[int, list[int], int]:
    """(bos, eos ids, pad) as the builder resolves them: ``tokenizer_config.json``'s tokens, with
    ``<|endoftext|>`` ahead of a different end-of-turn ``eos_token`` when the vocabulary has both."""
    config = json.loads((tokenizer_dir / TOKENIZER_CONFIG).read_text(encoding="utf-8"))
    vocab = tokenizer_vocab(tokenizer_dir)

    def token_id(key: str) -> int | None:
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        return vocab.get(token) if token is not None else None

    eos = token_id("eos_token")
    if eos is None:
        raise ValueError(f"{tokenizer_dir / TOKENIZER_CONFIG} names no eos_token in the vocabulary")
    bos = token_id("bos_token")
    eos_ids = [i for i in (vocab.get("<|endoftext|>"), eos) if i is not None]
    pad = token_id("pad_token")
    return (eos_ids[0] if bos is None else bos), sorted(set(eos_ids)), (eos_ids[0] if pad is None else pad)


def genai_config(shape: DecoderShape, bos: int, eos: list[int], pad: int) -> dict[str, Any]:
    """``genai_config.json`` as the builder writes it for a CPU FP32 Llama."""
    return {
        "model": {
            "bos_token_id": bos,
            "context_length": shape.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": shape.head_size,
                "hidden_size": shape.hidden,
                "inputs": {
                    "input_ids": INPUT_IDS,
                    "attention_mask": ATTENTION_MASK,
                    "past_key_names": PAST_KEY,
                    "past_value_names": PAST_VALUE,
                },
                "outputs": {"logits": LOGITS, "present_key_names": PRESENT_KEY, "present_value_names": PRESENT_VALUE},
                "num_attention_heads": shape.heads,
                "num_hidden_layers": shape.layers,
                "num_key_value_heads": shape.kv_heads,
            },
            "eos_token_id": eos[0] if len(eos) == 1 else eos,
            "pad_token_id": pad,
            "type": "llama",
            "vocab_size": shape.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": shape.context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def copy_tokenizer(tokenizer_dir: Path, out_dir: Path, context: int) -> None:
    """Copy the tokenizer's files; ``model_max_length`` becomes the context, as the builder sets it."""
    for name in TOKENIZER_FILES:
        source = tokenizer_dir / name
        if name == TOKENIZER_CONFIG:
            config = json.loads(source.read_text(encoding="utf-8"))
            config["model_max_length"] = context
            (out_dir / name).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        elif source.exists() or name != CHAT_TEMPLATE:
            shutil.copyfile(source, out_dir / name)


def resolve_vocab(shape: DecoderShape, tokenizer_dir: Path) -> DecoderShape:
    """``shape`` with ``vocab`` set to the tokenizer's size when left open; a smaller one is refused."""
    size = max(tokenizer_vocab(tokenizer_dir).values()) + 1
    if shape.vocab is None:
        return replace(shape, vocab=size)
    if shape.vocab < size:
        raise ValueError(f"vocab {shape.vocab} is smaller than the tokenizer's {size} tokens")
    return shape


def write_decoder(
    out_dir: Path,
    shape: DecoderShape,
    tokenizer_dir: Path,
    seed: int = 0,
    weights: Weights | None = None,
    layer_seeds: Mapping[int, int] | None = None,
) -> Path:
    """Write a GenAI folder for ``shape`` into ``out_dir`` and return it.

    ``weights``: a ``LlamaForCausalLM`` state dict as numpy arrays; ``None``: random from ``seed``
    (the layers ``layer_seeds`` names, layer index → seed, from their own)."""
    shape = resolve_vocab(shape, tokenizer_dir)
    write_decoder_graph(out_dir, shape, seed=seed, weights=weights, layer_seeds=layer_seeds)
    bos, eos, pad = special_token_ids(tokenizer_dir)
    config = genai_config(shape, bos, eos, pad)
    (out_dir / GENAI_CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
    copy_tokenizer(tokenizer_dir, out_dir, shape.context)
    return out_dir
