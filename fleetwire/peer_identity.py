"""Which node a fleet certificate belongs to: the names a node's certificate carries, and how
either side of a peer call reads or checks them.

A node's certificate carries its node id twice, in two subject alternative names:

- ``spiffe://modelfleet/node/<id>`` (a URI SAN): the identity. URI SANs are never host
  names, so a node id is never confused with an address a client dials, no wildcard can
  match it, and the path keeps the id exactly (node ids are case-sensitive and may hold
  ``.`` and ``_``, which a DNS name would fold or refuse). A Peer server reads it from
  the client's certificate (gRPC exposes it as ``peer_uri``) and refuses a request whose
  ``requester`` names another node.
- ``<32 hex>.node.modelfleet.invalid`` (a DNS SAN, the first 128 bits of ``sha256(id)``):
  the same id in the only form a gRPC client in Python can check on a *server's*
  certificate. gRPC gives a client no look at the server's certificate, but verifies the
  name in ``grpc.ssl_target_name_override`` against its DNS SANs; a node calling peer X
  sets that to X's name, so a certificate of any other node fails the handshake. The hash
  keeps the name a valid, lower-case DNS label whatever the id (no case folding, no
  ``_``), ``.invalid`` (RFC 2606) keeps it from ever being a real host's name.

Both come from ``node_sans`` (``modelfleet.pki`` puts them in the certificates it issues
with a node id); a certificate without them is a fleet member that is no node (central,
an operator tool), which may not act as one."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = [
    "NODE_DNS_SUFFIX",
    "NODE_URI_PREFIX",
    "AmbiguousIdentity",
    "node_dns_name",
    "node_of_uris",
    "node_sans",
    "node_uri",
    "peer_channel_options",
]

NODE_URI_PREFIX = "spiffe://modelfleet/node/"
NODE_DNS_SUFFIX = ".node.modelfleet.invalid"


class AmbiguousIdentity(ValueError):
    """A certificate naming more than one node: it is no node's."""


def node_uri(node_id: str) -> str:
    """The URI SAN that names ``node_id``."""
    return NODE_URI_PREFIX + node_id


def node_dns_name(node_id: str) -> str:
    """The DNS SAN that names ``node_id`` for a client's host-name check."""
    return hashlib.sha256(node_id.encode("utf-8")).hexdigest()[:32] + NODE_DNS_SUFFIX


def node_sans(node_id: str) -> tuple[str, str]:
    """The URI and DNS subject alternative names of ``node_id``'s certificate."""
    return node_uri(node_id), node_dns_name(node_id)


def node_of_uris(uris: Iterable[str]) -> str | None:
    """The node id the URI SANs of a certificate name, None when they name none;
    ``AmbiguousIdentity`` when they name several."""
    nodes = {uri[len(NODE_URI_PREFIX) :] for uri in uris if uri.startswith(NODE_URI_PREFIX)}
    if len(nodes) > 1:
        raise AmbiguousIdentity(f"the certificate names {len(nodes)} nodes: {', '.join(sorted(nodes))}")
    return next(iter(nodes), None)


def peer_channel_options(node_id: str) -> list[tuple[str, str]]:
    """gRPC channel options that make a TLS handshake succeed only with ``node_id``'s
    certificate (checked instead of the dialled host name: the address came from the
    placement that says which node is there)."""
    return [("grpc.ssl_target_name_override", node_dns_name(node_id))]
