"""Content addresses: every chunk and every model file is named by its sha256."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: Size of one ``ChunkData`` message on the wire. 64 KiB keeps gRPC messages far
#: below the 4 MiB default limit and lets a token bucket meter egress smoothly.
CHUNK_PIECE_BYTES = 64 * 1024

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
_READ_BYTES = 1024 * 1024


def chunk_digest(data: bytes | bytearray | memoryview) -> str:
    """Lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def is_digest(value: str) -> bool:
    """True for a well-formed lowercase hex sha256 (64 characters)."""
    return bool(_DIGEST_RE.match(value))


def sha256_file(path: Path) -> str:
    """Hash a file without holding it in memory."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            h.update(block)
    return h.hexdigest()
