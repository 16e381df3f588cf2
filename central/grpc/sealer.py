"""Seals the desired states the watch streams send, many nodes under one signature.

A change wakes every node's stream, and each used to sign its node's seal: about 25 µs of
Ed25519 plus the seal's encoding per node, about 0.3 s of central's CPU per change at 10,000
nodes (``bench._ha_seal``). Now each stream hands its node's state to the ``SealBatcher`` and
waits; within ``SEAL_WINDOW_S`` of the first state waiting, the batcher encodes every waiting
node's seal, builds a Merkle tree over them and signs its root once
(``fleetwire.sealing.SignedTree``). Each stream then builds its message with its node's seal,
audit path and that one signature.

The streams of one change wake in the same pass of the event loop (``DesiredStateService``
notifies its condition once), and each computes its node's state and hands it over before
the window's timer can fire: one change is one batch. A lone state (a node joining or
reconnecting) waits out the window and costs one signature, as before; ``MAX_BATCH`` bounds a
tree.

The seal's bytes are no longer re-encoded from scratch per node: ``SealEncoder`` joins
serialized pieces (the node id; generation and clock; each version; caps and placement),
each cached, since thousands of nodes share the same versions and caps. Protobuf parses a
concatenation of serialized messages as their merge, and fields in field order are what
``SerializeToString`` writes itself, so the bytes are those ``fleetwire.sealing.seal_of``
would give for the same state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from central.distribution.desired_state import DesiredState
from fleetwire.manifest import Manifest
from fleetwire.sealing import SignedTree
from fleetwire.transfer import caps_to_pb
from fleetwire.v1 import registry_pb2

#: How long the first waiting state waits for others to share its signature (seconds).
SEAL_WINDOW_S = 0.02
#: The most seals under one signature; a fuller batch is signed at once.
MAX_BATCH = 65_536
#: Entries per piece cache before it starts over (bounds memory under node and version churn).
_CACHE_ENTRIES = 1 << 17

_K = TypeVar("_K")
_VersionKey = tuple[str | tuple[str, str], bool, str, bool, int, str]


class SealEncoder:
    """A node's serialized ``DesiredSeal`` from central's ``DesiredState``, from cached pieces."""

    def __init__(self) -> None:
        self._nodes: dict[str, bytes] = {}
        self._heads: dict[int, bytes] = {}  # generation → piece, at ``_heads_at`` only
        self._heads_at = -1
        self._versions: dict[_VersionKey, bytes] = {}
        self._tails: dict[tuple[int | None, int | None, int | None, bool], bytes] = {}

    def seal(self, state: DesiredState, node_id: str, issued_at_ms: int) -> bytes:
        """The seal of ``state`` for ``node_id``, as ``seal_of(desired_state_to_pb(state), ...)`` encodes it."""
        if issued_at_ms != self._heads_at:  # a new batch: the old clock is in no seal again
            self._heads.clear()
            self._heads_at = issued_at_ms
        generation, caps, placement = state.generation, state.limits, state.placement_enabled
        tail_key = (caps.serve_bytes_per_s, caps.fetch_bytes_per_s, caps.busy_serve_bytes_per_s, placement)
        parts = [
            self._nodes.get(node_id) or _put(self._nodes, node_id, _piece(node_id=node_id)),
            self._heads.get(generation)
            or _put(self._heads, generation, _piece(generation=generation, issued_at_ms=issued_at_ms)),
        ]
        pieces = self._versions
        for v in state.versions:  # inline: this loop is most of a seal's cost
            m = v.manifest
            key = (
                # The signature covers name, version and content; an unsigned manifest has none.
                m.signature or (m.name, m.version),
                v.serve,
                v.verdict.artifact if v.verdict is not None else "",
                v.stage,
                round(v.serve_at * 1000) if v.serve_at is not None else 0,  # as desired_state_to_pb rounds it
                v.force_artifact or "",
            )
            parts.append(pieces.get(key) or _put(pieces, key, _version_piece(m, key)))
        parts.append(
            self._tails.get(tail_key)
            or _put(self._tails, tail_key, _piece(limits=caps_to_pb(caps), placement_enabled=placement))
        )
        return b"".join(parts)


def _piece(**fields: Any) -> bytes:
    """A ``DesiredSeal`` of only ``fields``, serialized: one piece of a seal."""
    return registry_pb2.DesiredSeal(**fields).SerializeToString()


def _version_piece(m: Manifest, key: _VersionKey) -> bytes:
    """One version's entry of ``DesiredSeal.versions``, serialized."""
    _, serve, artifact, stage, serve_at_ms, force_artifact = key
    sealed = registry_pb2.SealedVersion(
        name=m.name,
        version=m.version,
        manifest_signature=bytes.fromhex(m.signature),
        serve=serve,
        artifact=artifact,
        stage=stage,
        serve_at_ms=serve_at_ms,
        force_artifact=force_artifact,
    )
    return _piece(versions=[sealed])


def _put(cache: dict[_K, bytes], key: _K, value: bytes) -> bytes:
    if len(cache) >= _CACHE_ENTRIES:
        cache.clear()
    cache[key] = value
    return value


def seal_batch(
    encoder: SealEncoder,
    batch: Sequence[tuple[DesiredState, str]],
    issued_at_ms: int,
    sign: Callable[[bytes], bytes],
) -> tuple[list[bytes], SignedTree]:
    """Every ``(state, node_id)``'s seal, and the signed tree over them (leaf i: ``batch[i]``)."""
    seals = [encoder.seal(state, node_id, issued_at_ms) for state, node_id in batch]
    return seals, SignedTree.over(seals, sign)


@dataclass(frozen=True)
class Sealed:
    """One node's seal, its place in the tree it was signed in, and that tree."""

    seal: bytes
    index: int
    tree: SignedTree

    def attach(self, pb: registry_pb2.DesiredState) -> None:
        """Set the seal and its proof on ``pb``, the state's message."""
        self.tree.attach(pb, self.index, self.seal)


class SealBatcher:
    """Seals states for the streams that wait in ``seal``, one signature per window."""

    def __init__(
        self, sign: Callable[[bytes], bytes], window_s: float = SEAL_WINDOW_S, max_batch: int = MAX_BATCH
    ) -> None:
        """``sign``: the manifest key's raw Ed25519 signing, read at each batch (a rotated key signs the next)."""
        self._sign = sign
        self._window_s = window_s
        self._max_batch = max_batch
        self._encoder = SealEncoder()
        self._waiting: list[tuple[DesiredState, str, asyncio.Future[Sealed]]] = []
        self._timer: asyncio.TimerHandle | None = None
        #: Signatures made so far (one per batch).
        self.signatures = 0

    async def seal(self, state: DesiredState, node_id: str) -> Sealed:
        """``state``'s seal for ``node_id``, once the batch it joined is signed."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sealed] = loop.create_future()
        self._waiting.append((state, node_id, future))
        if len(self._waiting) >= self._max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._window_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiting = [w for w in self._waiting if not w[2].done()]  # a stream closed meanwhile: no leaf
        self._waiting = []
        if not waiting:
            return
        try:
            seals, signed = seal_batch(
                self._encoder, [(s, n) for s, n, _ in waiting], int(time.time() * 1000), self._sign
            )
        except Exception as exc:  # every waiting stream fails with it, none waits forever
            for *_, future in waiting:
                future.set_exception(exc)
            return
        self.signatures += 1
        for index, ((*_, future), seal) in enumerate(zip(waiting, seals, strict=True)):
            future.set_result(Sealed(seal, index, signed))
