"""Who is calling this node's Peer service, and whether it may be who it says.

Under TLS (every TLS fleet's Peer service requires a fleet client certificate) the caller is
the node its certificate names (``fleetwire.peer_identity``: a URI SAN
``spiffe://modelfleet/node/<id>``). A request's ``requester`` is the caller's claim: it must
be that node, or the call is refused (PERMISSION_DENIED, counted, logged); a ``FetchChunk``
must make the claim, so only a node's certificate fetches chunks (central's, an operator's
or a certificate shared by several edges names no node). Without TLS there is no
certificate and nothing to check a claim against: the requester is believed, as before,
and decides nothing but the owner wait (``servicer``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from fleetwire.peer_identity import AmbiguousIdentity, node_of_uris

log = logging.getLogger(__name__)

#: At most one warning line per this many seconds for refused claims (a caller retrying a
#: refused claim in a loop must not flood the log); the line counts those in between.
REFUSAL_LOG_INTERVAL_S = 10.0


class ClaimRefused(Exception):
    """A request claims a node its certificate does not name; the message says which."""


@dataclass(frozen=True)
class Caller:
    """The caller of one request: ``tls`` whether it came over TLS, ``node`` the node its
    certificate names (None: none, or no TLS), ``name`` what the stream caps count it by."""

    tls: bool
    node: str | None
    name: str


def _strings(values: Iterable[bytes] | None) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values or ()]


def caller_of(context: grpc.aio.ServicerContext) -> Caller:
    """The caller of the request in ``context``. ``name``, for the per-node stream cap: the
    certificate's node, else its common name, else (no TLS) the connection's peer address
    (host and port: an edge keeps one channel, with a connection of its own, per peer, so
    edges sharing a host, as ``modelfleet up`` runs them, keep a share each). Never the
    ``requester`` a request names: a caller naming a new one in every call got a new share
    each time. A certificate naming several nodes names none (``node`` is None, and any
    claim is refused)."""
    auth = context.auth_context()
    tls = _strings(auth.get("transport_security_type")) == ["ssl"]
    try:  # URI SANs only (gRPC's "x509_subject_alternative_name" mixes in DNS names)
        node = node_of_uris(_strings(auth.get("peer_uri")))
    except AmbiguousIdentity:
        node = None
    common_names = _strings(auth.get("x509_common_name"))
    name = node or (f"cn:{common_names[0]}" if common_names else context.peer())
    return Caller(tls=tls, node=node, name=name)


class ClaimCheck:
    """Checks a request's claimed node against its caller's certificate; counts and logs
    the refusals."""

    def __init__(self) -> None:
        self.refused = 0
        self._last_line = 0.0
        self._unlogged = 0

    def check(self, caller: Caller, claimed: str, *, required: bool) -> None:
        """Return if ``caller`` may act as ``claimed`` (``required``: the request must
        claim a node under TLS), else count, log and raise ``ClaimRefused``."""
        if not caller.tls or (not claimed and not required) or (claimed and claimed == caller.node):
            return
        if caller.node is None:
            reason = (
                f"the client certificate ({caller.name}) names no node, so it cannot act as node {claimed!r}"
                if claimed
                else f"the client certificate ({caller.name}) names no node: only a node fetches chunks"
            )
        elif not claimed:
            reason = f"the request names no requester; the client certificate is node {caller.node!r}'s"
        else:
            reason = f"the client certificate is node {caller.node!r}'s, but the request claims node {claimed!r}"
        self.refused += 1
        self._log(reason)
        raise ClaimRefused(reason + " (peer certificates are bound to node ids)")

    def _log(self, reason: str) -> None:
        now = time.monotonic()
        if now - self._last_line < REFUSAL_LOG_INTERVAL_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more refused since the last line)" if self._unlogged else ""
        log.warning("peer call refused: %s%s", reason, more)
        self._last_line, self._unlogged = now, 0
