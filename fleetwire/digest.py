"""Content addresses: every chunk and every model file is named by its sha256."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

#: Size of one ``ChunkData`` message from the origin: small enough for central's token
#: bucket to meter egress smoothly, large enough that per-message cost stays low.
CHUNK_PIECE_BYTES = 256 * 1024
#: Size of one ``ChunkData`` message between peers, which are not metered: per-message
#: overhead in Python gRPC dominates at small sizes, so a ~1 MiB chunk is one or two messages.
PEER_PIECE_BYTES = 1024 * 1024

_DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_READ_BYTES = 1024 * 1024


def chunk_digest(data: bytes | bytearray | memoryview) -> str:
    """Lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def is_digest(value: str) -> bool:
    """True for a well-formed lowercase hex sha256 (64 characters, the whole string: a
    trailing newline is not one)."""
    return _DIGEST_RE.fullmatch(value) is not None


def sha256_file(path: Path) -> str:
    """Hash a file without holding it in memory."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            h.update(block)
    return h.hexdigest()
