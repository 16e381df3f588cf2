"""Tokenizer and chat template of a language-model push: ``tokenizer.json`` loads with
Hugging Face ``tokenizers``, holds no more tokens than the model's vocabulary, and names
the special tokens ``tokenizer_config.json`` names with the ids the decoder's config
gives them; the chat template (``chat_template.jinja``, ``chat_template.json`` or
``tokenizer_config.json``'s ``chat_template``) parses in Jinja2's sandbox, as the edge
renders it. Every refusal is a 400 naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from central.errors import BadRequest
from central.registry.decoder.spec import DecoderSpec, read_json

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
CHAT_TEMPLATE_JSON = "chat_template.json"


def check_tokenizer(spec: DecoderSpec, directory: Path, companions: list[str]) -> dict[str, Any]:
    """400 unless the tokenizer loads and agrees with ``spec``; its figures for the report."""
    if TOKENIZER not in companions:
        raise BadRequest(
            f"a language model needs its {TOKENIZER} beside the graph (push the folder the exporter wrote);"
            f" it came with {', '.join(companions) or 'no other file'}"
        )
    from tokenizers import Tokenizer  # a heavy import, for language-model pushes only

    try:
        tokenizer = Tokenizer.from_file(str(directory / TOKENIZER))
    except Exception as exc:  # tokenizers raises its own Exception for a bad file
        raise BadRequest(f"{TOKENIZER} does not load with tokenizers: {exc}") from exc
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if spec.vocab_size is not None and size > spec.vocab_size:
        raise BadRequest(f"{TOKENIZER} has {size} tokens but {spec.field_name('vocab_size')} is {spec.vocab_size}")
    config = read_json(directory / TOKENIZER_CONFIG) if TOKENIZER_CONFIG in companions else {}
    _check_special_tokens(spec, config, tokenizer)
    template = _chat_template(directory, companions, config)
    return {"tokenizer_size": size, "chat_template": template}


def _token_text(value: Any) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _check_special_tokens(spec: DecoderSpec, config: dict[str, Any], tokenizer: Any) -> None:
    stated: dict[str, list[int | None]] = {
        "bos_token": [spec.bos_token_id],
        "eos_token": list(spec.eos_token_ids),
        "pad_token": [spec.pad_token_id],
    }
    keys = {"bos_token": "bos_token_id", "eos_token": "eos_token_ids", "pad_token": "pad_token_id"}
    for key, ids in stated.items():
        text = _token_text(config.get(key))
        if text is None:
            continue
        token_id = tokenizer.token_to_id(text)
        if token_id is None:
            raise BadRequest(f"{TOKENIZER_CONFIG}: {key} {text!r} is not a token of {TOKENIZER}")
        known = [i for i in ids if i is not None]
        if known and token_id not in known:
            raise BadRequest(
                f"{TOKENIZER_CONFIG}: {key} {text!r} is id {token_id} in {TOKENIZER} but"
                f" {spec.field_name(keys[key])} is {known[0] if len(known) == 1 else known}"
            )


def _templates(directory: Path, companions: list[str], config: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, template) of every chat template the push brings."""
    found: list[tuple[str, str]] = []
    if CHAT_TEMPLATE in companions:
        try:
            found.append((CHAT_TEMPLATE, (directory / CHAT_TEMPLATE).read_text(encoding="utf-8")))
        except UnicodeDecodeError as exc:
            raise BadRequest(f"{CHAT_TEMPLATE} is not UTF-8 text: {exc}") from exc
    if CHAT_TEMPLATE_JSON in companions:
        value = read_json(directory / CHAT_TEMPLATE_JSON).get("chat_template")
        found += _listed(f"{CHAT_TEMPLATE_JSON}: chat_template", value)
    if "chat_template" in config:
        found += _listed(f"{TOKENIZER_CONFIG}: chat_template", config["chat_template"])
    return found


def _listed(where: str, value: Any) -> list[tuple[str, str]]:
    """A template, or Hugging Face's list of ``{"name", "template"}``; 400 for anything else."""
    if isinstance(value, str):
        return [(where, value)]
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in value):
        return [(f"{where}[{t.get('name', i)!s}]", t["template"]) for i, t in enumerate(value)]
    raise BadRequest(
        f"{where} must be a template (a string) or a list of {{name, template}}, got {json.dumps(value)[:80]}"
    )


def _chat_template(directory: Path, companions: list[str], config: dict[str, Any]) -> str | None:
    """Parse every chat template in Jinja2's sandbox; where the one the edge uses comes from."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    templates = _templates(directory, companions, config)
    for where, source in templates:
        try:
            environment.parse(source)
        except TemplateSyntaxError as exc:
            raise BadRequest(f"{where}: the chat template does not parse (line {exc.lineno}): {exc.message}") from exc
    return templates[0][0] if templates else None
