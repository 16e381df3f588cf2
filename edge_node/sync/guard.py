"""Which desired states this edge accepts, and the last one it accepted, kept on disk.

Every state, from central's stream or from disk at boot, must carry central's seal
(``fleetwire.sealing``), verified with the pinned manifest key and made for this node, and
its generation must not go back: a state older than the one held is refused, and so is a
different state under the same generation. Refusals are counted by reason (``refusals``);
the state held stays in force.

An accepted state is written to ``<data_dir>/desired-state.pb`` (atomically, fsynced) before
the node acts on it. That file is what lets a node that restarts while central is away serve
its last good versions at once (``restore``), and it is the generation's high-water mark
across restarts: the file itself is checked like any state, so a tampered one is refused."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from typing import NoReturn

from google.protobuf.message import DecodeError

from edge_node.sync.state import EdgeDesiredState, state_from_pb
from edge_node.sync.trust import ManifestTrust
from fleetwire.sealing import SealError, open_seal
from fleetwire.signing import write_atomic
from fleetwire.v1 import registry_pb2

log = logging.getLogger(__name__)

#: The last accepted desired state, as central sent it (serialized ``DesiredState``).
STATE_FILE = "desired-state.pb"


class StateRefused(Exception):
    """A desired state this node must not act on; ``reason`` is its counter's key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StateGuard:
    """Checks every desired state against the pinned key and the generation held, and keeps
    the last accepted one in ``data_dir``."""

    def __init__(self, node_id: str, data_dir: Path, trust: ManifestTrust) -> None:
        self._node_id = node_id
        self._path = data_dir / STATE_FILE
        self._trust = trust
        self._held: bytes | None = None  # the seal of the state held
        #: The generation of the state held (0: none yet).
        self.generation = 0
        #: When central issued the state held (Unix seconds; None: none held).
        self.issued_at: float | None = None
        #: Refused states by reason (unsigned, signature, proof, node, generation, content, unreadable).
        self.refusals: Counter[str] = Counter()

    def admit(self, pb: registry_pb2.DesiredState) -> EdgeDesiredState:
        """``pb`` as the node's new desired state, written to disk; StateRefused when it must not be."""
        seal = self._check(pb, "central")
        state = state_from_pb(pb)
        if pb.seal != self._held:  # the state held again (a reconnect) is on disk already
            try:
                write_atomic(self._path, pb.SerializeToString(), 0o600)
            except OSError as exc:  # a full disk: act on it anyway; a restart falls back to the older file
                # a warning: on a full disk the version that cannot be written is the one ERROR to read
                log.warning("cannot keep desired state %d in %s: %s", pb.generation, self._path, exc)
        self._hold(pb, seal)
        return state

    def restore(self) -> EdgeDesiredState | None:
        """The state kept on disk, checked like any other; None when there is none or it is refused."""
        try:
            pb = self._read()
            if pb is None:
                return None
            seal = self._check(pb, str(self._path))
        except StateRefused:
            return None
        self._hold(pb, seal)
        return state_from_pb(pb)

    def _read(self) -> registry_pb2.DesiredState | None:
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._refuse("unreadable", f"cannot read {self._path}: {exc}")
        try:
            return registry_pb2.DesiredState.FromString(raw)
        except DecodeError:
            self._refuse("unreadable", f"{self._path} does not hold a desired state")

    def _check(self, pb: registry_pb2.DesiredState, source: str) -> registry_pb2.DesiredSeal:
        """The opened seal of ``pb``; StateRefused (counted) when ``pb`` must not be acted on."""
        key = self._trust.pinned
        if key is None:
            self._refuse("signature", f"desired state {pb.generation} from {source}: no manifest key pinned yet")
        try:
            seal = open_seal(pb, self._node_id, key)
        except SealError as exc:
            self._refuse(exc.reason, f"desired state from {source}: {exc}")
        if pb.generation < self.generation:
            self._refuse(
                "generation",
                f"desired state {pb.generation} from {source} is older than the one held ({self.generation})",
            )
        if pb.generation == self.generation and pb.seal != self._held:
            self._refuse("generation", f"desired state {pb.generation} from {source} differs from the one held")
        return seal

    def _refuse(self, reason: str, message: str) -> NoReturn:
        self.refusals[reason] += 1
        log.error("refusing %s", message)
        raise StateRefused(reason, message)

    def _hold(self, pb: registry_pb2.DesiredState, seal: registry_pb2.DesiredSeal) -> None:
        self.generation = pb.generation
        self._held = pb.seal
        self.issued_at = seal.issued_at_ms / 1000 if seal.issued_at_ms else time.time()
