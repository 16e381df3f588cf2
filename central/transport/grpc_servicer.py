"""``modelfleet.v1.Registry`` over grpcio aio; each method is a call on ``Central``.

With ``auth.nodes_required`` every method first asks the ``NodeGuard`` who is calling
(its node token) and whether it may act for the node id it names; nothing else runs
before that answer. A node then reads manifests and origin chunks of its own desired state
only (``DesiredStateService.allows_version`` / ``allows_chunk``): PERMISSION_DENIED otherwise."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import grpc

from central.auth import NodeGuard
from central.core import Central
from central.errors import BadRequest, CentralError, PermissionDenied
from central.registry.service import check_name
from central.transport.converters import desired_state_to_pb, node_from_pb
from fleetwire import names
from fleetwire.convert import endorsements_to_pb, manifest_to_pb
from fleetwire.mqtt.payloads import MAX_CHOICE_NAME
from fleetwire.mqtt.topics import partition_of
from fleetwire.sealing import seal_state
from fleetwire.transfer import check_site
from fleetwire.v1 import common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)


#: Status details travel in a trailer (8 KiB limit by default); a message echoing a huge
#: client-sent id would turn the clear status into the client's RESOURCE_EXHAUSTED.
_MAX_DETAILS = 1000


async def _abort(context: grpc.aio.ServicerContext, exc: CentralError) -> None:
    message = exc.message if len(exc.message) <= _MAX_DETAILS else exc.message[:_MAX_DETAILS] + "…"
    await context.abort(exc.grpc_code, message)


class RegistryServicer(registry_pb2_grpc.RegistryServicer):
    """The Registry service for edges."""

    def __init__(self, central: Central) -> None:
        self._central = central
        # Central opens the node tokens when ``auth.nodes_required`` (a file, or PostgreSQL with store.url).
        self._guard = NodeGuard(central.node_tokens) if central.node_tokens is not None else None

    async def _authorize(self, context: grpc.aio.ServicerContext, node_id: str | None) -> str | None:
        """The calling node's id, once it may act as ``node_id`` (None: as any node); None
        when node credentials are not required. Aborts UNAUTHENTICATED / PERMISSION_DENIED."""
        if self._guard is None:
            return None
        try:
            return self._guard.authorize(context.invocation_metadata(), node_id)
        except CentralError as exc:
            await _abort(context, exc)
            raise  # not reached: abort raises

    async def Register(
        self, request: registry_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RegisterReply:
        node = request.node
        await self._authorize(context, node.node_id)
        try:
            names.check_name("node id", node.node_id)
            for key, value in node.labels.items():
                names.check_label(key, value)
            if node.site:
                check_site(node.site)
        except (names.InvalidName, ValueError) as exc:
            await _abort(context, BadRequest(str(exc)))
        if not node.grpc_address:
            await _abort(context, BadRequest("a node must announce its gRPC address"))
        if len(node.hardware_class) > MAX_CHOICE_NAME or not node.hardware_class.isprintable():
            await _abort(context, BadRequest(f"hardware_class must be printable, at most {MAX_CHOICE_NAME} characters"))
        self._central.nodes.register(node_from_pb(node))
        signer = self._central.signer
        partitions, partition = self._partition_of(node.node_id)
        return registry_pb2.RegisterReply(
            accepted=True,
            message="registered",
            manifest_public_key=signer.public_key,
            key_endorsements=endorsements_to_pb(signer.endorsements),
            partitions=partitions,
            heartbeat_partition=partition,
        )

    def _partition_of(self, node_id: str) -> tuple[int, int]:
        """``(partitions, this node's partition)`` under a replicated central, else ``(0, 0)``
        (the edge keeps the unpartitioned topics). Every replica computes the same answer, so
        an edge that registers again elsewhere keeps its topics."""
        ha = self._central.settings.ha
        if ha.replica_id is None:
            return 0, 0
        return ha.partitions, partition_of(node_id, ha.partitions)

    async def Unregister(
        self, request: registry_pb2.UnregisterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.UnregisterReply:
        await self._authorize(context, request.node_id)
        self._central.nodes.unregister(request.node_id)
        return registry_pb2.UnregisterReply()

    async def GetManifest(
        self, request: registry_pb2.GetManifestRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Manifest:
        # With credentials: only a version of the caller's desired state, refused before the
        # lookup so that the answer tells nothing about what else central stores.
        caller = await self._authorize(context, None)
        try:
            key = (check_name("model name", request.name), check_name("version", request.version))
            if caller is not None and not self._central.desired.allows_version(caller, key):
                raise PermissionDenied(f"{key[0]}:{key[1]} is not in the desired state of node {caller!r}")
            record = self._central.registry.get(*key)
        except CentralError as exc:
            await _abort(context, exc)
        return manifest_to_pb(record.manifest)

    async def FetchChunk(
        self, request: registry_pb2.OriginFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.ChunkData]:
        # With credentials the requester is the token's node; an empty node_id means that node.
        caller = await self._authorize(context, request.node_id or None)
        requester = caller if caller is not None else request.node_id
        try:
            failed = set(request.failed_owners)
            stream = self._central.origin.stream(request.digest, requester, failed, verified=caller is not None)
            async for piece in stream:
                yield common_pb2.ChunkData(data=piece)
        except CentralError as exc:
            await _abort(context, exc)

    async def Clock(
        self, request: registry_pb2.ClockRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ClockReply:
        # Read after the token check, right before the reply: what an edge's round trip brackets
        # should be as close to the reply's departure as it can be.
        await self._authorize(context, request.node_id or None)
        return registry_pb2.ClockReply(now_us=time.time_ns() // 1000)

    async def WatchDesiredState(
        self, request: registry_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[registry_pb2.DesiredState]:
        await self._authorize(context, request.node_id)
        nodes = self._central.nodes
        if not nodes.stream_opened(request.node_id):
            await _abort(context, BadRequest(f"node {request.node_id!r} is not registered; call Register first"))
        try:
            signer = self._central.signer
            async for state in self._central.desired.watch(request.node_id, request.since_generation):
                await self._authorize(context, request.node_id)  # a token revoked mid-stream gets no more
                pb = desired_state_to_pb(state)
                seal_state(pb, request.node_id, int(time.time() * 1000), signer.sign_bytes)
                yield pb
        finally:
            nodes.stream_closed(request.node_id)
