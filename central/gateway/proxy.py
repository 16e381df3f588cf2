"""Forwarding OIP v2 inference requests to edges, with retries on other nodes.

Bodies are bytes end to end: the route reads the client's body once (size-limited),
and the same bytes go to every attempt; a node's response is read fully into memory
(OIP inference responses are small) and passed back as is (status, body bytes and the
headers that carry meaning: ``content-type``, ``Inference-Header-Content-Length``,
``Retry-After``), never decoded and re-encoded. Nothing is streamed, so a retry can
always resend the whole request, and a client never sees half a response.

Per attempt, in the router's order (one overall deadline across attempts, at most
``attempts`` nodes tried):

- connection error, timeout or a 5xx (503 included) from the node: a failure for that
  node's breaker, then the next candidate. Inference has no side effects, so resending
  a request a node may have run is safe;
- a 4xx other than 404: the answer to the client (bad input stays bad on any node),
  passed through at once; the node is healthy, so it counts as a success for its breaker;
- a 404 (the node does not serve that model or version): the node's entry in the
  ``NodeSource`` is stale (it unloaded the model, or is shutting down and has retired
  its models but still answers HTTP), so the next candidate is tried; the node is
  healthy (breaker success). When every node tried answered 404 that 404 is the answer;
- 2xx/3xx: passed through, a success.

When no node can serve (none reports the model ready, every breaker is open, or every
attempt failed) the gateway answers 503 ``{"error": "no node can serve model 'm'
(version 'v'): <last reason>"}``, with the node's ``Retry-After`` when the last failure
carried one. Every proxied answer carries ``X-Modelfleet-Node`` (the node that gave it)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx
import orjson

from central.gateway.candidates import Candidate
from central.gateway.rolling import RollingStats
from central.gateway.router import GatewayRouter

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
_REASON_CHARS = 300


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
    unavailable: int = 0
    """503s the gateway answered itself (no node could serve)."""
    too_large: int = 0
    """Requests refused with 413."""
    overloaded: int = 0
    """Requests refused with 503 because ``max_outstanding`` requests were in progress."""


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> GatewayResponse:
    return GatewayResponse(
        status, {"content-type": "application/json", **(headers or {})}, orjson.dumps({"error": message})
    )


def _node_error(response: httpx.Response) -> str:
    """The ``error`` of a node's error body, or the start of the body."""
    try:
        doc = orjson.loads(response.content)
        text = str(doc["error"]) if isinstance(doc, dict) and "error" in doc else response.text
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        text = response.content[:_REASON_CHARS].decode(errors="replace")
    return text[:_REASON_CHARS]


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({text})"
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return f"timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {text}"[:_REASON_CHARS]


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
        read_timeout_s: float = 5.0,
        max_body_bytes: int = 64 * 1024 * 1024,
        max_connections: int = 1024,
        max_outstanding: int = 256,
        keepalive_expiry_s: float = 4.0,
        transport: httpx.AsyncBaseTransport | None = None,
        scheme: str = "http",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.router = router
        self.attempts = attempts
        self.deadline_s = deadline_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_body_bytes = max_body_bytes
        #: Requests the routes may hold at once, and how many they hold now.
        self.max_outstanding = max_outstanding
        self.outstanding = 0
        #: "https" when edges serve HTTPS (central's ``tls.edge_https``); ``ssl_context`` verifies them.
        self.scheme = scheme
        self.stats = GatewayStats()
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

    async def close(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()

    @contextmanager
    def holding(self) -> Iterator[GatewayResponse | None]:
        """One of the ``max_outstanding`` places, held while the block runs. Yields None, or
        the gateway's own 503 (Retry-After) when every place is taken: then nothing is held."""
        if self.outstanding >= self.max_outstanding:
            self.stats.overloaded += 1
            message = (
                f"the gateway holds {self.outstanding} requests (gateway.max_outstanding={self.max_outstanding});"
                " retry shortly"
            )
            yield _error(503, message, {"Retry-After": "1"})
            return
        self.outstanding += 1
        try:
            yield None
        finally:
            self.outstanding -= 1

    def _unavailable(self, model: str, version: str | None, reason: str, retry_after: str | None) -> GatewayResponse:
        self.stats.unavailable += 1
        what = f"model {model!r}" + (f" (version {version!r})" if version is not None else "")
        return _error(503, f"no node can serve {what}: {reason}", {"Retry-After": retry_after} if retry_after else None)

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
        candidates = self.router.order(model, version, key)
        if not candidates:
            return self._unavailable(model, version, self._no_candidates_reason(model, version), None)
        lowered = {k.lower(): v for k, v in headers.items()}
        sent_headers = {k: lowered[k] for k in _FORWARDED_REQUEST_HEADERS if k in lowered}
        path = infer_path(model, version)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        tried = 0
        reason = "every candidate node was being probed by another request"
        retry_after: str | None = None
        all_not_found: tuple[Candidate, httpx.Response] | None = None  # while every answer was 404
        for candidate in candidates:
            if tried >= self.attempts:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                reason = f"deadline of {self.deadline_s:g}s exceeded; last: {reason}"
                break
            if not self.router.breaker(candidate.node_id).allow():  # half-open, its one trial taken
                continue
            if tried:
                self.stats.retries += 1
            tried += 1
            self.stats.attempts += 1
            outcome = await self._attempt(candidate, path, request_body, sent_headers, remaining)
            retry_after = None
            if isinstance(outcome, httpx.Response):
                status = outcome.status_code
                if status < 500 and status != 404:
                    return self._pass_through(candidate, outcome)
                reason = f"node {candidate.node_id} answered {status}: {_node_error(outcome)}"
                if status == 404:
                    if tried == 1:
                        all_not_found = (candidate, outcome)
                    log.info("gateway: %s; trying the next node", reason)
                    continue
                retry_after = outcome.headers.get("retry-after")
            else:
                reason = f"node {candidate.node_id} at {candidate.http_address}: {outcome}"
            all_not_found = None
            self.stats.node_failures += 1
            log.info("gateway: %s", reason)
        if all_not_found is not None:
            return self._pass_through(*all_not_found)
        return self._unavailable(model, version, reason, retry_after)

    async def _attempt(
        self, candidate: Candidate, path: str, body: bytes, headers: dict[str, str], remaining: float
    ) -> httpx.Response | str:
        """One request to one node, its outcome recorded in the node's breaker: the
        response, or why there is none."""
        node = candidate.node_id
        breaker = self.router.breaker(node)
        timeout = httpx.Timeout(
            min(self.read_timeout_s, remaining), connect=min(self.connect_timeout_s, remaining), pool=remaining
        )
        self.router.acquire(node)
        try:
            async with asyncio.timeout(remaining):
                response = await self._client.post(
                    f"{self.scheme}://{candidate.http_address}{path}", content=body, headers=headers, timeout=timeout
                )
        except httpx.PoolTimeout:
            breaker.release()  # the gateway's pool was exhausted: says nothing about the node
            return "no free connection in the gateway's pool before the deadline"
        except (httpx.RequestError, httpx.InvalidURL, TimeoutError) as exc:
            why = _describe(exc)
            breaker.record_failure(why)
            return why
        except BaseException:
            breaker.release()  # cancelled: nothing learnt about the node
            raise
        finally:
            self.router.release(node)
        if response.status_code >= 500:
            breaker.record_failure(f"answered {response.status_code}: {_node_error(response)}")
        else:
            breaker.record_success()
        return response

    def _pass_through(self, candidate: Candidate, response: httpx.Response) -> GatewayResponse:
        headers = {out: response.headers[k] for k, out in _PASSED_RESPONSE_HEADERS.items() if k in response.headers}
        headers[NODE_HEADER] = candidate.node_id
        return GatewayResponse(response.status_code, headers, response.content)

    def snapshot(self) -> dict[str, Any]:
        """Router state, settings and counters, for the status endpoint."""
        return {
            **self.router.snapshot(),
            "attempts": self.attempts,
            "deadline_s": self.deadline_s,
            "stats": asdict(self.stats),
        }
