"""Forwarding OIP v2 inference requests to edges, with retries on other nodes only where
the request never ran.

Bodies are bytes end to end: the route reads the client's body once (size-limited),
and the same bytes go to every attempt; a node's response is read fully into memory
(OIP inference responses are small) and passed back as is (status, body bytes and the
headers that carry meaning: ``content-type``, ``Inference-Header-Content-Length``,
``Retry-After``), never decoded and re-encoded. Nothing is streamed, so a retry can
always resend the whole request, and a client never sees half a response.

Per attempt, in the router's order (one overall deadline across attempts, at most
``attempts`` nodes tried), as ``central.gateway.outcomes`` explains:

- no connection, or the body could not be sent: a failure for that node's breaker, then
  the next candidate;
- a 503 (a node answers 503 before it runs anything: model not loaded, queue full, too
  many requests): a failure for its breaker, then the next candidate;
- a 404 (the node does not serve that model or version): the node's entry in the
  ``NodeSource`` is stale (it unloaded the model, or is shutting down and has retired
  its models but still answers HTTP), so the next candidate is tried; the node is
  healthy (breaker success). When every node tried answered 404 that 404 is the answer;
- any other answer is the client's, passed through at once with the node's status and
  body: 2xx, and 4xx (bad input stays bad on any node; a request's own fault is no
  failure of the node's); a 500 counts against the node's breaker (it failed a request
  it ran: out of memory, a broken device) but is not sent elsewhere;
- no answer within the read timeout (``central.gateway.timeouts``: learned per model
  and scaled by the request's rows): a liveness probe (``central.gateway.probe``) tells a
  busy node from a down one. Busy: 504, not sent elsewhere since the node is still
  running it, and nothing against its breaker. Down (frozen, hung): a failure, then the
  next candidate;
- the connection closed after the request was sent, before an answer: a failure; one
  more node is tried (at most once per request), then 502.

When no node can serve (none reports the model ready, every breaker is open, or every
attempt failed before it ran) the gateway answers 503 ``{"error": "no node can serve
model 'm' (version 'v'): <last reason>"}``, with the node's ``Retry-After`` when the last
failure carried one; a model (version) the catalog (central's registry) has never heard of
is a 404 instead. Every answer from a node carries ``X-Modelfleet-Node``."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx
import orjson

from central.gateway.candidates import Candidate, ModelCatalog
from central.gateway.outcomes import Failure, FailureKind, failure_of, node_error
from central.gateway.probe import LivenessProber
from central.gateway.rolling import RollingStats
from central.gateway.router import GatewayRouter
from central.gateway.timeouts import ReadTimeouts, request_rows

log = logging.getLogger(__name__)

#: Request header whose value pins a request to a node (consistent hashing).
AFFINITY_HEADER = "X-Modelfleet-Affinity-Key"
#: Response header naming the node whose answer this is.
NODE_HEADER = "X-Modelfleet-Node"
HEADER_LENGTH = "Inference-Header-Content-Length"

_FORWARDED_REQUEST_HEADERS = ("content-type", "inference-header-content-length")
_PASSED_RESPONSE_HEADERS = {
    "content-type": "content-type",
    "inference-header-content-length": HEADER_LENGTH,
    "retry-after": "Retry-After",
}


#: ``Retry-After`` of a 503 for a known model no node serves yet, when no node named one.
_RETRY_AFTER_S = "1"


class GatewayResponse(NamedTuple):
    """What the gateway answers: status, headers and body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class GatewayStats:
    """Counters since start."""

    requests: int = 0
    """Requests forwarded (or refused) by the gateway."""
    attempts: int = 0
    """Requests sent to nodes (one request may take several)."""
    retries: int = 0
    """Attempts after the first of a request."""
    node_failures: int = 0
    """Attempts that failed: unreachable, timed out, or 5xx."""
    busy: int = 0
    """Attempts a node shed at once (503 with Retry-After: its queue was full), sent to the next
    node: counted here, not as failures (a busy node is healthy; its breaker still steers load
    off it for a moment)."""
    unavailable: int = 0
    """503s the gateway answered itself (no node could serve)."""
    too_large: int = 0
    """Requests refused with 413."""
    overloaded: int = 0
    """Requests refused with 503 because ``max_outstanding`` requests were in progress."""
    timeouts: int = 0
    """Requests answered 504: the node did not answer within the request's read timeout."""


class _Request(NamedTuple):
    """One inference request as every attempt sends it."""

    model: str
    path: str
    body: bytes
    headers: dict[str, str]
    rows: int


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> GatewayResponse:
    return GatewayResponse(
        status, {"content-type": "application/json", **(headers or {})}, orjson.dumps({"error": message})
    )


