"""Chunk blobs on an S3-compatible object store (``ChunkBlobs``), under ``<prefix>sha256/ab/<digest>``.

Content addressing makes the store simple: a put uploads the bytes under their own digest (one
PUT is atomic on S3, so a crash leaves the whole object or none), and every read checks the
digest again, so an object damaged or replaced in the bucket is never served (``CorruptBlob``).

Garbage collection and a concurrent push on another central sharing the bucket: a blob is
deleted only when its ``LastModified`` is older than ``grace_s``, and a put that finds the blob
already there but older than half the grace period uploads it again, which renews
``LastModified``. So a blob a push has just stored or reused stays at least ``grace_s / 2``
after that put, time enough for the push to commit the version that references it (a push
must commit within that time, which the default of an hour leaves ample room for).

Blocking calls (obstore's synchronous API): async callers run them in a thread."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import obstore
from obstore.store import S3Store

from central.errors import StoreUnavailable
from central.storage.blobs.local import check_digest, verified
from fleetwire.digest import chunk_digest, is_digest

#: How long ``usage()`` answers from its last listing.
USAGE_TTL_S = 60.0


class S3BlobStore:
    """Chunks by sha256 in one bucket under ``prefix``."""

    def __init__(self, store: S3Store, prefix: str = "", grace_s: float = 3600.0) -> None:
        self._store = store
        self._root = f"{prefix.strip('/')}/sha256" if prefix.strip("/") else "sha256"
        self.grace_s = grace_s
        self._usage: tuple[float, tuple[int, int]] | None = None

    @classmethod
    def connect(
        cls,
        *,
        bucket: str,
        endpoint: str | None,
        region: str,
        access_key: str | None,
        secret_key: str | None,
        prefix: str = "",
        grace_s: float = 3600.0,
    ) -> S3BlobStore:
        """A store on ``bucket`` (path-style at ``endpoint`` when one is given, e.g. SeaweedFS or
        MinIO; plain http allowed there); without keys the client's default credential chain."""
        options: dict[str, Any] = {"region": region}
        if access_key is not None and secret_key is not None:
            options |= {"access_key_id": access_key, "secret_access_key": secret_key}
        if endpoint:
            options |= {"endpoint": endpoint, "virtual_hosted_style_request": False}
        allow_http = bool(endpoint and endpoint.startswith("http://"))
        store = S3Store(bucket, client_options={"allow_http": allow_http}, **options)
        return cls(store, prefix, grace_s)

    def key(self, digest: str) -> str:
        """The object key of ``digest``."""
        check_digest(digest)
        return f"{self._root}/{digest[:2]}/{digest}"

    def _head(self, digest: str) -> dict[str, Any] | None:
        try:
            return dict(obstore.head(self._store, self.key(digest)))
        except FileNotFoundError:
            return None

    def _age_s(self, meta: dict[str, Any]) -> float:
        modified: dt.datetime = meta["last_modified"]
        return (dt.datetime.now(dt.UTC) - modified).total_seconds()

    def put(self, data: bytes) -> tuple[str, bool]:
        """Store ``data`` under its own digest; returns (digest, newly stored). An existing blob
        older than half the grace period is uploaded again to renew it against a concurrent GC."""
        digest = chunk_digest(data)
        meta = self._head(digest)
        if meta is not None and (not self.grace_s or self._age_s(meta) < self.grace_s / 2):
            return digest, False
        try:
            obstore.put(self._store, self.key(digest), data)
        except FileNotFoundError as exc:  # S3 answers NoSuchBucket: gone, or not made again yet
            raise StoreUnavailable(f"the chunk bucket is missing on the object store: {exc}".splitlines()[0]) from exc
        self._usage = None
        return digest, meta is None

    def has(self, digest: str) -> bool:
        """True when the blob is stored (one HEAD)."""
        return self._head(digest) is not None

    def read(self, digest: str) -> bytes:
        """The whole blob, checked against its digest."""
        data = bytes(obstore.get(self._store, self.key(digest)).bytes())
        return verified(digest, data)

    def delete(self, digest: str) -> bool:
        """Delete the blob unless its LastModified is within ``grace_s``; True if deleted."""
        meta = self._head(digest)
        if meta is None or self._age_s(meta) < self.grace_s:
            return False
        obstore.delete(self._store, self.key(digest))
        self._usage = None
        return True

    def _objects(self) -> Iterator[dict[str, Any]]:
        for batch in obstore.list(self._store, self._root + "/", chunk_size=1000):
            for meta in batch:
                if is_digest(str(meta["path"]).rsplit("/", 1)[-1]):
                    yield dict(meta)

    def digests(self) -> Iterator[str]:
        """Every stored digest (one LIST per thousand)."""
        for meta in self._objects():
            yield str(meta["path"]).rsplit("/", 1)[-1]

    def usage(self) -> tuple[int, int]:
        """(blobs, bytes) stored, from a listing of the prefix, kept for ``USAGE_TTL_S`` or until
        this store writes or deletes: the
        metrics scrape asks on the event loop, and a bucket listing is many round trips."""
        now = time.monotonic()
        if self._usage is not None and now - self._usage[0] < USAGE_TTL_S:
            return self._usage[1]
        count = size = 0
        for meta in self._objects():
            count += 1
            size += int(meta["size"])
        self._usage = (now, (count, size))
        return count, size

    def remove_temp_files(self) -> int:
        """Nothing to remove: an S3 PUT leaves no partial object."""
        return 0
