"""Whether a listener is wide open: reachable from beyond this host without authentication
or without TLS. Central and the edges log it at start; ``modelfleet doctor`` reports it.

Everything security-related is off by default so a first fleet on one machine works; the
defaults bind to loopback, so that is safe. Bound to anything else (``0.0.0.0``, ``::``, a
LAN address or a host name) the same defaults expose models, the fleet's state and, without
TLS, every token on the wire: one loud line says so and names the settings that close it."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["TLS_FIX", "Exposure", "Listener", "is_loopback", "warn_if_wide_open", "wide_open"]

#: The settings that turn TLS on, the same section in central and the edges (``fleetwire.tls``).
TLS_FIX = (
    "MODELFLEET_TLS__ENABLED=true with MODELFLEET_TLS__CERT_FILE, MODELFLEET_TLS__KEY_FILE and MODELFLEET_TLS__CA_FILE"
)


@dataclass(frozen=True)
class Listener:
    """One listening socket and what guards it, with the settings that would turn each guard on."""

    name: str
    """What listens, as an operator knows it: "central REST API", "edge e1 Peer gRPC"."""
    host: str
    port: int
    authenticated: bool
    """Callers must prove who they are (a token, or a client certificate)."""
    encrypted: bool
    """TLS."""
    auth_fix: str
    """The setting(s) that require authentication, e.g. ``MODELFLEET_AUTH__ENABLED=true``."""
    tls_fix: str = TLS_FIX
    """The setting(s) that turn TLS on."""


@dataclass(frozen=True)
class Exposure:
    """A wide-open listener: what it lacks and the settings that close it."""

    listener: Listener
    missing: tuple[str, ...]
    fixes: tuple[str, ...]

    @property
    def problem(self) -> str:
        """What is open, in words."""
        host, port = self.listener.host, self.listener.port
        where = f"{host}:{port}" if port else f"{host} (any free port)"
        harm = "anyone who reaches it can call it" if not self.listener.authenticated else "tokens travel in clear"
        lacks = " and without ".join(self.missing)
        return f"{self.listener.name} listens on {where}, beyond this host, without {lacks} ({harm})"

    @property
    def fix(self) -> str:
        """The settings that close it."""
        return f"set {'; '.join(self.fixes)} (or bind it to 127.0.0.1)"

    def __str__(self) -> str:
        return f"WIDE OPEN: {self.problem}; {self.fix}"


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``::1`` (IPv4-mapped too); False for any other
    address, the wildcards ``0.0.0.0`` / ``::`` / empty, and host names (they may resolve anywhere)."""
    text = host.strip().strip("[]").lower()
    if text == "localhost":
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def wide_open(listener: Listener) -> Exposure | None:
    """How ``listener`` is open beyond this host (no authentication, or no TLS); None when it
    listens on loopback only or has both."""
    if is_loopback(listener.host):
        return None
    guards = (
        ("authentication", listener.authenticated, listener.auth_fix),
        ("TLS", listener.encrypted, listener.tls_fix),
    )
    missing = tuple(what for what, on, _ in guards if not on)
    if not missing:
        return None
    fixes = tuple(dict.fromkeys(fix for _, on, fix in guards if not on))  # one setting may close both
    return Exposure(listener, missing, fixes)


def warn_if_wide_open(log: logging.Logger, listeners: Iterable[Listener]) -> None:
    """Log one WARNING line for each of ``listeners`` that is wide open (at start-up)."""
    for listener in listeners:
        if (exposure := wide_open(listener)) is not None:
            log.warning("%s", exposure)