def infer_path(model: str, version: str | None) -> str:
    """The OIP inference path of ``model`` (at ``version``)."""
    base = f"/v2/models/{quote(model, safe='')}"
    if version is not None:
        base += f"/versions/{quote(version, safe='')}"
    return base + "/infer"


class GatewayProxy:
    """Forwards inference requests over one pooled HTTP/1.1 keep-alive client."""

    def __init__(
        self,
        router: GatewayRouter,
        *,
        attempts: int = 3,
        deadline_s: float = 10.0,
        connect_timeout_s: float = 1.0,
        read_timeout_s: float = 2.0,
        timeouts: ReadTimeouts | None = None,
        max_body_bytes: int = 64 * 1024 * 1024,
        max_connections: int = 1024,
        max_outstanding: int = 256,
        keepalive_expiry_s: float = 4.0,
        transport: httpx.AsyncBaseTransport | None = None,
        scheme: str = "http",
        ssl_context: ssl.SSLContext | None = None,
        catalog: ModelCatalog | None = None,
    ) -> None:
        """``catalog`` (central's registry): a model it does not know is a 404, not a 503."""
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.router = router
        self.attempts = attempts
        self.deadline_s = deadline_s
        self.connect_timeout_s = connect_timeout_s
        #: How long a node may stay silent on a request that runs no model (liveness probes, metadata).
        self.read_timeout_s = read_timeout_s
        #: The read timeout of each inference request, learned per model.
        self.timeouts = timeouts or ReadTimeouts()
        self.max_body_bytes = max_body_bytes
        #: Requests the routes may hold at once, and how many they hold now.
        self.max_outstanding = max_outstanding
        self.outstanding = 0
        #: "https" when edges serve HTTPS (central's ``tls.edge_https``); ``ssl_context`` verifies them.
        self.scheme = scheme
        self.stats = GatewayStats()
        self._catalog = catalog
        #: Requests per second and latency over the last minute (for the dashboard).
        self.rolling = RollingStats()
        #: Called with (model, status, seconds) for every answered request (metrics).
        self.observer: Callable[[str, int, float], None] | None = None
        # Keep-alive expiry below uvicorn's default 5 s idle timeout, so a pooled
        # connection is dropped here before the edge closes it under a request.
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=keepalive_expiry_s,
        )
        self._client = httpx.AsyncClient(
            limits=limits,
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            headers={"user-agent": "modelfleet-gateway", "accept-encoding": "identity"},
            trust_env=False,  # never route fleet traffic through an environment proxy
            follow_redirects=False,
            transport=transport,
            verify=ssl_context if ssl_context is not None else True,
        )

        #: Tells a node that timed out from one that is down (``central.gateway.probe``).
        self.prober = LivenessProber(
            self._client, self.node_url, connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s
        )

    @property
    def client(self) -> httpx.AsyncClient:
        """The pooled client to the nodes (metadata requests share it)."""
        return self._client

    def node_url(self, candidate: Candidate, path: str) -> str:
        """The URL of ``path`` on ``candidate``."""
        return f"{self.scheme}://{candidate.http_address}{path}"

    async def close(self) -> None:
        """Stop the liveness probes and close the pooled connections."""
        await self.prober.close()
        await self._client.aclose()

    def refusal(self) -> GatewayResponse | None:
        """The gateway's own 503 (Retry-After) when every one of the ``max_outstanding``
        places is taken, else None. The REST route asks before it reads a body, so a full
        gateway reads none; the place itself is taken only once the body has arrived."""
        if self.outstanding < self.max_outstanding:
            return None
        self.stats.overloaded += 1
        message = (
            f"the gateway holds {self.outstanding} requests (gateway.max_outstanding={self.max_outstanding});"
            " retry shortly"
        )
        return _error(503, message, {"Retry-After": "1"})

    @contextmanager
    def holding(self) -> Iterator[GatewayResponse | None]:
        """One of the ``max_outstanding`` places, held while the block runs: taken with the
        request's body in hand (a slow body holds none). Yields None, or the gateway's own
        503 (``refusal``) when every place is taken: then nothing is held."""
        if (refused := self.refusal()) is not None:
            yield refused
            return
        self.outstanding += 1
        try:
            yield None
        finally:
            self.outstanding -= 1

    async def unknown(self, model: str, version: str | None) -> GatewayResponse | None:
        """A 404 when the catalog has never heard of ``model`` (``version``); None otherwise."""
        if self._catalog is None or await self._catalog(model, version) is not None:
            return None
        if version is not None and await self._catalog(model, None) is not None:
            return _error(404, f"model {model!r} has no version {version!r}")
        return _error(404, f"unknown model {model!r}")

    def _unavailable(self, model: str, version: str | None, reason: str, retry_after: str | None) -> GatewayResponse:
        """503 for a model the registry knows that no node can serve now: retry later (the
        busiest node's ``Retry-After``, else a second: nodes load, breakers half-open)."""
        self.stats.unavailable += 1
        what = f"model {model!r}" + (f" (version {version!r})" if version is not None else "")
        return _error(503, f"no node can serve {what}: {reason}", {"Retry-After": retry_after or _RETRY_AFTER_S})

    def _no_candidates_reason(self, model: str, version: str | None) -> str:
        ids = sorted({c.node_id for c in self.router.source.candidates(model, version)})
        if not ids:
            return "no alive node reports it ready"
        return f"every node reporting it ready is failing (circuit breaker open: {', '.join(ids)})"

    async def forward(
        self,
        model: str,
        version: str | None,
        request_body: bytes,
        headers: Mapping[str, str],
        key: str | None = None,
    ) -> GatewayResponse:
        """Send one inference request to the best node, retrying on others; see the module doc."""
        self.stats.requests += 1
        if len(request_body) > self.max_body_bytes:
            self.stats.too_large += 1
            return _error(413, f"request body of {len(request_body)} bytes exceeds the limit of {self.max_body_bytes}")
        lowered = {k.lower(): v for k, v in headers.items()}
        sent_headers = {k: lowered[k] for k in _FORWARDED_REQUEST_HEADERS if k in lowered}
        if (refusal := _unforwardable(sent_headers)) is not None:
            return refusal
        candidates = self.router.order(model, version, key)
        if not candidates:
            return await self.unknown(model, version) or self._unavailable(
                model, version, self._no_candidates_reason(model, version), None
            )
        rows = request_rows(request_body, _header_length(lowered))
        request = _Request(model, infer_path(model, version), request_body, sent_headers, rows)
        return await self._try_nodes(request, version, candidates)

    async def forward_recorded(
        self,
        model: str,
        version: str | None,
        request_body: bytes,
        headers: Mapping[str, str],
        key: str | None = None,
    ) -> GatewayResponse:
        """``forward``, timed into the rolling stats and the observer: what each transport
        (REST, KServe v2 gRPC) calls, inside ``holding()``."""
        started = time.perf_counter()
        answer = await self.forward(model, version, request_body, headers, key)
        elapsed = time.perf_counter() - started
        self.rolling.record(elapsed, ok=answer.status < 500)
        if self.observer is not None:
            self.observer(model, answer.status, elapsed)
        return answer

    async def _try_nodes(self, request: _Request, version: str | None, candidates: list[Candidate]) -> GatewayResponse:
        loop = asyncio.get_running_loop()
        read_timeout = self.timeouts.timeout_for(request.model, request.rows)
        # deadline_s bounds the attempts before one runs the request; the one that runs it
        # gets its whole read timeout, which follows the model and the rows (or is fixed).
        deadline_s = max(self.deadline_s, read_timeout or 0.0)
        deadline = loop.time() + deadline_s
        tried, resets = 0, 0
        reason = "every candidate node was being probed by another request"
        retry_after: str | None = None
        all_not_found: tuple[Candidate, httpx.Response] | None = None  # while every answer was 404
        for candidate in candidates:
            if tried >= self.attempts:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                reason = f"deadline of {deadline_s:g}s exceeded; last: {reason}"
                break
            if not self.router.breaker(candidate.node_id).allow():  # half-open, its one trial taken
                continue
            if tried:
                self.stats.retries += 1
            tried += 1
            self.stats.attempts += 1
            started = loop.time()
            timeout = min(read_timeout or remaining, remaining)
            outcome = await self._attempt(candidate, request, remaining, timeout)
            retry_after = None
            if isinstance(outcome, httpx.Response):
                status = outcome.status_code
                if status < 400:
                    self.timeouts.observe(request.model, loop.time() - started, request.rows)
                if status not in (404, 503):
                    if status >= 500:
                        self.stats.node_failures += 1
                    return self._pass_through(candidate, outcome)
                reason = f"node {candidate.node_id} answered {status}: {node_error(outcome)}"
                if status == 404:
                    if tried == 1:
                        all_not_found = (candidate, outcome)
                    log.info("gateway: %s; trying the next node", reason)
                    continue
                retry_after = outcome.headers.get("retry-after")
                if status == 503 and retry_after is not None:
                    self.stats.busy += 1
                    all_not_found = None
                    log.info("gateway: %s; trying the next node", reason)
                    continue
            else:
                reason = f"node {candidate.node_id} at {candidate.http_address}: {outcome.reason}"
                if outcome.kind is FailureKind.POOL:
                    continue
                if outcome.kind is FailureKind.TIMEOUT:
                    down = await self._after_timeout(candidate, deadline - loop.time())
                    if down is None:
                        return self._timed_out(candidate, request, timeout)
                    reason = f"node {candidate.node_id} at {candidate.http_address}: {down}"
                if outcome.kind is FailureKind.RESET:
                    resets += 1
                    if resets > 1:
                        self.stats.node_failures += 1
                        return _error(502, f"{reason}; the connection closed before an answer, twice", _node(candidate))
            all_not_found = None
            self.stats.node_failures += 1
            log.info("gateway: %s", reason)
        if all_not_found is not None:
            return self._pass_through(*all_not_found)
        return self._unavailable(request.model, version, reason, retry_after)

    async def _after_timeout(self, candidate: Candidate, remaining: float) -> str | None:
        """Whether a node that timed out is down (why) or busy (None), told to its breaker.
        Without time left to ask, the request ends (None) and the probe runs in the background."""
        breaker = self.router.breaker(candidate.node_id)
        if remaining <= 0:
            self.prober.judge_later(candidate, breaker)
            return None
        try:
            down = await self.prober.why_down(candidate, remaining)
        except BaseException:
            breaker.release()
            raise
        if down is None:
            breaker.release()  # busy, not down: nothing against the node
        else:
            breaker.record_failure(down)
        return down

    def _timed_out(self, candidate: Candidate, request: _Request, timeout: float) -> GatewayResponse:
        """504 for a request a live node (or one there was no time left to ask) did not answer in time."""
        self.stats.timeouts += 1
        message = (
            f"node {candidate.node_id} did not answer model {request.model!r} within {timeout:.3g}s"
            f" ({request.rows} rows; the read timeout follows the model's latency, gateway.model_timeouts"
            " fixes it); not sent elsewhere: the node may still be running it"
        )
        log.info("gateway: %s", message)
        return _error(504, message, _node(candidate))

    async def _attempt(
        self, candidate: Candidate, request: _Request, remaining: float, read_timeout: float
    ) -> httpx.Response | Failure:
        """One request to one node, its outcome recorded in the node's breaker (a timeout's
        later, by the probe): the response, or the failure."""
        node = candidate.node_id
        breaker = self.router.breaker(node)
        timeout = httpx.Timeout(read_timeout, connect=min(self.connect_timeout_s, remaining), pool=remaining)
        self.router.acquire(node)
        try:
            async with asyncio.timeout(remaining):
                response = await self._client.post(
                    self.node_url(candidate, request.path),
                    content=request.body,
                    headers=request.headers,
                    timeout=timeout,
                )
        except (httpx.RequestError, httpx.InvalidURL, TimeoutError) as exc:
            failure = failure_of(exc)
            if failure.kind is FailureKind.POOL:
                breaker.release()  # the gateway's pool was exhausted: says nothing about the node
            elif failure.kind is not FailureKind.TIMEOUT:  # a timeout's verdict comes from a liveness probe
                breaker.record_failure(failure.reason)
            return failure
        except BaseException:
            breaker.release()  # cancelled: nothing learnt about the node
            raise
        finally:
            self.router.release(node)
        if response.status_code >= 500:  # a shed 503 too: the breaker steers load off a full queue
            breaker.record_failure(f"answered {response.status_code}: {node_error(response)}")
        else:
            breaker.record_success()
        return response

    def _pass_through(self, candidate: Candidate, response: httpx.Response) -> GatewayResponse:
        headers = {out: response.headers[k] for k, out in _PASSED_RESPONSE_HEADERS.items() if k in response.headers}
        headers[NODE_HEADER] = candidate.node_id
        return GatewayResponse(response.status_code, headers, response.content)

    def snapshot(self) -> dict[str, Any]:
        """Router state, settings, counters and learned read timeouts, for the status endpoint."""
        return {
            **self.router.snapshot(),
            "attempts": self.attempts,
            "deadline_s": self.deadline_s,
            "stats": asdict(self.stats),
            "read_timeouts": self.timeouts.snapshot(),
        }


def _node(candidate: Candidate) -> dict[str, str]:
    return {NODE_HEADER: candidate.node_id}


def _unforwardable(headers: Mapping[str, str]) -> GatewayResponse | None:
    """The client's 400 when a header the gateway forwards cannot be: not printable ASCII
    (HTTP/1.1 allows other bytes, the edges' OIP does not, and the forwarding client can
    only send ASCII), or an ``Inference-Header-Content-Length`` that is no ASCII number."""
    for name, value in headers.items():
        if not (value.isascii() and value.isprintable()):
            shown = value[:80].encode("latin-1", "replace")  # as it came off the wire (ASGI decodes latin-1)
            return _error(400, f"header {name!r} must be printable ASCII, got {shown!r}")
    length = headers.get("inference-header-content-length")
    if length is not None and not length.strip().isdigit():
        return _error(400, f"header {HEADER_LENGTH!r} must be a non-negative integer, got {length[:80]!r}")
    return None


def _header_length(lowered_headers: Mapping[str, str]) -> int | None:
    raw = lowered_headers.get("inference-header-content-length", "")
    return int(raw) if raw.isascii() and raw.isdigit() else None
