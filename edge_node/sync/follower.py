"""Registers with central and follows its desired-state stream, reconnecting with
backoff. While central is away the node keeps what it has and keeps serving it.

With several central addresses (``CentralRotation``) a failed attempt moves to the next
one before the backoff wait: when central is unreachable (UNAVAILABLE, or no answer to
Register in time) or a stream that was open breaks. A refused credential does not move
the edge (another central would refuse it too). Each attempt registers again, so an
independent central learns of the node before it streams. The Register reply also says
whether heartbeats go to a partition (a replicated central): ``partition`` remembers it and
``on_partition`` hands it to the heartbeat publisher."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc
from tenacity import RetryCallState, retry_if_exception_type, retry_if_result

from edge_node.auth import NodeCredential
from edge_node.fetch import PlacementView
from edge_node.fetch.sources import ChannelPool
from edge_node.sync.centrals import CentralRotation
from edge_node.sync.materializer import Materializer
from edge_node.sync.state import EdgeDesiredState, state_from_pb
from edge_node.sync.trust import ManifestTrust
from fleetwire.backoff import retrying
from fleetwire.convert import endorsements_from_pb
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
        on_limits: Callable[[TransferCaps], None] | None = None,
    ) -> None:
        """``on_partition``: called with every Register reply's heartbeat partition (None:
        unpartitioned), on the event loop; it must not block. ``on_limits``: called with
        every desired state's transfer caps (unset ones: the node's own settings)."""
        self._on_limits = on_limits
        self._node = node
        self.centrals = central if isinstance(central, CentralRotation) else CentralRotation([central])
        """The central addresses and the one this link is on."""
        self._on_partition = on_partition
        #: This node's heartbeat partition from the latest Register reply (None: unpartitioned).
        self.partition: int | None = None
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
        await retrying(_FIRST_BACKOFF_S, self._backoff_max_s, retry=lost, before_sleep=self._lost)(self._follow_once)

    def _lost(self, state: RetryCallState) -> None:
        self.connected.clear()
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
        reply = await stub.Register(registry_pb2.RegisterRequest(node=node), timeout=5.0, metadata=metadata)
        self.refusal = None
        self._adopt_partition(reply)
        if self._trust is not None:
            self._trust.offer(reply.manifest_public_key, endorsements_from_pb(reply.key_endorsements))
        stream = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id=node.node_id), metadata=metadata)
        async for pb in stream:
            if not self._streaming and len(self.centrals.addresses) > 1:
                log.info("following central %s", address)
            self._streaming = True
            self.connected.set()
            self.apply(state_from_pb(pb))

    def _adopt_partition(self, reply: registry_pb2.RegisterReply) -> None:
        """Remember where central wants this node's heartbeats and pass it on. Every replica
        computes the same partition (crc32 of the node id), so a later Register, on any
        replica, repeats it; a single central says 0 partitions: unpartitioned."""
        partition = reply.heartbeat_partition if reply.partitions > 0 else None
        if partition != self.partition:
            log.info("central %s: heartbeat partition %s of %d", self.centrals.current, partition, reply.partitions)
        self.partition = partition
        if self._on_partition is not None:
            self._on_partition(partition)

    def apply(self, state: EdgeDesiredState) -> None:
        """Adopt a new desired state."""
        self.state = state
        self._view.update(state.owners(), state.peers, state.placement_enabled, state.chunk_sizes())
        self._materializer.apply(state)
        if self._on_limits is not None:
            self._on_limits(state.limits)
        log.debug("desired state generation %d: %d versions", state.generation, len(state.versions))
