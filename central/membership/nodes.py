"""The node directory: registered edges and their open desired-state streams.

A node is a ring member from ``Register`` until it unregisters or its last watch
stream closes. Streams are counted, so an edge that reconnects before central
notices the old stream closing is not dropped from the ring by the stale close.

A replicated central shares the directory through PostgreSQL: ``register`` and
``unregister`` also go to a ``NodeSink`` (the shared store), every replica ``mirror``s what
the store holds, and a closed stream evicts nobody (the edge only moved to another
replica: liveness comes from MQTT and explicit unregister)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from central.placement import PlacementService, RingMember
from central.storage.offload import StoreCalls
from fleetwire.runtime_limits import RuntimeLimits
from fleetwire.transfer import DEFAULT_SITE

log = logging.getLogger(__name__)


@dataclass
class NodeRecord:
    """What an edge announced about itself."""

    node_id: str
    grpc_address: str
    http_address: str
    capacity: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    #: ISA flags, cores and provider (``x86_64/avx2/2c/cpu``); "" from edges that do not say.
    hardware_class: str = ""
    #: Where the node is (``fleetwire.transfer.DEFAULT_SITE`` when it named none).
    site: str = DEFAULT_SITE
    #: What its ONNX Runtime loads, as it said at registration; None from an edge that did not
    #: say (central then assumes its own runtime's limits).
    runtime: RuntimeLimits | None = None
    registered_at: float = field(default_factory=time.time)
    streams: int = 0


class NodeSink(Protocol):
    """Where registrations go besides the directory (a replicated central: the shared store,
    so that every replica sees them; ``central.fleet_mode``)."""

    #: Whether a node's last closing watch stream means it left (False: it only moved to
    #: another replica; liveness comes from MQTT and explicit unregister).
    closing_stream_leaves: bool

    def put(self, record: NodeRecord) -> None:
        """A registration taken here (raises when it could not be shared: nobody registers)."""

    def remove(self, node_id: str) -> None:
        """An explicit unregister taken here."""


class LocalRegistrations:
    """Registrations stay in this process: a node's last closing watch stream means it left."""

    closing_stream_leaves = True

    def put(self, record: NodeRecord) -> None:
        """Nothing to share."""

    def remove(self, node_id: str) -> None:
        """Nothing to share."""


class NodeDirectory:
    """Registered nodes; every membership change re-places chunks and notifies."""

    def __init__(
        self, placement: PlacementService, on_change: Callable[[], None], *, sink: NodeSink | None = None
    ) -> None:
        """``sink``: where registrations go first (``FleetMode.registrations``; by default
        they stay here)."""
        self._placement = placement
        self._on_change = on_change
        self._sink: NodeSink = sink or LocalRegistrations()
        self._nodes: dict[str, NodeRecord] = {}
        # Watch streams of nodes evicted while their stream stayed open (MQTT said dead):
        # their eventual close must not evict the node once it registered again.
        self._orphan_streams: dict[str, int] = {}

    def nodes(self) -> list[NodeRecord]:
        """Registered nodes by id."""
        return [self._nodes[k] for k in sorted(self._nodes)]

    def get(self, node_id: str) -> NodeRecord | None:
        """One node, or None."""
        return self._nodes.get(node_id)

    def hardware_class(self, node_id: str) -> str:
        """The hardware class a node registered with; "" when unknown or not said."""
        node = self._nodes.get(node_id)
        return node.hardware_class if node is not None else ""

    def runtime(self, node_id: str) -> RuntimeLimits | None:
        """What a node's ONNX Runtime loads, as it registered; None when unknown or not said."""
        node = self._nodes.get(node_id)
        return node.runtime if node is not None else None

    def peers(self) -> dict[str, str]:
        """node id → gRPC address of its Peer service."""
        return {n.node_id: n.grpc_address for n in self._nodes.values()}

    def sites(self) -> dict[str, str]:
        """node id → site."""
        return {n.node_id: n.site for n in self._nodes.values()}

    def register(self, record: NodeRecord) -> None:
        """Add or update a node and put it on the ring."""
        self._sink.put(record)  # first: a failed write registers nobody
        self._registered(record)

    async def admit(self, record: NodeRecord, calls: StoreCalls) -> None:
        """``register``, with the sink's write (a replica's, to PostgreSQL) in a store worker:
        an edge's ``Register`` never holds the event loop while the store answers, or does not."""
        await calls(self._sink.put, record)
        self._registered(record)

    def _registered(self, record: NodeRecord) -> None:
        self._apply(record)
        log.info("node %s registered (%s)", record.node_id, record.grpc_address)
        self._on_change()

    def _apply(self, record: NodeRecord) -> None:
        old = self._nodes.get(record.node_id)
        if old is not None:
            record.streams = old.streams
        else:
            record.streams = max(record.streams, self._orphan_streams.pop(record.node_id, 0))
        self._nodes[record.node_id] = record
        self._placement.join(RingMember(record.node_id, max(1, record.capacity), record.site))

    def mirror(self, records: Mapping[str, NodeRecord]) -> bool:
        """Make the directory hold exactly ``records`` (the shared store's ring members, read by a
        replica), without writing back; True when anything changed (then ``on_change`` ran)."""
        changed = False
        for node_id in [n for n in self._nodes if n not in records]:
            changed |= self._drop(node_id)
        for node_id, record in records.items():
            old = self._nodes.get(node_id)
            if old is None or _announced(old) != _announced(record):
                self._apply(record)
                changed = True
        if changed:
            self._on_change()
        return changed

    def unregister(self, node_id: str) -> bool:
        """Remove a node; its chunks get new owners. False if it was unknown."""
        self._sink.remove(node_id)
        return self._left(node_id)

    async def release(self, node_id: str, calls: StoreCalls) -> bool:
        """``unregister``, with the sink's write in a store worker (see ``admit``)."""
        await calls(self._sink.remove, node_id)
        return self._left(node_id)

    def _left(self, node_id: str) -> bool:
        if not self._drop(node_id):
            return False
        log.info("node %s left", node_id)
        self._on_change()
        return True

    def _drop(self, node_id: str) -> bool:
        record = self._nodes.pop(node_id, None)
        if record is None:
            return False
        if record.streams > 0:
            self._orphan_streams[node_id] = record.streams
        self._placement.leave(node_id)
        return True

    def stream_opened(self, node_id: str) -> bool:
        """Count a watch stream; False if the node never registered."""
        node = self._nodes.get(node_id)
        if node is None:
            return False
        node.streams += 1
        return True

    def stream_closed(self, node_id: str) -> None:
        """A watch stream ended; the node leaves when it was its last one."""
        node = self._nodes.get(node_id)
        if node is None:
            left = self._orphan_streams.get(node_id, 0) - 1
            if left > 0:
                self._orphan_streams[node_id] = left
            else:
                self._orphan_streams.pop(node_id, None)
            return
        node.streams -= 1
        if node.streams <= 0 and self._sink.closing_stream_leaves:
            self.unregister(node_id)


def _announced(record: NodeRecord) -> tuple[object, ...]:
    """What a node announced, without this process's stream count and clock."""
    return (
        record.grpc_address,
        record.http_address,
        record.capacity,
        record.labels,
        record.hardware_class,
        record.site,
        record.runtime,
    )
