"""What edges ask central (the gRPC Registry service): register, unregister, read manifests,
fetch origin chunks and watch their desired state. One method per call; the servicer only
converts protobuf and maps errors to status codes."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from central.auth import NodeGuard
from central.distribution import DesiredStateService
from central.distribution.desired_state import DesiredState
from central.errors import BadRequest, PermissionDenied
from central.membership.nodes import NodeDirectory, NodeRecord
from central.origin import OriginService
from central.registry.service import RegistryService, check_name
from central.registry.signing import ManifestSigner
from central.storage.offload import StoreCalls
from central.storage.protocols import Tokens
from fleetwire.manifest import Manifest
from fleetwire.signing import KeyEndorsement


@dataclass(frozen=True)
class Registration:
    """What a registered edge learns: the manifest key (and its endorsements) and its
    heartbeat partition (``partitions`` 0: the unpartitioned topics)."""

    public_key: bytes
    endorsements: list[KeyEndorsement]
    partitions: int
    partition: int


class EdgeHandlers:
    """The Registry service's use cases."""

    def __init__(
        self,
        *,
        directory: NodeDirectory,
        signer: ManifestSigner,
        desired: DesiredStateService,
        registry: RegistryService,
        origin: OriginService,
        partitions: Callable[[str], tuple[int, int]],
        node_tokens: Tokens | None,
        calls: StoreCalls,
    ) -> None:
        """``partitions(node_id)``: the fleet mode's heartbeat partitions; ``node_tokens``: set
        when ``auth.nodes_required`` (every call then names its node by token); ``calls``: where
        the token look-ups run."""
        self._directory = directory
        self._signer = signer
        self._desired = desired
        self._registry = registry
        self._origin = origin
        self._partitions = partitions
        #: Who is calling, by node token (None: node credentials are not required).
        self.guard = NodeGuard(node_tokens, calls) if node_tokens is not None else None
        self._calls = calls

    async def register(self, record: NodeRecord) -> Registration:
        """Put a node on the ring (again)."""
        await self._directory.admit(record, self._calls)
        partitions, partition = self._partitions(record.node_id)
        return Registration(self._signer.public_key, self._signer.endorsements, partitions, partition)

    async def unregister(self, node_id: str) -> None:
        """Take a node off the ring; its chunks get new owners."""
        await self._directory.release(node_id, self._calls)

    async def manifest(self, caller: str | None, name: str, version: str) -> Manifest:
        """A version's manifest; with credentials only one of the caller's desired state,
        refused before the lookup so that the answer tells nothing about what else is stored."""
        key = (check_name("model name", name), check_name("version", version))
        if caller is not None and not self._desired.allows_version(caller, key):
            raise PermissionDenied(f"{key[0]}:{key[1]} is not in the desired state of node {caller!r}")
        return (await self._registry.get(*key)).manifest

    def chunk(self, digest: str, requester: str, failed: set[str], *, verified: bool) -> AsyncIterator[bytes]:
        """An origin chunk in pieces, metered (``verified``: the requester is the token's node)."""
        return self._origin.stream(digest, requester, failed, verified=verified)

    async def watch(self, node_id: str, since_generation: int) -> AsyncGenerator[DesiredState]:
        """The node's desired state now and after every change, while its stream is open."""
        if not self._directory.stream_opened(node_id):
            raise BadRequest(f"node {node_id!r} is not registered; call Register first")
        try:
            async for state in self._desired.watch(node_id, since_generation):
                yield state
        finally:
            self._directory.stream_closed(node_id)

    def seal(self, payload: bytes) -> bytes:
        """Sign bytes with the manifest key (sealed desired states)."""
        return self._signer.sign_bytes(payload)

    @staticmethod
    def now_us() -> int:
        """Central's clock, for an edge's offset estimate."""
        return time.time_ns() // 1000
