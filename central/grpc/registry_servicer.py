"""``modelfleet.v1.Registry`` over grpcio aio; each method is one ``EdgeHandlers`` call.

With ``auth.nodes_required`` every method first asks the ``NodeGuard`` who is calling
(its node token) and whether it may act for the node id it names; nothing else runs
before that answer. A node then reads manifests and origin chunks of its own desired state
only (``DesiredStateService.allows_version`` / ``allows_chunk``): PERMISSION_DENIED otherwise."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from central.errors import BadRequest, CentralError
from central.grpc.converters import desired_state_to_pb, node_from_pb
from central.grpc.sealer import SealBatcher
from central.grpc.status import abort
from central.handlers import EdgeHandlers
from fleetwire import names
from fleetwire.convert import endorsements_to_pb, manifest_to_pb
from fleetwire.mqtt.payloads import MAX_CHOICE_NAME
from fleetwire.runtime_limits import HEADROOM, runtime_limits
from fleetwire.transfer import check_site
from fleetwire.v1 import common_pb2, registry_pb2, registry_pb2_grpc

log = logging.getLogger(__name__)


class RegistryServicer(registry_pb2_grpc.RegistryServicer):
    """The Registry service for edges, over ``EdgeHandlers``."""

    def __init__(self, edges: EdgeHandlers) -> None:
        self._edges = edges
        self._guard = edges.guard
        self._sealer = SealBatcher(edges.seal)

    async def _authorize(self, context: grpc.aio.ServicerContext, node_id: str | None) -> str | None:
        """The calling node's id, once it may act as ``node_id`` (None: as any node); None
        when node credentials are not required. Aborts UNAUTHENTICATED / PERMISSION_DENIED."""
        if self._guard is None:
            return None
        try:
            return await self._guard.authorize(context.invocation_metadata(), node_id)
        except CentralError as exc:
            await abort(context, exc)
            raise  # not reached: abort raises

    async def Register(
        self, request: registry_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.RegisterReply:
        node = request.node
        await self._authorize(context, node.node_id)
        if (refusal := _refusal(node) or _runtime_refusal(request)) is not None:
            await abort(context, BadRequest(refusal))
        answer = await self._edges.register(node_from_pb(request))
        return registry_pb2.RegisterReply(
            accepted=True,
            message="registered",
            manifest_public_key=answer.public_key,
            key_endorsements=endorsements_to_pb(answer.endorsements),
            partitions=answer.partitions,
            heartbeat_partition=answer.partition,
        )

    async def Unregister(
        self, request: registry_pb2.UnregisterRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.UnregisterReply:
        await self._authorize(context, request.node_id)
        await self._edges.unregister(request.node_id)
        return registry_pb2.UnregisterReply()

    async def GetManifest(
        self, request: registry_pb2.GetManifestRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.Manifest:
        caller = await self._authorize(context, None)
        try:
            manifest = await self._edges.manifest(caller, request.name, request.version)
        except CentralError as exc:
            await abort(context, exc)
        return manifest_to_pb(manifest)

    async def FetchChunk(
        self, request: registry_pb2.OriginFetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[common_pb2.ChunkData]:
        # With credentials the requester is the token's node; an empty node_id means that node.
        caller = await self._authorize(context, request.node_id or None)
        requester = caller if caller is not None else request.node_id
        try:
            stream = self._edges.chunk(
                request.digest, requester, set(request.failed_owners), verified=caller is not None
            )
            async for piece in stream:
                yield common_pb2.ChunkData(data=piece)
        except CentralError as exc:
            await abort(context, exc)

    async def Clock(
        self, request: registry_pb2.ClockRequest, context: grpc.aio.ServicerContext
    ) -> registry_pb2.ClockReply:
        # Read after the token check, right before the reply: what an edge's round trip brackets
        # should be as close to the reply's departure as it can be.
        await self._authorize(context, request.node_id or None)
        return registry_pb2.ClockReply(now_us=self._edges.now_us())

    async def WatchDesiredState(
        self, request: registry_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[registry_pb2.DesiredState]:
        await self._authorize(context, request.node_id)
        try:  # closed with the call, so the node's stream is counted closed at once
            async with aclosing(self._edges.watch(request.node_id, request.since_generation)) as states:
                async for state in states:
                    await self._authorize(context, request.node_id)  # a token revoked mid-stream gets no more
                    # Sealed with the other streams' states first, converted after: the message
                    # is built only once the batch is signed, and sent at once.
                    sealed = await self._sealer.seal(state, request.node_id)
                    pb = desired_state_to_pb(state)
                    sealed.attach(pb)
                    yield pb
        except CentralError as exc:
            await abort(context, exc)


def _refusal(node: registry_pb2.NodeInfo) -> str | None:
    """What is wrong with a node's announcement, or None."""
    try:
        names.check_name("node id", node.node_id)
        for key, value in node.labels.items():
            names.check_label(key, value)
        if node.site:
            check_site(node.site)
    except (names.InvalidName, ValueError) as exc:
        return str(exc)
    if not node.grpc_address:
        return "a node must announce its gRPC address"
    for kind, address in (("grpc_address", node.grpc_address), ("http_address", node.http_address)):
        if not names.is_address(address):
            return f"{kind} {address[:64]!r} must be host:port (an IPv6 host in brackets)"
    if len(node.hardware_class) > MAX_CHOICE_NAME or not node.hardware_class.isprintable():
        return f"hardware_class must be printable, at most {MAX_CHOICE_NAME} characters"
    return None


#: The most operator domains a registration may name in ``max_opsets``.
MAX_OPSET_DOMAINS = 16
#: The oldest IR version a registration may report (ONNX's first with opset imports).
MIN_REPORTED_IR = 3
#: The highest opset a registration may report for a domain central's runtime does not know.
MAX_OTHER_OPSET = 1000


def _runtime_refusal(request: registry_pb2.RegisterRequest) -> str | None:
    """What is wrong with what a registration says of its runtime, or None."""
    if len(request.runtime) > MAX_CHOICE_NAME or not request.runtime.isprintable():
        return f"runtime must be printable, at most {MAX_CHOICE_NAME} characters"
    if len(request.max_opsets) > MAX_OPSET_DOMAINS:
        return f"max_opsets may name at most {MAX_OPSET_DOMAINS} operator domains"
    for domain in request.max_opsets:
        if len(domain) > MAX_CHOICE_NAME or not domain.isprintable():
            return f"an operator domain in max_opsets must be printable, at most {MAX_CHOICE_NAME} characters"
    return _limits_refusal(request)


def _limits_refusal(request: registry_pb2.RegisterRequest) -> str | None:
    """What is implausible in the reported IR version and opsets, or None. They are the node's
    own word (uint32s), and central names converted artifacts after them and converts for
    them: a value no runtime has is refused rather than converted for."""
    own = runtime_limits()
    # an edge may run a newer ONNX Runtime than central, as far as central's probe looks past its onnx
    top_ir = own.max_ir_version + HEADROOM
    ir = request.max_ir_version  # 0: not reported (an older edge)
    if ir and not MIN_REPORTED_IR <= ir <= top_ir:
        return f"max_ir_version {ir} is out of range: IR versions run from {MIN_REPORTED_IR} to {top_ir}"
    for domain, version in sorted(request.max_opsets.items()):
        known = own.max_opset("" if domain == "ai.onnx" else domain)
        top = known + HEADROOM if known is not None else MAX_OTHER_OPSET
        if not 1 <= version <= top:
            name = domain or "ai.onnx"
            return f"max_opsets[{name!r}] {version} is out of range: opsets of {name} run from 1 to {top}"
    return None
