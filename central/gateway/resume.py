"""What the gateway asks an edge for, first and after a node died mid-stream.

A generation is a pure function of the prompt, the tokens so far and the seed, so a stream
can move: the gateway always asks for an OpenAI completion stream with token ids
(``return_token_ids``: each chunk carries the tokens whose text it completes, the first one
the prompt's token ids and the effective ``max_tokens``), keeps the ids of every chunk it has
passed on, and when the node dies asks another for a completion whose prompt is the prompt's
token ids plus those tokens, ``max_tokens`` reduced by them and ``resume_offset`` set to their
count, with the same sampling fields (seed included). The edge's sampler then skips the random
draws those tokens took and its detokenizer counts their text as sent
(``edge_node.generation``), so the client's stream goes on with no gap and no duplicate.
Greedy and seeded streams continue exactly as the first node would have. An unseeded sampled
stream continues from the same tokens, coherently, but draws fresh random numbers: its
remaining tokens are not those the first node would have drawn (they never could be known).

Tokens the dead node generated after the last chunk it sent (text held back: half a UTF-8
character, a possible stop string) were never delivered: the next node generates them again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from central.gateway.text_shapes import Api, Piece

__all__ = ["COMPLETIONS", "Progress", "edge_request"]

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
#: Request fields of a completion that carry over to a resumed one (the rest is the prompt's).
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "stop", "repetition_penalty", "ignore_eos",
             "presence_penalty", "frequency_penalty", "n", "logprobs", "echo", "best_of")  # fmt: skip
_STREAMED = {"stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}


def edge_request(api: Api, model: str, doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The first request for an edge (path, body): the client's, as a stream with token ids.
    An OIP ``generate`` body (``text_input``, ``parameters``) becomes a completion."""
    if api == "generate":
        parameters = doc.get("parameters")
        parameters = parameters if isinstance(parameters, dict) else {}
        body = {**parameters, "model": model, "prompt": doc.get("text_input")}
        body.pop("stream", None)
        return COMPLETIONS, {**body, **_STREAMED}
    return (CHAT if api == "chat" else COMPLETIONS), {**doc, **_STREAMED}


@dataclass
class Progress:
    """How far one request's stream got: what the client has been sent, and from whom."""

    prompt_ids: list[int] | None = None
    """The prompt's token ids, as the first node tokenized (and templated) it."""
    max_tokens: int | None = None
    version: str | None = None
    sent: list[int] = field(default_factory=list)
    """Token ids of every chunk passed on to the client, in order."""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    nodes: list[str] = field(default_factory=list)
    """Nodes that streamed some of it, in order."""
    resumes: int = 0

    @property
    def finished(self) -> bool:
        """The last chunk (with a finish reason) has been passed on."""
        return self.finish_reason is not None

    def take(self, piece: Piece) -> None:
        """A chunk is passed on: remember its ids (and the first chunk's prompt ids)."""
        first = piece.first
        if self.prompt_ids is None and isinstance(first.get("prompt_token_ids"), list):
            self.prompt_ids = [int(t) for t in first["prompt_token_ids"]]
            self.max_tokens = int(first["max_tokens"]) if isinstance(first.get("max_tokens"), int) else None
            self.version = str(first["model_version"]) if first.get("model_version") is not None else None
        self.sent.extend(piece.token_ids)
        if piece.finish_reason is not None:
            self.finish_reason = piece.finish_reason
        if piece.usage is not None:
            self.usage = piece.usage

    def resumable(self) -> bool:
        """Whether another node can continue (the prompt's ids and ``max_tokens`` are known)."""
        return self.prompt_ids is not None and self.max_tokens is not None

    def left(self) -> int:
        """Tokens the stream may still generate."""
        return (self.max_tokens or 0) - len(self.sent)

    def resume_request(self, model: str, first: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The completion that continues the stream on another node (see the module doc);
        ``first``: the first request's body, whose sampling fields carry over."""
        assert self.prompt_ids is not None
        self.resumes += 1
        body = {k: first[k] for k in _SAMPLING if k in first}
        body.update(model=model, prompt=self.prompt_ids + self.sent, max_tokens=self.left())
        body.update(resume_offset=len(self.sent), **_STREAMED)
        return COMPLETIONS, body

    def usage_now(self) -> dict[str, Any]:
        """OpenAI's ``usage`` of the whole stream, whichever nodes made it."""
        prompt = len(self.prompt_ids or ())
        cached = 0
        if self.usage is not None:
            details = self.usage.get("prompt_tokens_details") or {}
            cached = min(prompt, int(details.get("cached_tokens") or 0))
        done = len(self.sent)
        return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
