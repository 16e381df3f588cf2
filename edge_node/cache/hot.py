"""A small in-memory LRU of chunks this process verified recently.

While a version rolls out, an owner serves each of its chunks to every other edge,
and then assembles the file from the same chunks. Reading each back from disk and
re-hashing it every time costs more CPU than receiving it did; bytes that were
hashed on arrival and never left memory need neither."""

from __future__ import annotations

import threading
from collections import OrderedDict


class HotChunks:
    """digest → bytes, bounded by total size; safe to use from worker threads."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    def add(self, digest: str, data: bytes) -> None:
        """Remember verified bytes (the oldest go first when full)."""
        if len(data) > self.capacity:
            return
        with self._lock:
            if digest in self._items:
                self._items.move_to_end(digest)
                return
            self._items[digest] = data
            self._bytes += len(data)
            while self._bytes > self.capacity:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old)

    def get(self, digest: str) -> bytes | None:
        """The bytes, or None."""
        with self._lock:
            data = self._items.get(digest)
            if data is not None:
                self._items.move_to_end(digest)
                self.hits += 1
            return data

    def __contains__(self, digest: object) -> bool:
        with self._lock:
            return digest in self._items
