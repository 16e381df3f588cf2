"""Uploads are streamed to a staging file, hashed on the way, and never held in
memory. The limit is enforced while reading, so an oversized body is cut off at
the limit, not after it has all arrived."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from central.errors import BadRequest, TooLarge


@dataclass
class StagedUpload:
    """A fully received upload in the staging directory."""

    path: Path
    sha256: str
    size: int

    def discard(self) -> None:
        """Delete the staging file."""
        self.path.unlink(missing_ok=True)


class Staging:
    """The staging directory; emptied at start-up, since nothing there is committed."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)

    async def receive(self, body: AsyncIterator[bytes]) -> StagedUpload:
        """Write ``body`` to a new staging file; raises TooLarge past the limit."""
        fd, name = tempfile.mkstemp(dir=self.root, prefix="upload-", suffix=".onnx")
        path = Path(name)
        h = hashlib.sha256()
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                async for block in body:
                    size += len(block)
                    if size > self.limit:
                        raise TooLarge(f"upload exceeds the limit of {self.limit} bytes")
                    h.update(block)
                    f.write(block)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        if size == 0:
            path.unlink(missing_ok=True)
            raise BadRequest("the upload is empty")
        return StagedUpload(path=path, sha256=h.hexdigest(), size=size)
