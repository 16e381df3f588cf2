"""The edge process: Peer gRPC server, HTTP API and the desired-state follower on
one event loop, around one ``Edge`` object. Owns start-up order and shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import asdict
from typing import Any

import grpc
import uvicorn

from edge_node.auth import NodeCredential
from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher, PlacementView
from edge_node.fetch.sources import CHANNEL_OPTIONS, ChannelPool, OriginClient, PeerClient
from edge_node.heartbeat import HeartbeatPublisher, LoadTracker, edge_snapshot
from edge_node.http.app import create_app
from edge_node.inference import ModelRepository, SessionFactory, available_providers
from edge_node.observability import EdgeStateCollector
from edge_node.peer import PeerServicer
from edge_node.peer.limits import StreamLimiter
from edge_node.settings import EdgeSettings
from edge_node.sync import DesiredStateFollower, ManifestTrust, Materializer
from edge_node.versions import VersionFiles
from fleetwire.exposure import warn_if_wide_open
from fleetwire.tls import (
    grpc_channel_credentials,
    grpc_server_credentials,
    uvicorn_ssl_kwargs,
    wait_http_stopped,
)
from fleetwire.v1 import peer_pb2_grpc, registry_pb2

log = logging.getLogger(__name__)


class Edge:
    """One edge node: cache, fetcher, versions, peer service and central link."""

    def __init__(self, settings: EdgeSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.store = ChunkStore(settings.resolved_cache_dir, size_limit=settings.cache_bytes, holder=self.node_id)
        self.files = VersionFiles(settings.data_dir / "versions")
        self.view = PlacementView()
        #: The TLS files, read and checked once here for the channels and both listeners.
        self._tls = settings.tls.material() if settings.tls.enabled else None
        self.pool = ChannelPool(grpc_channel_credentials(self._tls) if self._tls is not None else None)
        peers = PeerClient(self.pool, self.node_id)
        token = settings.node_token.get_secret_value() if settings.node_token is not None else None
        self.credential = NodeCredential(token, settings.node_token_file)
        origin = OriginClient(self.pool, settings.central, self.node_id, self.credential)
        self.fetcher = ChunkFetcher(self.node_id, self.store, self.view, peers, origin, settings.fetch)
        inference = settings.inference
        providers = available_providers(inference.providers)
        factory = SessionFactory(
            settings.data_dir / "ort-cache", providers, inference.intra_op_threads, inference.inter_op_threads
        )
        self.repository = ModelRepository(factory, batching=inference.batching, retire_grace_s=inference.retire_grace_s)
        self.trust = ManifestTrust(settings.data_dir, repin=settings.manifest_key_repin)
        self.materializer = Materializer(
            self.fetcher,
            self.files,
            on_complete=self.repository.load,
            on_dropped=self.repository.unload,
            trust=self.trust,
        )
        limits = settings.limits
        self.peer_servicer = PeerServicer(
            self.fetcher,
            StreamLimiter(limits.max_peer_streams_per_node, limits.max_peer_streams),
            view_wait_s=settings.fetch.relay_view_wait_s,
        )
        self.follower = DesiredStateFollower(
            self.node_info,
            settings.central,
            self.pool,
            self.view,
            self.materializer,
            settings.reconnect_backoff_max_s,
            trust=self.trust,
            credential=self.credential,
        )
        self._grpc: grpc.aio.Server | None = None
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self.grpc_port = settings.grpc_port
        self.http_port = settings.http_port
        self._stopped = False
        self.load = LoadTracker()
        self.heartbeat = HeartbeatPublisher(
            self.node_id,
            settings.heartbeat,
            edge_snapshot(self, self.load, lambda: "stopping" if self._stopped else "online"),
            settings.data_dir,
        )
        self.repository.metrics_registry.register(EdgeStateCollector(self))

    @property
    def advertise_host(self) -> str:
        """The host other nodes and central use for this node."""
        return self.settings.advertise_host or self.settings.grpc_host

    def node_info(self) -> registry_pb2.NodeInfo:
        """What this node announces when it registers."""
        host = self.advertise_host
        return registry_pb2.NodeInfo(
            node_id=self.node_id,
            grpc_address=f"{host}:{self.grpc_port}",
            http_address=f"{self.settings.advertise_host or self.settings.http_host}:{self.http_port}",
            capacity=self.settings.capacity,
            labels=self.settings.labels,
        )

    def status(self) -> dict[str, Any]:
        """Versions, cache and fetch counters, for the HTTP API and benchmarks."""
        state = self.follower.state
        return {
            "node_id": self.node_id,
            "connected": self.follower.connected.is_set(),
            "generation": state.generation if state else None,
            "versions": [p.as_dict() for p in self.materializer.progress.values()],
            "cache": asdict(self.store.stats()),
            "fetch": self.fetcher.stats.as_dict(),
            "peer": {
                "chunks_served": self.peer_servicer.chunks_served,
                "bytes_served": self.peer_servicer.bytes_served,
            },
        }

    async def start(self) -> None:
        """Listen first (so peers can reach us once central lists us), then follow central."""
        self._grpc = grpc.aio.server(options=CHANNEL_OPTIONS)
        peer_pb2_grpc.add_PeerServicer_to_server(self.peer_servicer, self._grpc)
        address = f"{self.settings.grpc_host}:{self.settings.grpc_port}"
        if self._tls is not None:  # peers are mutual: a caller without a fleet certificate is refused
            creds = grpc_server_credentials(self._tls, require_client_cert=True)
            self.grpc_port = self._grpc.add_secure_port(address, creds)
        else:
            self.grpc_port = self._grpc.add_insecure_port(address)
        await self._grpc.start()
        await self._start_http()
        await self.heartbeat.start()  # after the listeners: heartbeats carry their ports
        await self.follower.start()
        log.info("edge %s up: peer %s:%d, http %d", self.node_id, self.advertise_host, self.grpc_port, self.http_port)
        warn_if_wide_open(log, self.settings.listeners(http_port=self.http_port, grpc_port=self.grpc_port))

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP API (``https`` with ``tls.enabled``)."""
        scheme = "https" if self.settings.tls.enabled else "http"
        return f"{scheme}://{self.settings.http_host}:{self.http_port}"

    async def _start_http(self) -> None:
        config = uvicorn.Config(
            create_app(self),
            host=self.settings.http_host,
            port=self.settings.http_port,
            log_level="warning",
            lifespan="off",
            **(
                uvicorn_ssl_kwargs(self._tls, require_client_cert=self.settings.tls.require_client_cert)
                if self._tls is not None
                else {}
            ),
        )
        self._http = uvicorn.Server(config)
        self._http_task = asyncio.create_task(self._http.serve())
        while not self._http.started:
            if self._http_task.done():
                self._http_task.result()
                raise RuntimeError("edge HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        self.http_port = self._http.servers[0].sockets[0].getsockname()[1]

    async def stop(self, unregister: bool = True) -> None:
        """Leave the fleet, stop work and close listeners and the cache (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        await self.heartbeat.stop()  # a clean "offline" first: central moves traffic at once
        await self.follower.stop(unregister=unregister)
        if self._grpc is not None:  # first, so no peer request starts a fetch after this
            await self._grpc.stop(grace=0.5)
        await self.materializer.stop()
        await self.fetcher.close()
        await self.repository.close()
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            await wait_http_stopped(self._http, self._http_task)
        await self.pool.close()
        self.store.close()


async def serve(settings: EdgeSettings) -> None:
    """Run an edge until SIGINT or SIGTERM."""
    edge = Edge(settings)
    await edge.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # One write: print() writes the text and its newline separately, and a log line from
    # another thread (stderr, often the same file) landing between them hid the ready line.
    sys.stdout.write(f"edge {edge.node_id} ready http={edge.http_url} grpc={edge.advertise_host}:{edge.grpc_port}\n")
    sys.stdout.flush()
    await stop.wait()
    await edge.stop()
