"""Forwarding text requests (OpenAI completions and chat, OIP generate) to edges as streams
that survive a dying node.

Every request goes to an edge as an OpenAI completion stream with token ids
(``central.gateway.resume``), over the gateway's pooled client, in the order
``central.gateway.text_routing`` gives (prefix, session, bounded load), through the same
per-node breakers and in-flight counts as ``infer``. Lines are read from the edge only as the
client takes the chunks made of them (an async generator behind the route's streaming
response: a slow client slows its stream, nothing piles up in the gateway), and a client that
goes away closes the edge's stream, which cancels the sequence there.

Per node tried:

- no connection, a 5xx, a 503, a 404 (the node no longer serves it): the next node (a
  failure for the breaker, except 404);
- a 429 (its KV budget or queue is full): the next node, and never a failure of the node;
  when every node was busy the client gets the 429 with the last ``Retry-After``;
- another 4xx: the client's own fault, passed on as it is;
- the stream breaks (connection lost, no chunk within ``read_timeout_s``, an error event,
  an end without a finish reason): before anything reached the client, the next node gets
  the same request; after, the next node continues it (``Progress.resume_request``).

A node that failed one request is not tried again for it; at most ``attempts`` nodes are
tried before the first chunk, and as many again after each node that streamed something."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NoReturn

import httpx
import orjson

from central.gateway.candidates import Candidate, ModelCatalog
from central.gateway.outcomes import FailureKind, failure_of
from central.gateway.proxy import GatewayProxy, GatewayResponse
from central.gateway.resume import Progress, edge_request
from central.gateway.text_routing import TextRouting
from central.gateway.text_shapes import Api, Piece, Shaper, piece_of

__all__ = ["StreamBroken", "TextCall", "TextGateway", "TextRefused", "TextStats"]

log = logging.getLogger(__name__)


class TextRefused(Exception):
    """The answer of a request that could not start: a status, a body, headers."""

    def __init__(self, answer: GatewayResponse) -> None:
        super().__init__(answer.status)
        self.answer = answer


class StreamBroken(Exception):
    """A stream that ended before its finish reason (why, in words); out of ``pieces``: after
    the client got some of it, with no node left to continue it."""


@dataclass
class TextStats:
    """Counters of the text gateway since start."""

    requests: int = 0
    """Text requests routed."""
    retries: int = 0
    """Nodes tried after the first of a request, before it streamed anything."""
    busy: int = 0
    """429s from nodes (KV budget or queue full), tried elsewhere; never node failures."""
    resumed: int = 0
    """Streams continued on another node after the one streaming them died."""
    broken: int = 0
    """Streams that ended with an error after the client got some of them (no node left)."""
    routed: dict[str, int] = field(default_factory=dict)
    """First choices by reason: session, prefix, load (the preferred node too busy), least."""


@dataclass
class TextCall:
    """One client request, as every node it goes to sees it."""

    api: Api
    model: str
    doc: dict[str, Any]
    hashes: list[bytes]
    session: str | None
    shaper: Shaper
    progress: Progress = field(default_factory=Progress)


def _unix(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return 0


def _model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "modelfleet"}


def _json(status: int, doc: dict[str, Any], headers: Mapping[str, str] | None = None) -> GatewayResponse:
    return GatewayResponse(status, {"content-type": "application/json", **(headers or {})}, orjson.dumps(doc))


class TextGateway:
    """Text requests over the gateway's client, router and breakers."""

    def __init__(
        self,
        proxy: GatewayProxy,
        routing: TextRouting,
        *,
        read_timeout_s: float = 60.0,
        names: Callable[[], Awaitable[Iterable[str]]] | None = None,
        catalog: ModelCatalog | None = None,
    ) -> None:
        """``names`` (every model central's registry holds) and ``catalog`` (a version's
        manifest) list the language models; without them, the names heartbeats report."""
        self.proxy = proxy
        self.routing = routing
        self.read_timeout_s = read_timeout_s
        self.stats = TextStats()
        self._names = names
        self._catalog = catalog

    async def language_models(self) -> list[dict[str, Any]]:
        """OpenAI's model objects of every language model some live node serves: the
        registry's versions of kind ``decoder`` that a node reports ready."""
        source = self.proxy.router.source
        if self._names is None or self._catalog is None:
            names = sorted(self.routing.loads.language_models())
            return [_model_object(n, 0) for n in names if source.candidates(n, None)]
        out = []
        for name in sorted(set(await self._names())):
            described = await self._catalog(name, None)
            for version in reversed(described[1] if described is not None else []):
                found = await self._catalog(name, version)
                if found is not None and found[0].is_language_model and source.candidates(name, version):
                    out.append(_model_object(name, _unix(found[0].created_at)))
                    break
        return out

    async def pieces(self, call: TextCall) -> AsyncIterator[Piece]:
        """The pieces of one request's completion, from whichever nodes; raises
        ``TextRefused`` before the first piece when no node could start it."""
        self.stats.requests += 1
        first_path, first_body = edge_request(call.api, call.model, call.doc)
        tried: set[str] = set()
        attempts, reason, refusal = 0, "no alive node reports it ready", None
        progress = call.progress
        while attempts < self.proxy.attempts:
            choice = self.routing.order(call.model, None, call.hashes, call.session, tried)
            if not choice.order:
                break
            candidate = choice.order[0]
            tried.add(candidate.node_id)
            if not self.proxy.router.breaker(candidate.node_id).allow():
                continue
            if attempts == 0 and not progress.nodes:
                self.stats.routed[choice.reason] = self.stats.routed.get(choice.reason, 0) + 1
            elif not progress.nodes:
                self.stats.retries += 1
            attempts += 1
            path, body = first_path, first_body
            if progress.nodes and progress.resumable():
                if progress.left() <= 0:  # every token was delivered, only the last chunk was lost
                    last = Piece(finish_reason="length")
                    progress.take(last)
                    yield last
                    return
                path, body = progress.resume_request(call.model, first_body)
                self.stats.resumed += 1
            self.routing.sent(candidate.node_id, call.hashes)
            streamed_before = len(progress.nodes)
            try:
                async for piece in self._stream(candidate, path, body, progress):
                    yield piece
                return
            except TextRefused as exc:
                if exc.answer.status == 429:
                    refusal = exc
                    continue
                if progress.nodes:  # a client error on a resume: the stream cannot go on
                    reason = f"node {candidate.node_id} answered {exc.answer.status} to the resumed stream"
                    break
                raise
            except StreamBroken as exc:
                reason = f"node {candidate.node_id}: {exc}"
                log.info("gateway: text stream of %r broke: %s", call.model, reason)
                if len(progress.nodes) > streamed_before:
                    attempts = 0  # a node that streamed something: the next ones start afresh
        if progress.nodes:
            self.stats.broken += 1
            raise StreamBroken(reason)
        if refusal is not None:
            raise refusal
        if not tried and await self.proxy.unknown(call.model, None) is not None:
            raise TextRefused(_json(404, call.shaper.error(404, f"unknown model {call.model!r}", "model_not_found")))
        self.proxy.stats.unavailable += 1
        message = f"no node can serve model {call.model!r}: {reason}"
        raise TextRefused(_json(503, call.shaper.error(503, message), {"Retry-After": "1"}))

    async def _stream(
        self, candidate: Candidate, path: str, body: dict[str, Any], progress: Progress
    ) -> AsyncIterator[Piece]:
        """One node's stream, each piece taken into ``progress`` as it is passed on."""
        node = candidate.node_id
        breaker = self.proxy.router.breaker(node)
        client = self.proxy.client
        timeout = httpx.Timeout(self.read_timeout_s, connect=self.proxy.connect_timeout_s)
        request = client.build_request("POST", self.proxy.node_url(candidate, path), json=body, timeout=timeout)
        self.proxy.router.acquire(node)
        verdict: str | None = None  # None: says nothing of the node
        try:
            try:
                response = await client.send(request, stream=True)
            except (httpx.RequestError, httpx.InvalidURL) as exc:
                failure = failure_of(exc)
                if failure.kind is not FailureKind.POOL:
                    verdict = failure.reason
                raise StreamBroken(failure.reason) from None
            try:
                if response.status_code != 200:
                    await self._refused(response)
                breaker.record_success()
                async for piece in self._read(response):
                    if not progress.nodes or progress.nodes[-1] != node:
                        progress.nodes.append(node)
                    progress.take(piece)
                    yield piece
                    if progress.finished and piece.usage is not None:
                        return
            except (httpx.HTTPError, StreamBroken) as exc:
                if progress.finished:  # only the usage or [DONE] was lost
                    return
                verdict = str(exc) or type(exc).__name__
                raise StreamBroken(verdict) from None
            finally:
                await response.aclose()
        finally:
            self.proxy.router.release(node)
            if verdict is not None:
                self.proxy.stats.node_failures += 1
                breaker.record_failure(verdict)
            else:
                breaker.release()

    async def _refused(self, response: httpx.Response) -> NoReturn:
        """A node's answer other than 200: raises ``TextRefused`` (the client's, or a 429 to
        try elsewhere) or ``StreamBroken`` (try the next node)."""
        content = await response.aread()
        status = response.status_code
        if status == 429:
            self.proxy.stats.busy += 1
            self.stats.busy += 1
            headers = {"Retry-After": response.headers.get("retry-after", "1")}
            raise TextRefused(GatewayResponse(429, {"content-type": "application/json", **headers}, content))
        if status in (404, 503) or status >= 500:
            raise StreamBroken(f"answered {status}: {content[:200].decode(errors='replace')}")
        headers = {"content-type": response.headers.get("content-type", "application/json")}
        raise TextRefused(GatewayResponse(status, headers, content))

    async def _read(self, response: httpx.Response) -> AsyncIterator[Piece]:
        """The pieces of an edge's SSE stream; ``StreamBroken`` on an error event or an early end."""
        finished = False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                if not finished:
                    raise StreamBroken("the stream ended without a finish reason")
                return
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise StreamBroken(f"not a JSON chunk: {data[:100]!r}") from None
            if not isinstance(chunk, dict) or "error" in chunk:
                raise StreamBroken(f"error event: {data[:200]}")
            piece = piece_of(chunk)
            finished = finished or piece.finish_reason is not None
            yield piece
        if not finished:
            raise StreamBroken("the connection closed before the finish reason")

    def snapshot(self) -> dict[str, Any]:
        """Counters and the prefix index's size per node, for the gateway's status."""
        return {**asdict(self.stats), "prefix_blocks": self.routing.index.snapshot()}
