"""What a text client gets back from the gateway, in its API's shape, from the pieces the
edges streamed.

The gateway always asks an edge for an OpenAI completion stream with token ids
(``central.gateway.resume``), whatever the client asked, so that a stream can move to another
node; this module turns those pieces back into what the client asked for: OpenAI completion
or chat chunks (one id, ``created`` and model for the whole stream, whichever nodes served
it), a whole completion or chat answer, or OIP ``generate`` objects. The ids the gateway
asked for are left out unless the client asked for them too (``return_token_ids``)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Api", "Piece", "Shaper"]

#: Which text API a request came in on.
Api = Literal["completions", "chat", "generate"]


@dataclass
class Piece:
    """One chunk an edge streamed: text, token ids, finish reason, usage."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    first: dict[str, Any] = field(default_factory=dict)
    """On an edge stream's first chunk: ``prompt_token_ids``, ``model_version``, ``max_tokens``."""


def piece_of(chunk: dict[str, Any]) -> Piece:
    """The piece of an edge's completion or chat chunk."""
    choices = chunk.get("choices") or []
    choice = choices[0] if choices and isinstance(choices[0], dict) else {}
    first: dict[str, Any] = {k: chunk[k] for k in ("prompt_token_ids", "model_version", "max_tokens") if k in chunk}
    delta = choice.get("delta")
    delta = delta if isinstance(delta, dict) else {}
    return Piece(
        text=str(choice.get("text") or delta.get("content") or ""),
        token_ids=[int(t) for t in chunk.get("token_ids") or ()],
        finish_reason=choice.get("finish_reason"),
        usage=chunk.get("usage"),
        first=first,
    )


class Shaper:
    """One request's answer in its API's shape."""

    def __init__(self, api: Api, model: str, *, include_usage: bool, with_ids: bool) -> None:
        self.api, self.model = api, model
        self.include_usage, self.with_ids = include_usage, with_ids
        self.id = f"{'chatcmpl' if api == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.version: str | None = None
        self._started = False

    def _wrap(self, choices: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.api == "chat" else "text_completion"
        if stream and self.api == "chat":
            kind += ".chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _oip(self, text: str, finish: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {"model_name": self.model, "text_output": text, "finish_reason": finish}
        if self.version is not None:
            out["model_version"] = self.version
        return out

    def _ids(self, out: dict[str, Any], piece: Piece, prompt_ids: list[int] | None) -> dict[str, Any]:
        if self.with_ids:
            out["token_ids"] = piece.token_ids
            if prompt_ids is not None:
                out["prompt_token_ids"] = prompt_ids
        return out

    def chunks(self, piece: Piece, prompt_ids: list[int] | None) -> list[dict[str, Any]]:
        """The stream objects one piece becomes (none for an empty one)."""
        first = not self._started
        self._started = True
        ids = prompt_ids if first else None
        if self.api == "generate":
            if not piece.text and piece.finish_reason is None:
                return []
            return [self._ids(self._oip(piece.text, piece.finish_reason), piece, ids)]
        out: list[dict[str, Any]] = []
        if self.api == "chat":
            if first:
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                        "logprobs": None}  # fmt: skip
                out.append(self._ids(self._wrap([role], True), Piece(), ids))
                ids = None
            if piece.text or piece.finish_reason is not None or piece.token_ids:
                delta = {"content": piece.text} if piece.text else {}
                choice = {"index": 0, "delta": delta, "finish_reason": piece.finish_reason, "logprobs": None}
                out.append(self._ids(self._wrap([choice], True), piece, ids))
        elif piece.text or piece.finish_reason is not None or piece.token_ids:
            choice = {"index": 0, "text": piece.text, "finish_reason": piece.finish_reason, "logprobs": None}
            out.append(self._ids(self._wrap([choice], True), piece, ids))
        return out

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any] | None:
        """The last chunk with ``usage`` when the client asked (``stream_options.include_usage``)."""
        if self.api == "generate" or not self.include_usage:
            return None
        return {**self._wrap([], True), "usage": usage}

    def whole(
        self, text: str, finish: str | None, usage: dict[str, Any], token_ids: list[int], prompt_ids: list[int] | None
    ) -> dict[str, Any]:
        """The answer of a request that did not ask for a stream."""
        piece = Piece(token_ids=token_ids)
        if self.api == "generate":
            return self._ids(self._oip(text, finish), piece, prompt_ids)
        if self.api == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                      "logprobs": None}  # fmt: skip
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return self._ids({**self._wrap([choice], False), "usage": usage}, piece, prompt_ids)

    def error(self, status: int, message: str, code: str | None = None) -> dict[str, Any]:
        """An error in the API's shape (OIP: ``{"error": "…"}``)."""
        if self.api == "generate":
            return {"error": message}
        return {"error": {"message": message, "type": error_type(status), "param": None, "code": code}}


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable"
    return "server_error" if status >= 500 else "invalid_request_error"
