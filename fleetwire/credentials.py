"""How a node's credential travels on central's gRPC Registry API: gRPC metadata
``authorization: Bearer <token>``, the same form as the operator REST API's header.
No proto field carries it, so an edge without a token and a central that does not
ask for one speak the same messages as before."""

from __future__ import annotations

from collections.abc import Iterable

#: gRPC metadata keys are lower case.
AUTHORIZATION_KEY = "authorization"
_SCHEME = "bearer"


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents ``token``."""
    return ((AUTHORIZATION_KEY, f"Bearer {token}"),)


def bearer_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the first ``authorization: Bearer …`` entry, or None."""
    for key, value in metadata or ():
        if key.lower() != AUTHORIZATION_KEY:
            continue
        return parse_bearer(value.decode("latin-1") if isinstance(value, bytes) else value)
    return None


def parse_bearer(value: str) -> str | None:
    """The token of one ``Bearer <token>`` credential (a gRPC metadata value or an HTTP
    ``Authorization`` header), or None for another scheme or an empty token."""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != _SCHEME:
        return None
    return token.strip() or None
