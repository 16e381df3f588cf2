"""Wires one edge's parts together: cache, fetcher, versions, inference, peer service,
central link and heartbeat. The listeners, signals and shutdown order live in
``edge_node.server``, which binds the ports this object announces."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from edge_node.auth import NodeCredential
from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher, PlacementView
from edge_node.fetch.sources import ChannelPool, OriginClient, PeerClient
from edge_node.generation.service import LanguageModels
from edge_node.generation.shadow import GenerationShadow
from edge_node.heartbeat import HeartbeatPublisher, HeartbeatSources
from edge_node.inference import (
    DataPlane,
    InferLimits,
    LoadTracker,
    ModelRepository,
    SessionFactory,
    available_providers,
)
from edge_node.inference.artifact_timer import ArtifactTimer
from edge_node.inference.hardware import detect_hardware
from edge_node.inference.shadow import ShadowFactory
from edge_node.observability import EdgeStateCollector
from edge_node.peer import PeerServicer
from edge_node.peer.limits import StreamLimiter
from edge_node.settings import EdgeSettings
from edge_node.sync import DesiredStateFollower, ManifestTrust, Materializer
from edge_node.sync.centrals import CentralRotation
from edge_node.sync.chooser import ArtifactChooser
from edge_node.sync.clock import ClockProbe
from edge_node.sync.guard import StateGuard
from edge_node.sync.saved_choices import SavedChoices
from edge_node.sync.saved_partition import SavedPartition
from edge_node.transfer import TransferGovernor
from edge_node.versions import VersionFiles
from fleetwire.names import host_port
from fleetwire.runtime_limits import runtime_limits
from fleetwire.tls import grpc_channel_credentials
from fleetwire.transfer import TransferCaps
from fleetwire.v1 import registry_pb2

#: The version the edge reports in OIP server metadata.
EDGE_VERSION = "0.1.0"


class Edge:
    """One edge node: cache, fetcher, versions, inference, peer service and central link."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.store = ChunkStore(settings.resolved_cache_dir, size_limit=settings.cache_bytes, holder=self.node_id)
        self.files = VersionFiles(settings.data_dir / "versions", rehash_all=settings.versions.rehash_all)
        self.view = PlacementView(settings.site)
        #: The TLS files, read and checked once here for the channels and both listeners.
        self.tls_material = settings.tls.material() if settings.tls.enabled else None
        self.pool = ChannelPool(grpc_channel_credentials(self.tls_material) if self.tls_material is not None else None)
        self.load = LoadTracker()
        #: Chunk byte-rate caps: this node's settings, overridden live by central's desired state.
        self.transfer = TransferGovernor(settings.transfer.caps(), busy=lambda: self.load.inflight > 0)
        peers = PeerClient(self.pool, self.node_id, self.transfer, settings.fetch.max_streams_per_peer)
        token = settings.node_token.get_secret_value() if settings.node_token is not None else None
        self.credential = NodeCredential(token, settings.node_token_file)
        #: The configured centrals and the one in use; the follower moves it, the origin reads it.
        self.centrals = CentralRotation(settings.central_addresses)
        origin = OriginClient(
            self.pool, lambda: self.centrals.current, self.node_id, self.credential, pacer=self.transfer
        )
        self.fetcher = ChunkFetcher(self.node_id, self.store, self.view, peers, origin, settings.fetch)
        factory = self._session_factory(settings)
        inference = settings.inference
        self.repository = ModelRepository(
            factory,
            batching=inference.batching,
            retire_grace_s=inference.retire_grace_s,
            shadows=ShadowFactory(
                inference.shadow_sample, inference.shadow_queue, inference.shadow_cpu_share, text=GenerationShadow.open
            ),
            generation=settings.generation,
        )
        caps = settings.limits
        #: The inference service every transport (REST, KServe v2 gRPC) serves.
        self.plane = DataPlane(
            self.repository,
            version=EDGE_VERSION,
            load=self.load,
            limits=InferLimits(
                max_body_bytes=caps.max_infer_body_bytes,
                max_tensor_elements=caps.max_tensor_elements,
                max_inflight_requests=caps.max_inflight_infer_requests,
            ),
        )
        #: Generation on the plane's language models, for the text APIs (OpenAI-compatible, OIP generate).
        self.language = LanguageModels(self.plane)
        #: ISA flags, cores and provider: nodes of one class share which artifact runs fastest.
        self.hardware_class = str(detect_hardware(factory.providers, inference.cpu_flags, inference.intra_op_threads))
        #: What this node's ONNX Runtime loads (probed, capped by the settings): central is told at
        #: registration and assigns nothing newer.
        self.runtime = runtime_limits().capped(inference.runtime_max_ir, inference.runtime_max_opset)
        self.trust = ManifestTrust(settings.data_dir, repin=settings.manifest_key_repin)
        #: Central's clock offset, measured over the registry link (staged flips use it).
        self.clock = ClockProbe()
        self.materializer = Materializer(
            self.fetcher,
            self.files,
            self.repository,
            trust=self.trust,
            chooser=self._artifact_chooser(settings, factory),
            fail_after_s=settings.fetch.fail_after_s,
            to_local=self.clock.to_local,
        )
        limits = settings.limits
        self.peer_servicer = PeerServicer(
            self.fetcher,
            StreamLimiter(limits.max_peer_streams_per_node, limits.max_peer_streams),
            view_wait_s=settings.fetch.relay_view_wait_s,
            pace=self.transfer.pace_serve,
        )
        self.follower = DesiredStateFollower(
            self.node_info,
            self.centrals,
            self.pool,
            self.view,
            self.materializer,
            settings.reconnect_backoff_max_s,
            trust=self.trust,
            credential=self.credential,
            on_partition=lambda partition: self.heartbeat.use_partition(partition),
            guard=StateGuard(self.node_id, settings.data_dir, self.trust),
            on_limits=self._apply_limits,
            clock=self.clock,
            saved_partition=SavedPartition.in_dir(settings.data_dir),
            runtime=self.runtime,
        )
        #: The ports this node announces; the server sets the bound ones (port 0) before ``start()``.
        self.grpc_port = settings.grpc_port
        self.http_port = settings.http_port
        #: The KServe v2 gRPC inference port (None: off); the server sets the bound one too.
        self.infer_grpc_port = settings.infer_grpc_port
        self._leaving = False
        self._restored = False
        self.heartbeat = HeartbeatPublisher(
            self.node_id,
            settings.heartbeat,
            self._heartbeat_sources().snapshot,
            settings.data_dir,
            broker=settings.broker,
            on_central_online=self.follower.wake,
        )
        self.repository.metrics_registry.register(
            EdgeStateCollector(
                store=self.store,
                fetcher=self.fetcher,
                peer=self.peer_servicer,
                heartbeat=self.heartbeat,
                follower=self.follower,
                materializer=self.materializer,
                repository=self.repository,
                transfer=self.transfer,
            )
        )

    def _apply_limits(self, limits: TransferCaps) -> None:
        """Central's caps for this node where it sets them, this node's settings elsewhere."""
        self.transfer.apply(limits.merged_over(self.settings.transfer.caps()))

    @staticmethod
    def _session_factory(settings: EdgeSettings) -> SessionFactory:
        inference = settings.inference
        providers = available_providers(inference.providers)
        return SessionFactory(
            settings.data_dir / "ort-cache", providers, inference.intra_op_threads, inference.inter_op_threads
        )

    def _artifact_chooser(self, settings: EdgeSettings, factory: SessionFactory) -> ArtifactChooser:
        """Which artifact of each version this node serves: timed here with the sessions'
        own factory, a language model's with the generation engine's settings (unless timing
        is off), remembered in data_dir across restarts."""
        choice = settings.inference.choice
        timer = (
            ArtifactTimer(factory, self.hardware_class, self.node_id, choice, engine=settings.generation)
            if choice.enabled
            else None
        )
        saved = SavedChoices(settings.data_dir / "choices.json")
        return ArtifactChooser(
            self.hardware_class, self.node_id, timer, saved, shadow_sample=settings.inference.shadow_sample
        )

    def _heartbeat_sources(self) -> HeartbeatSources:
        return HeartbeatSources(
            addresses=lambda: (self.grpc_address, self.http_address),
            cache=self.store.stats,
            models=self.repository.models,
            refusals=lambda: self.materializer.refusals,
            failures=self.materializer.failures,
            load=self.load,
            state=lambda: "stopping" if self._leaving else "online",
            choices=lambda: {k: c.info() for k, c in self.materializer.chooser.choices.items()},
            hardware_class=self.hardware_class,
            site=self.settings.site,
            autonomous_since=lambda: self.follower.autonomous_since,
            staged=self.materializer.staged,
            clock=self.clock.heartbeat_fields,
        )

    @property
    def advertise_host(self) -> str:
        """The host other nodes and central use for this node."""
        return self.settings.advertise_host or self.settings.grpc_host

    @property
    def grpc_address(self) -> str:
        """host:port of the Peer service, as announced."""
        return host_port(self.advertise_host, self.grpc_port)

    @property
    def http_address(self) -> str:
        """host:port of the HTTP API, as announced."""
        return host_port(self.settings.advertise_host or self.settings.http_host, self.http_port)

    def node_info(self) -> registry_pb2.NodeInfo:
        """What this node announces when it registers."""
        return registry_pb2.NodeInfo(
            node_id=self.node_id,
            grpc_address=self.grpc_address,
            http_address=self.http_address,
            capacity=self.settings.capacity,
            labels=self.settings.labels,
            site=self.settings.site,
            hardware_class=self.hardware_class,
        )

    def status(self) -> dict[str, Any]:
        """Versions, cache and fetch counters, for the HTTP API and benchmarks."""
        state = self.follower.state
        return {
            "node_id": self.node_id,
            "connected": self.follower.connected.is_set(),
            **self.follower.mode(),
            "site": self.settings.site,
            "ports": {"http": self.http_port, "grpc": self.grpc_port, "infer_grpc": self.infer_grpc_port},
            "generation": state.generation if state else None,
            "desired_state_refusals": dict(self.follower.refusals),
            "central": {**self.centrals.as_dict(), "heartbeat_partition": self.follower.partition},
            "versions": [p.as_dict() for p in self.materializer.progress.values()],
            "hardware_class": self.hardware_class,
            "runtime": self.runtime.as_json(),
            "clock": asdict(self.clock.estimate) if self.clock.estimate is not None else None,
            "loaded": [
                {"name": m.name, "version": m.version, "state": m.state, "switched_at": m.switched_at}
                for m in self.repository.models()
            ],
            "artifacts": {f"{n}:{v}": c.as_json() for (n, v), c in self.materializer.chooser.choices.items()},
            "shadow": self._shadow_status(),
            "cache": asdict(self.store.stats()),
            "fetch": self.fetcher.stats.as_dict(),
            "verification": self.files.verification.as_dict(),
            "peer": {
                "chunks_served": self.peer_servicer.chunks_served,
                "bytes_served": self.peer_servicer.bytes_served,
            },
            "transfer": self.transfer.as_dict(),
        }

    def _shadow_status(self) -> dict[str, dict[str, Any]]:
        """``name:version`` → the served artifact and its agreement with FP32 on live samples,
        for every ready version that is sampled (``edge_node.inference.shadow``)."""
        return {
            f"{m.name}:{m.version}": {"artifact": m.artifact, **info.model_dump()}
            for m in self.repository.models()
            if m.state == "ready" and (info := m.shadow_info) is not None
        }

    def restore(self) -> None:
        """Serve again what the disk holds: the desired state kept there, its versions checked
        and loaded from local files in the background. Needs neither central nor the broker
        nor the listeners, so the server calls it first (a restarted edge loads its models
        while its listeners come up); ``start`` calls it if the server did not. Once only."""
        if not self._restored:
            self._restored = True
            self.follower.restore()

    async def start(self) -> None:
        """Announce this node over MQTT and follow central (the listeners are up by now:
        heartbeats and the registration carry their ports)."""
        self.restore()
        await self.heartbeat.start()
        await self.follower.start()

    async def leave(self, unregister: bool = True) -> None:
        """Leave the fleet: a clean "offline" first (central moves traffic at once), then
        close the link to central (``unregister``: take this node off the placement)."""
        self._leaving = True
        await self.heartbeat.stop()
        await self.follower.stop(unregister=unregister)

    async def stop_work(self) -> None:
        """Stop fetching and assembling versions and release the inference sessions."""
        await self.materializer.stop()
        await self.fetcher.close()
        await self.repository.close()

    async def close(self) -> None:
        """Close the channels and the cache (after the listeners that read them)."""
        await self.pool.close()
        self.store.close()
