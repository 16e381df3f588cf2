"""Byte-rate caps of an edge's chunk traffic, and the site a node lives in: the parts of the
wire contract that central and edges both read.

A cap of ``None`` leaves the edge's own setting in force; ``0`` means no cap. Central sends
the caps in every desired state (``TransferLimits``), so an operator changes them live."""

from __future__ import annotations

from dataclasses import dataclass

from fleetwire.names import is_name
from fleetwire.v1 import registry_pb2

#: The site of a node that names none.
DEFAULT_SITE = "default"


def site_or_default(site: str) -> str:
    """``site``, or ``DEFAULT_SITE`` for an empty one (what an older edge sends)."""
    return site or DEFAULT_SITE


def check_site(site: str) -> str:
    """``site`` when it is a valid name (the same rule as model names); ValueError otherwise."""
    if not is_name(site):
        raise ValueError(f"site {site!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return site


@dataclass(frozen=True)
class TransferCaps:
    """Bytes/s caps; None: the edge's own setting, 0: no cap."""

    serve_bytes_per_s: int | None = None
    fetch_bytes_per_s: int | None = None
    busy_serve_bytes_per_s: int | None = None

    def merged_over(self, base: TransferCaps) -> TransferCaps:
        """These caps where set, ``base``'s elsewhere."""
        return TransferCaps(
            serve_bytes_per_s=_first(self.serve_bytes_per_s, base.serve_bytes_per_s),
            fetch_bytes_per_s=_first(self.fetch_bytes_per_s, base.fetch_bytes_per_s),
            busy_serve_bytes_per_s=_first(self.busy_serve_bytes_per_s, base.busy_serve_bytes_per_s),
        )

    def as_dict(self) -> dict[str, int | None]:
        """JSON-friendly form."""
        return {
            "serve_bytes_per_s": self.serve_bytes_per_s,
            "fetch_bytes_per_s": self.fetch_bytes_per_s,
            "busy_serve_bytes_per_s": self.busy_serve_bytes_per_s,
        }


def _first(value: int | None, fallback: int | None) -> int | None:
    return value if value is not None else fallback


def caps_to_pb(caps: TransferCaps) -> registry_pb2.TransferLimits:
    """The wire form (unset fields stay unset)."""
    pb = registry_pb2.TransferLimits()
    if caps.serve_bytes_per_s is not None:
        pb.serve_bytes_per_s = caps.serve_bytes_per_s
    if caps.fetch_bytes_per_s is not None:
        pb.fetch_bytes_per_s = caps.fetch_bytes_per_s
    if caps.busy_serve_bytes_per_s is not None:
        pb.busy_serve_bytes_per_s = caps.busy_serve_bytes_per_s
    return pb


def caps_from_pb(pb: registry_pb2.TransferLimits) -> TransferCaps:
    """The inverse of ``caps_to_pb``."""
    return TransferCaps(
        serve_bytes_per_s=pb.serve_bytes_per_s if pb.HasField("serve_bytes_per_s") else None,
        fetch_bytes_per_s=pb.fetch_bytes_per_s if pb.HasField("fetch_bytes_per_s") else None,
        busy_serve_bytes_per_s=pb.busy_serve_bytes_per_s if pb.HasField("busy_serve_bytes_per_s") else None,
    )
