"""The model's tokenizer (``tokenizer.json``) and chat template, as the Hugging Face conventions have them.

The chat template comes from ``chat_template.jinja`` (what the GenAI builder and recent
``transformers`` write) or the ``chat_template`` key of ``tokenizer_config.json``, and is
rendered in Jinja2's immutable sandbox: a template is data that came with a pushed model, so
it may not reach Python internals (``__class__``, ``__subclasses__``, mutating methods)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from tokenizers import Tokenizer as _HfTokenizer

from edge_node.generation.types import GenerationError

__all__ = ["ChatTemplateError", "Tokenizer", "TokenizerLoadError"]

#: Roles a chat message may have (OpenAI's; "developer" is its newer name for "system").
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ChatTemplateError(GenerationError):
    """The chat could not be rendered: an unknown role, the template's own ``raise_exception``,
    or the template tried something the sandbox forbids: 400 naming why."""

    status = 400


class TokenizerLoadError(ValueError):
    """The folder's tokenizer or chat template cannot be loaded (names the file and why)."""


class Tokenizer:
    """Encode and decode text, render chats. Thread-safe for encode/decode (``tokenizers`` is)."""

    def __init__(self, tokenizer: _HfTokenizer, config: Mapping[str, Any], chat_template: str | None) -> None:
        self._tok = tokenizer
        self.bos_token: str | None = _token_text(config.get("bos_token"))
        """The beginning-of-sequence token's text (for templates), if the model has one."""
        self.eos_token: str | None = _token_text(config.get("eos_token"))
        """The end-of-sequence token's text, if the model has one."""
        self.chat_template: str | None = chat_template
        """The Jinja2 source of the chat template, None when the model has none."""
        self._template = _compile(chat_template) if chat_template else None

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """Load ``tokenizer.json``, ``tokenizer_config.json`` and the chat template from a model folder."""
        path = folder / "tokenizer.json"
        try:
            tok = _HfTokenizer.from_file(str(path))
        except Exception as exc:
            raise TokenizerLoadError(f"{path.name}: {exc}") from exc
        config: dict[str, Any] = {}
        config_path = folder / "tokenizer_config.json"
        if config_path.exists():
            try:
                config = json.loads(config_path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise TokenizerLoadError(f"{config_path.name}: {exc}") from exc
        template_path = folder / "chat_template.jinja"
        template = template_path.read_text(encoding="utf-8") if template_path.exists() else config.get("chat_template")
        if isinstance(template, list):  # the named-templates form: [{"name": "default", "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        try:
            return cls(tok, config, template if isinstance(template, str) else None)
        except jinja2.TemplateSyntaxError as exc:
            raise TokenizerLoadError(f"chat template: {exc}") from exc

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer knows (added tokens included)."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def token_id(self, text: str) -> int | None:
        """The id of a token given by its text (a special token such as ``<|endoftext|>``), or None."""
        value = self._tok.token_to_id(text)
        return None if value is None else int(value)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds what the tokenizer's post-processor adds (BOS)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; an incomplete UTF-8 character at the end decodes to U+FFFD."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text for a chat, rendered by the model's template (HF conventions:
        ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``).

        Raises :class:`ChatTemplateError` for a message without a known role or a string
        content, for the template's own ``raise_exception``, and for anything the sandbox refuses;
        a model without a template gets a plain ``role: content`` rendering."""
        checked = [_checked_message(i, m) for i, m in enumerate(messages)]
        if not checked:
            raise ChatTemplateError("messages must not be empty")
        if self._template is None:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in checked)
            return text + ("assistant: " if add_generation_prompt else "")
        try:
            return self._template.render(
                messages=checked,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except ChatTemplateError:
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"the model's chat template did something its sandbox forbids: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template failed: {exc}") from exc


def _token_text(value: object) -> str | None:
    """A special token from tokenizer_config.json: a string or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(str(message))


def _compile(source: str) -> jinja2.Template:
    # The settings transformers uses for chat templates (trim_blocks, lstrip_blocks, tojson
    # without ASCII escapes, raise_exception, strftime_now), in the immutable sandbox.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _checked_message(index: int, message: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(message, Mapping):
        raise ChatTemplateError(f"messages[{index}] must be an object with role and content")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise ChatTemplateError(f"messages[{index}].role {role!r} is not one of {', '.join(sorted(CHAT_ROLES))}")
    content = message.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):  # OpenAI's content parts: only text parts can be rendered
        if not all(
            isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
        ):
            raise ChatTemplateError(f"messages[{index}].content parts must all be text parts")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise ChatTemplateError(f"messages[{index}].content must be a string or a list of text parts")
    return {**message, "content": content}
