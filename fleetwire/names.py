"""Model names and version labels become directory names on every edge, so they are
restricted to a portable, path-safe alphabet. Node ids follow the same rule (they are
MQTT topic levels and file names too).

Every check here matches the *whole* string (``re.fullmatch``): with ``re.match`` a
pattern ending in ``$`` also accepts a trailing newline (``$`` matches just before one),
which let ``?version=v1%0a`` through."""

from __future__ import annotations

import re

_NAME_BODY = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
#: Letters, digits, ``.``, ``_`` and ``-``; starts with a letter or digit; 1 to 128 characters.
#: Anchored for JSON Schema and OpenAPI, where ``$`` is the end of the input; Python code
#: checks with ``is_name`` / ``check_name`` (a full match), never ``re.match(NAME_PATTERN)``.
NAME_PATTERN = rf"^{_NAME_BODY}$"
_NAME_RE = re.compile(_NAME_BODY)
#: Most characters in a label's key or value.
MAX_LABEL_CHARS = 256


class InvalidName(ValueError):
    """A model name, version label, node id or label that cannot be used."""


def is_name(value: str) -> bool:
    """Whether ``value`` is a valid name (the whole string, no trailing newline)."""
    return _NAME_RE.fullmatch(value) is not None and ".." not in value


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid model name or version label, else raise.

    ``kind`` ("model name", "version") only makes the message precise.
    """
    if not value:
        raise InvalidName(f"{kind} must not be empty")
    if len(value) > 128:
        raise InvalidName(f"{kind} is {len(value)} characters long; the limit is 128")
    if "/" in value or "\\" in value:
        raise InvalidName(f"{kind} {value!r} must not contain a path separator")
    if ".." in value:
        raise InvalidName(f"{kind} {value!r} must not contain '..'")
    if not is_name(value):
        raise InvalidName(
            f"{kind} {value!r} may only use letters, digits, '.', '_' and '-', and must start with a letter or digit"
        )
    return value


def _has_control(text: str) -> bool:
    # Cc: C0/C1 controls (newline, carriage return, escape…); plus the Unicode line breaks.
    return any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ch in "\u2028\u2029" for ch in text)


def check_label(key: str, value: str) -> tuple[str, str]:
    """Return ``(key, value)`` if usable as a label (free text: shown in the dashboard and
    the CLI, matched by rollout selectors), else raise: the key must not be empty, neither
    may hold a control character or line break (no forged log or table lines) or exceed
    ``MAX_LABEL_CHARS``."""
    if not key:
        raise InvalidName(f"label key must not be empty (value {value[:40]!r})")
    for part, text in (("key", key), ("value", value)):
        if len(text) > MAX_LABEL_CHARS:
            raise InvalidName(f"label {part} {text[:40]!r}… is {len(text)} characters; the limit is {MAX_LABEL_CHARS}")
        if _has_control(text):
            raise InvalidName(f"label {part} {text!r} must not contain a control character or line break")
    return key, value


_ADDRESS_BODY = r"(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9][A-Za-z0-9._-]{0,252}):[0-9]{1,5}"
#: ``host:port`` a node announces (an IPv6 host in brackets, ``[::1]:8081``), or empty (none):
#: nothing else, so no path, query, user or scheme a URL built from it could carry. Anchored for
#: JSON Schema; Python checks with ``is_address`` (a full match).
ADDRESS_PATTERN = rf"^(?:{_ADDRESS_BODY})?$"
_ADDRESS_RE = re.compile(_ADDRESS_BODY)
#: Most characters in an address (a 253-character host name, a colon, five digits).
MAX_ADDRESS_CHARS = 259


def is_address(value: str, *, empty: bool = True) -> bool:
    """Whether ``value`` is ``host:port`` (port 0 to 65535), or empty when ``empty`` allows it."""
    if not value:
        return empty
    return _ADDRESS_RE.fullmatch(value) is not None and int(value.rsplit(":", 1)[1]) <= 65535


def host_port(host: str, port: int) -> str:
    """``host:port`` as ``is_address`` takes it: an IPv6 host goes in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
