"""What central last sent each node on its watch stream, in a compact form, so that a read
from the origin racing a change is judged against the state the node is still acting on.

A node learns of a change only when its next desired state arrives; until it has applied
that, it may still fetch for the state before. Central has usually sent the new state
already, so the one before stays readable for ``grace_s`` after it was replaced (and at
most ``MAX_REPLACED`` of them): a request that loses the race is served, and a node gains
nothing it was not given a moment ago."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from central.distribution.assignment import VersionAssignment
from fleetwire.manifest import Manifest

VersionKey = tuple[str, str]
#: Replaced states kept per node (a node lagging further behind is refused until it catches up).
MAX_REPLACED = 4


@dataclass(frozen=True)
class SentState:
    """One desired state as sent to one node: its versions, and the chunks it may read (those
    of the versions it serves and those it owns), kept as a set so a check is one lookup."""

    versions: dict[VersionKey, Manifest]
    readable: frozenset[str]

    @classmethod
    def of(cls, node_id: str, versions: Iterable[VersionAssignment]) -> SentState:
        """The record of the state holding ``versions`` sent to ``node_id``."""
        listed = list(versions)
        # Every file of every artifact: an edge may serve any artifact the manifest offers.
        served = {c.digest for v in listed if v.serve or v.stage for c in v.manifest.unique_chunks()}
        owned = {d for v in listed for d, owners in v.placement.items() if node_id in owners}
        return cls(versions={v.manifest.key: v.manifest for v in listed}, readable=frozenset(served | owned))

    def allows_version(self, key: VersionKey) -> bool:
        """Whether the version is in this state (served or held for seeding)."""
        return key in self.versions

    def allows_chunk(self, digest: str) -> bool:
        """Whether the chunk is one this node owns, or one of a version it serves."""
        return digest in self.readable


class SentLog:
    """Per node: the state last sent, and the ones it replaced less than ``grace_s`` ago."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._last: dict[str, SentState] = {}
        self._replaced: dict[str, deque[tuple[float, SentState]]] = {}

    def record(self, node_id: str, sent: SentState) -> None:
        """``sent`` is on its way to ``node_id``; the state it replaces starts its grace."""
        previous = self._last.get(node_id)
        self._last[node_id] = sent
        if previous is not None and previous is not sent:
            self._replaced.setdefault(node_id, deque(maxlen=MAX_REPLACED)).append((time.monotonic(), previous))

    def forget(self, node_id: str, sent: SentState) -> None:
        """The watch that sent ``sent`` ended: drop the node's records unless a newer watch sent since."""
        if self._last.get(node_id) is sent:
            del self._last[node_id]
            self._replaced.pop(node_id, None)

    def _recent(self, node_id: str) -> list[SentState]:
        replaced = self._replaced.get(node_id)
        if replaced is not None:
            horizon = time.monotonic() - self.grace_s
            while replaced and replaced[0][0] < horizon:
                replaced.popleft()
        last = self._last.get(node_id)
        return ([last] if last is not None else []) + [s for _, s in replaced or ()]

    def allows_version(self, node_id: str, key: VersionKey) -> bool:
        """Whether a state recently sent to ``node_id`` holds the version."""
        return any(s.allows_version(key) for s in self._recent(node_id))

    def allows_chunk(self, node_id: str, digest: str) -> bool:
        """Whether a state recently sent to ``node_id`` lets it read the chunk."""
        return any(s.allows_chunk(digest) for s in self._recent(node_id))
