"""What one attempt to reach a node told the gateway, and whether the request may be sent
to another node.

The rule is the one of Envoy's ``retry_on: connect-failure,refused-stream`` and a 503 from
an upstream that did no work: a request goes to another node only when the first one
never ran it (or cannot be running it: a node down). A request that was sent and then
timed out, or that the node answered, has cost that node its work; sending it again would
double the load of a slow model, or carry a request that kills nodes ("query of death")
across the fleet.

- ``UNSENT``: no connection, or the body could not be written: the node never ran it.
- ``RESET``: the connection closed after the request was sent, before any answer. Most
  often a keep-alive connection the node closed as the request went out (a node stopping,
  an idle timeout), which ran nothing; but a request that crashes a node looks the same,
  so the gateway sends it to one more node at most.
- ``TIMEOUT``: no answer within the read timeout; the node may still be running it,
  unless it is down, which a liveness probe tells (``central.gateway.probe``).
- ``POOL``: the gateway's own connection pool had no free connection: says nothing of the node."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import httpx
import orjson

_REASON_CHARS = 300


class FailureKind(enum.Enum):
    """How an attempt failed without an answer (see the module doc)."""

    UNSENT = "unsent"
    RESET = "reset"
    TIMEOUT = "timeout"
    POOL = "pool"


@dataclass(frozen=True)
class Failure:
    """An attempt that got no answer: how, and why in words."""

    kind: FailureKind
    reason: str


_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.WriteError, httpx.WriteTimeout, httpx.UnsupportedProtocol)


def failure_of(exc: Exception) -> Failure:
    """The failure an exception of ``httpx`` (or the attempt's own deadline) stands for."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.PoolTimeout):
        return Failure(FailureKind.POOL, "no free connection in the gateway's pool before the deadline")
    if isinstance(exc, httpx.ConnectError):
        return Failure(FailureKind.UNSENT, f"cannot connect ({text})"[:_REASON_CHARS])
    if isinstance(exc, (*_UNSENT, httpx.InvalidURL)):
        return Failure(FailureKind.UNSENT, f"{type(exc).__name__}: {text}"[:_REASON_CHARS])
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return Failure(FailureKind.TIMEOUT, f"timed out ({type(exc).__name__})")
    return Failure(FailureKind.RESET, f"{type(exc).__name__}: {text}"[:_REASON_CHARS])


def node_error(response: httpx.Response) -> str:
    """The ``error`` of a node's error body, or the start of the body."""
    try:
        doc = orjson.loads(response.content)
        text = str(doc["error"]) if isinstance(doc, dict) and "error" in doc else response.text
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        text = response.content[:_REASON_CHARS].decode(errors="replace")
    return text[:_REASON_CHARS]
