"""Registers with central and follows its desired-state stream, reconnecting with
backoff. While central is away the node keeps what it has and keeps serving it.

With several central addresses (``CentralRotation``) a failed attempt moves to the next
one before the backoff wait: when central is unreachable (UNAVAILABLE, or no answer to
Register in time) or a stream that was open breaks. A refused credential does not move
the edge (another central would refuse it too). Each attempt registers again, so an
independent central learns of the node before it streams. The Register reply also says
whether heartbeats go to a partition (a replicated central): ``partition`` remembers it,
``on_partition`` hands it to the heartbeat publisher and ``SavedPartition`` keeps it on disk,
so a node that boots while no replica answers still publishes where the replicas listen.

Every state passes the ``StateGuard`` (central's seal, a generation that does not go back)
and is kept on disk before it is applied; at start the one kept is applied first, so a node
that boots while central is away serves what it served (``restore``). The node is *synced*
while its stream is up and its last state came on it, *autonomous* (since when) otherwise.
``wake`` cuts a backoff wait short: the heartbeat link calls it when central announces
itself on the broker, so a fleet resyncs as soon as central is back, not at its next retry."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterable, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
from tenacity import RetryCallState, retry_if_exception_type, retry_if_result

from edge_node.auth import NodeCredential
from edge_node.fetch import PlacementView
from edge_node.fetch.sources import ChannelPool
from edge_node.sync.centrals import CentralRotation
from edge_node.sync.clock import ClockProbe
from edge_node.sync.guard import StateGuard, StateRefused
from edge_node.sync.materializer import Materializer
from edge_node.sync.saved_partition import PartitionRecord, SavedPartition
from edge_node.sync.state import EdgeDesiredState, state_from_pb
from edge_node.sync.trust import ManifestTrust
from fleetwire.backoff import retrying
from fleetwire.convert import endorsements_from_pb, register_request
from fleetwire.runtime_limits import RuntimeLimits
from fleetwire.transfer import TransferCaps
from fleetwire.v1 import registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)

#: Central knows this node's credential is wrong: retrying will not help until an operator acts.
_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
#: Central is not there (or not answering): another address may be.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
#: The wait before the first reconnect; it doubles per reconnect up to ``backoff_max_s``, jittered.
_FIRST_BACKOFF_S = 0.2


class DesiredStateFollower:
    """The long-running link from an edge to central."""

    def __init__(
        self,
        node: Callable[[], registry_pb2.NodeInfo],
        central: str | CentralRotation,
        pool: ChannelPool,
        view: PlacementView,
        materializer: Materializer,
        backoff_max_s: float = 5.0,
        trust: ManifestTrust | None = None,
        credential: NodeCredential | None = None,
        on_partition: Callable[[int | None], None] | None = None,
        guard: StateGuard | None = None,
        wake_spread_s: float = 1.0,
        on_limits: Callable[[TransferCaps], None] | None = None,
        clock: ClockProbe | None = None,
        saved_partition: SavedPartition | None = None,
        runtime: RuntimeLimits | None = None,
    ) -> None:
        """``on_partition``: called with every Register reply's heartbeat partition (None:
        unpartitioned), on the event loop; it must not block. ``guard``: checks and keeps every
        state (None: states are taken unchecked and not kept). ``wake_spread_s``: a wake-up
        retries after a random wait up to this, so a fleet woken at once spreads its reconnects.
        ``on_limits``: called with every desired state's transfer caps (unset ones: the node's
        own settings). ``clock``: measures central's clock offset while the link is up.
        ``saved_partition``: where the partition of the last Register reply is kept (None: not kept).
        ``runtime``: what this node's ONNX Runtime loads, told to central at every Register (None:
        not told; central then assumes its own runtime)."""
        self.clock = clock or ClockProbe()
        self._on_limits = on_limits
        self._guard = guard
        self._wake_spread_s = wake_spread_s
        self._woken: asyncio.Event | None = None
        #: Since when this node runs on its own (Unix seconds); None while synced.
        self.autonomous_since: float | None = time.time()
        self._node = node
        self.centrals = central if isinstance(central, CentralRotation) else CentralRotation([central])
        """The central addresses and the one this link is on."""
        self._on_partition = on_partition
        #: This node's heartbeat partition from the latest Register reply (None: unpartitioned).
        self.partition: int | None = None
        self._saved_partition = saved_partition
        self._runtime = runtime
        self._partition_record = saved_partition.load() if saved_partition is not None else None
        self._streaming = False  # the current attempt's stream delivered a state
        self._pool = pool
        self._view = view
        self._materializer = materializer
        self._backoff_max_s = backoff_max_s
        self._trust = trust
        self._credential = credential or NodeCredential()
        #: Central's last refusal of this node's credential; None once a Register succeeds.
        self.refusal: str | None = None
        self._task: asyncio.Task[None] | None = None
        self.state: EdgeDesiredState | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        """Begin following in the background."""
        self._task = asyncio.create_task(self._run(), name="desired-state follower")

    async def stop(self, unregister: bool = True) -> None:
        """Stop following; tell central this node leaves on purpose."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if unregister:
            stub = registry_pb2_grpc.RegistryStub(self._pool.get(self.centrals.current))
            try:
                request = registry_pb2.UnregisterRequest(node_id=self._node().node_id)
                await stub.Unregister(request, timeout=2.0, metadata=self._credential.metadata())
            except grpc.aio.AioRpcError as exc:
                log.info("could not unregister: %s", exc.code())

    async def _run(self) -> None:
        """Follow for ever: a stream that fails or ends is opened again after a backoff
        (it does not start over: a link that keeps dropping is retried at the cap)."""
        lost = retry_if_exception_type(grpc.aio.AioRpcError) | retry_if_result(lambda _: True)
        run = retrying(_FIRST_BACKOFF_S, self._backoff_max_s, retry=lost, before_sleep=self._lost, sleep=self._sleep)
        await run(self._follow_once)

    async def _sleep(self, seconds: float) -> None:
        """A backoff wait that ``wake`` ends early."""
        self._woken = asyncio.Event()
        try:
            await asyncio.wait_for(self._woken.wait(), seconds)
        except TimeoutError:
            pass
        finally:
            self._woken = None

    def wake(self) -> None:
        """Retry soon if waiting to reconnect (after a random wait up to ``wake_spread_s``);
        safe to call from the event loop at any time."""
        woken = self._woken
        if woken is None or woken.is_set():
            return
        asyncio.get_running_loop().call_later(random.uniform(0, self._wake_spread_s), woken.set)

    def restore(self) -> bool:
        """Take up the heartbeat partition and apply the state kept on disk, if any passes the
        guard: what a node serves, and where it announces itself, while central is away. True
        when a state was applied."""
        record = self._partition_record
        if record is not None and record.heartbeat_partition is not None:
            log.info(
                "heartbeat partition %d of %d kept on disk, until central answers", record.partition, record.partitions
            )
            self._use_partition(record.heartbeat_partition)
        state = self._guard.restore() if self._guard is not None else None
        if state is None:
            return False
        self.apply(state)
        log.info(
            "serving desired state %d kept on disk (%d versions) until central answers",
            state.generation,
            len(state.versions),
        )
        return True

    @property
    def refusals(self) -> dict[str, int]:
        """Desired states refused, by reason (see ``StateGuard``)."""
        return dict(self._guard.refusals) if self._guard is not None else {}

    def mode(self) -> dict[str, Any]:
        """``synced``, or ``autonomous`` since when (ISO 8601, UTC)."""
        since = self.autonomous_since
        if since is None:
            return {"mode": "synced", "autonomous_since": None}
        return {"mode": "autonomous", "autonomous_since": datetime.fromtimestamp(since, UTC).isoformat()}

    def _lost(self, state: RetryCallState) -> None:
        self.connected.clear()
        if self.autonomous_since is None:
            self.autonomous_since = time.time()
        streamed, self._streaming = self._streaming, False
        exc = state.outcome.exception() if state.outcome is not None else None
        code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
        if code in _UNREACHABLE or (streamed and code not in _REFUSED):
            self.centrals.move(code.name if code is not None else "stream ended")
        if isinstance(exc, grpc.aio.AioRpcError):
            self._log_failure(exc, state.upcoming_sleep)

    def _log_failure(self, exc: grpc.aio.AioRpcError, delay: float) -> None:
        if exc.code() not in _REFUSED:
            log.info("central link lost (%s); retrying in %.1fs on %s", exc.code().name, delay, self.centrals.current)
            return
        refusal = f"{exc.code().name}: {exc.details()}"
        if refusal != self.refusal:  # one error line per refusal, not one per retry
            log.error(
                "central refused this node's credential (%s); set node_token or node_token_file"
                " to a token made with `modelfleet node-token create --node <this node>`; retrying",
                refusal,
            )
        self.refusal = refusal

    async def _follow_once(self) -> None:
        address = self.centrals.current
        stub = registry_pb2_grpc.RegistryStub(self._pool.get(address))
        node = self._node()
        metadata = self._credential.metadata()
        reply = await stub.Register(register_request(node, self._runtime), timeout=5.0, metadata=metadata)
        self.refusal = None
        self._adopt_partition(reply)
        if self._trust is not None:
            self._trust.offer(reply.manifest_public_key, endorsements_from_pb(reply.key_endorsements))
        since = self._guard.generation if self._guard is not None else 0
        request = registry_pb2.WatchRequest(node_id=node.node_id, since_generation=since)
        clock_request = registry_pb2.ClockRequest(node_id=node.node_id)
        clock = asyncio.create_task(
            self.clock.run(lambda: stub.Clock(clock_request, metadata=metadata, timeout=self.clock.timeout_s)),
            name="clock probe",
        )
        try:
            await self._follow_stream(stub.WatchDesiredState(request, metadata=metadata), address)
        finally:
            clock.cancel()

    async def _follow_stream(self, stream: AsyncIterable[registry_pb2.DesiredState], address: str) -> None:
        async for pb in stream:
            if not self._streaming and len(self.centrals.addresses) > 1:
                log.info("following central %s", address)
            self._streaming = True
            try:
                state = self._guard.admit(pb) if self._guard is not None else state_from_pb(pb)
            except StateRefused:
                continue  # logged and counted by the guard; the state held stays
            if self.autonomous_since is not None:
                log.info("synced with central %s at desired state %d", address, state.generation)
            self.autonomous_since = None
            self.connected.set()
            try:
                self.apply(state)
            except Exception:  # a bug acting on one state must not end the link (no state would follow)
                log.exception("could not act on desired state %d; waiting for the next", state.generation)

    def _adopt_partition(self, reply: registry_pb2.RegisterReply) -> None:
        """Remember where central wants this node's heartbeats and pass it on. Every replica
        computes the same partition (crc32 of the node id), so a later Register, on any
        replica, repeats it; a single central says 0 partitions: unpartitioned. A reply that
        differs from the one kept on disk replaces it there."""
        record = PartitionRecord(reply.partitions, reply.heartbeat_partition if reply.partitions > 0 else 0)
        partition = record.heartbeat_partition
        if partition != self.partition:
            log.info("central %s: heartbeat partition %s of %d", self.centrals.current, partition, reply.partitions)
        if record != self._partition_record and self._saved_partition is not None:
            self._saved_partition.save(record)
        self._partition_record = record
        self._use_partition(partition)

    def _use_partition(self, partition: int | None) -> None:
        self.partition = partition
        if self._on_partition is not None:
            self._on_partition(partition)

    def apply(self, state: EdgeDesiredState) -> None:
        """Adopt a new desired state."""
        self.state = state
        self._view.update(state.owners(), state.peers, state.placement_enabled, state.chunk_sizes(), state.peer_sites)
        self._materializer.apply(state)
        if self._on_limits is not None:
            self._on_limits(state.limits)
        log.debug("desired state generation %d: %d versions", state.generation, len(state.versions))
