"""Wires central's services together. Transports get this one object."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from central.auth.tokens import open_token_store
from central.dashboard import DashboardService, DashboardSources
from central.distribution import DesiredStateService, VerdictBook
from central.distribution.transfer_policy import TransferPolicy
from central.gateway import Candidate, create_gateway
from central.ha.view import SharedNodeSource
from central.membership import NodeDirectory
from central.membership.event_journal import EventJournal, JournalDB
from central.membership.events import EventLog
from central.membership.failover import FailoverCoordinator
from central.membership.mqtt_consumer import MembershipConsumer, make_tracker
from central.membership.tracker import MembershipTracker
from central.observability import CentralMetrics, CentralStateCollector
from central.origin import OriginService, TokenBucket
from central.placement import PlacementService
from central.quantize import GuardStep, QuantizeStep
from central.registry.blobs import BlobStore, ChunkBlobs
from central.registry.chunker import Chunker
from central.registry.pipeline import ChunkStep, ManifestStep, PushPipeline, PushStep, ValidateStep
from central.registry.service import RegistryService
from central.registry.signing import ManifestSigner
from central.registry.staging import Staging
from central.registry.stores import open_metadata_store
from central.rollout import DirectoryFleet, RolloutBook, RolloutController, RolloutService
from central.rollout.drift import DriftWatch
from central.rollout.flip import FlipRules
from central.rollout.previewer import RolloutPreviewer
from central.rollout.store import open_rollout_store
from central.settings import BlobSettings, CentralSettings
from fleetwire.manifest import Manifest
from fleetwire.mqtt.payloads import Event
from fleetwire.tls import client_ssl_context

if TYPE_CHECKING:  # psycopg (the [postgres] extra) only where a replica is configured
    from central.ha.replica import Replica


class TrackerNodeSource:
    """Gateway candidates: alive nodes whose last heartbeat lists the model ready."""

    def __init__(self, tracker: MembershipTracker) -> None:
        self._tracker = tracker

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """Node id and HTTP address of every node that can serve ``model`` (``version``)."""
        return [Candidate(n, a) for n, a in self._tracker.ready_endpoints(model, version) if a]


def open_blobs(settings: BlobSettings, root: Path) -> ChunkBlobs:
    """The chunk store the settings name: an S3 bucket, or the directory ``root``."""
    if settings.bucket is None:
        return BlobStore(root)
    from central.registry.s3blobs import S3BlobStore  # obstore only where S3 is configured

    return S3BlobStore.connect(
        bucket=settings.bucket,
        endpoint=settings.s3_endpoint,
        region=settings.region,
        access_key=settings.access_key.get_secret_value() if settings.access_key else None,
        secret_key=settings.secret_key.get_secret_value() if settings.secret_key else None,
        prefix=settings.prefix,
        grace_s=settings.gc_grace_s,
    )


class Central:
    """The registry, placement, node directory, desired state and origin of one central."""

    def __init__(self, settings: CentralSettings) -> None:
        self.settings = settings
        self._refresh_pending = False
        self._closed = False
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        self._fresh = not (data / "registry.sqlite3").exists()
        self.blobs = open_blobs(settings.blobs, data / "blobs")
        self.blobs.remove_temp_files()
        self.staging = Staging(data / "staging", settings.max_upload_bytes, settings.min_free_disk_bytes)
        self.store = open_metadata_store(settings.store, data / "registry.sqlite3")
        #: This process as one replica of a replicated central (``ha.replica_id``), else None.
        self.replica = self._replica(settings)
        self.signer = self._signer(settings, data)
        self.signer.sign_stored(self.store)
        p = settings.placement
        self.placement = PlacementService(
            replicas=p.replicas, load_factor=p.load_factor, enabled=p.enabled, site_aware=p.site_aware
        )
        steps: list[PushStep] = [
            ValidateStep(),
            QuantizeStep(settings.quantize),
            *([GuardStep()] if settings.quantize.enabled else []),
            ChunkStep(Chunker(settings.chunking), self.blobs),
            ManifestStep(self.signer),
        ]
        pipeline = PushPipeline(steps)
        self.registry = RegistryService(self.store, self.blobs, pipeline, on_change=self._changed_here)
        self.registry.remove_orphan_blobs()
        self.nodes = NodeDirectory(self.placement, on_change=self._changed, sink=self.replica)
        m = settings.mqtt
        self.events = self._event_log(settings)
        self.membership = make_tracker(m, events=self.events)
        # A replica's ring follows the shared liveness instead (central.ha.replica).
        self.failover = FailoverCoordinator(self.membership, self.nodes) if m.enabled and self.replica is None else None
        self.mqtt = MembershipConsumer(m, self.membership, broker=settings.broker) if m.enabled else None
        tls = settings.tls
        #: The TLS files, read and checked once here for the gateway's client and both listeners.
        self.tls_material = material = tls.material() if tls.enabled else None
        self.gateway = create_gateway(
            TrackerNodeSource(self.membership) if self.replica is None else SharedNodeSource(self.replica.view),
            settings.gateway,
            scheme=tls.edge_scheme,
            ssl_context=client_ssl_context(material) if material is not None and tls.edge_scheme == "https" else None,
            catalog=self.registry.describe,
        )
        self.rollouts = self._rollout_service(settings)
        a, s = settings.auth, settings.store
        #: The REST API's operator tokens (``auth.enabled``) and the gRPC Registry's node tokens
        #: (``auth.nodes_required``): files in the data dir, or PostgreSQL with ``store.url``.
        self.operator_tokens = (
            open_token_store(s.url, a.tokens_path(data), "operator", connect_timeout_s=s.connect_timeout_s)
            if a.enabled
            else None
        )
        self.node_tokens = (
            open_token_store(s.url, a.node_tokens_path(data), "node", connect_timeout_s=s.connect_timeout_s)
            if a.nodes_required
            else None
        )
        #: Which artifact each hardware class serves, as the first node of the class timed it.
        self.verdicts = VerdictBook(self.nodes.hardware_class, on_new=self._changed_here)
        self._verdicts_unsubscribe = self.membership.watch_heartbeats(self.verdicts.harvest)
        #: INT8 against FP32 on live traffic, as edges report it; fallbacks per the version's policy.
        self.drift = DriftWatch(
            self._manifest_of,
            emit=self.membership.record_event,
            on_change=self._changed_here,
            roll_back=self.rollouts.roll_back_version,
        )
        self.rollouts.forced = self.drift.forced
        self._drift_unsubscribe = self.membership.watch_heartbeats(self.drift.harvest)
        #: Edges' chunk byte-rate caps (``PUT /api/v1/transfer`` replaces them live).
        self.transfer = TransferPolicy(settings.transfer, self._site_of, on_change=self._changed)
        self.desired = DesiredStateService(
            self.placement,
            self.rollouts.active_versions,
            self.nodes.peers,
            serving=self.rollouts.serving,
            grace_s=settings.origin.replaced_state_grace_s,
            verdicts=self.verdicts,
            hardware_class=self.nodes.hardware_class,
            peer_sites=self.nodes.sites,
            limits=self.transfer.caps_for,
            holding=self.rollouts.holding,
        )
        bucket = TokenBucket(settings.origin.egress_bytes_s)
        origin = settings.origin
        self.origin = OriginService(
            self.blobs,
            self.placement,
            bucket,
            origin.max_concurrent_streams,
            origin.max_waiting_streams,
            entitled=self.desired.allows_chunk,
        )
        self.dashboard = DashboardService(self._dashboard_sources(settings))
        self.metrics = CentralMetrics(self._state_collector(), self.gateway, self.membership)
        if self.replica is not None:
            from central.ha.replica import ReplicaParts

            self.replica.attach(
                ReplicaParts(
                    nodes=self.nodes,
                    tracker=self.membership,
                    consumer=self.mqtt,
                    placement=self.placement,
                    book=self._rollout_book,
                    controller=self._rollout_controller,
                    changed=self._changed,
                )
            )

    @staticmethod
    def _replica(settings: CentralSettings) -> Replica | None:
        if settings.ha.replica_id is None:
            return None
        from central.ha.replica import Replica  # psycopg: the [postgres] extra

        return Replica(settings)

    def _signer(self, settings: CentralSettings, data: Path) -> ManifestSigner:
        """The manifest key: this data dir's, or on a replica the one all replicas share."""
        if self.replica is None:
            return ManifestSigner.load_or_create(data)
        from central.ha.shared_files import share_signing_key

        with self.replica.fleet.connection() as conn:
            return share_signing_key(conn, data)

    def _dashboard_sources(self, settings: CentralSettings) -> DashboardSources:
        return DashboardSources(
            membership=self.membership,
            nodes=self.nodes,
            registry=self.registry,
            placement=self.placement,
            desired=self.desired,
            origin=self.origin,
            gateway=self.gateway,
            gateway_enabled=settings.gateway.enabled,
            mqtt_enabled=self.mqtt is not None,
            shared=self.replica.view if self.replica is not None else None,
            replicas=self.replicas if self.replica is not None else None,
        )

    def _state_collector(self) -> CentralStateCollector:
        return CentralStateCollector(
            membership=self.membership,
            nodes=self.nodes,
            failover=self.failover,
            placement=self.placement,
            desired=self.desired,
            registry=self.registry,
            blobs=self.blobs,
            origin=self.origin,
            gateway=self.gateway,
            rollouts=self.rollouts,
            replica=self.replica.health if self.replica is not None else None,
        )

    @staticmethod
    def _event_log(settings: CentralSettings) -> EventLog:
        """The event log, restored from ``events.sqlite3`` (or PostgreSQL with ``store.url``) and journaled
        there (unless ``events.persist`` is off)."""
        e = settings.events
        kept = e.kept
        journal = None
        if e.persist:
            target: Path | JournalDB = settings.data_dir / "events.sqlite3"
            if settings.store.url is not None:
                from central.membership.postgres_journal import PostgresJournalDB  # the [postgres] extra

                target = PostgresJournalDB(
                    settings.store.url,
                    connect_timeout_s=settings.store.connect_timeout_s,
                    replica=settings.ha.replica_id or "",
                )
            journal = EventJournal(
                target, kept, flush_interval_s=e.flush_interval_s, flush_max_events=e.flush_max_events
            )
        return EventLog(kept, journal=journal)

    def _rollout_service(self, settings: CentralSettings) -> RolloutService:
        """Rollouts over the node directory and heartbeats, stored beside the registry."""
        fleet = (
            DirectoryFleet(self.nodes, self.membership)
            if self.replica is None
            else DirectoryFleet(self.nodes, reports=self.replica.view.reported, clocks=self.replica.view.clock)
        )
        self._rollout_book = book = RolloutBook(
            open_rollout_store(settings.store, settings.data_dir / "rollouts.sqlite3"),
            self._latest_versions,
            on_write=self.replica.bump if self.replica is not None else None,
        )
        r = settings.rollout
        controller = RolloutController(
            book,
            fleet,
            emit=self.membership.record_event,
            on_change=self._changed_here,
            interval_s=r.interval_s,
            stuck_after_s=r.stuck_after_s,
            reread=book.reload if self.replica is not None else None,
            leading=(lambda: self.replica is not None and self.replica.is_leader) if self.replica is not None else None,
            flip_rules=FlipRules(r.flip_lead_s, r.flip_max_clock_offset_s, r.flip_max_clock_error_s),
        )
        self._rollout_controller = controller
        self._rollouts_unsubscribe = self.membership.subscribe(lambda *_: controller.poke())
        previewer = RolloutPreviewer(book, self.store, fleet, self.placement, self.nodes, self._verdict_artifact)
        return RolloutService(book, controller, self.store, fleet, previewer)

    def _verdict_artifact(self, key: tuple[str, str], hardware_class: str) -> str | None:
        """The artifact ``hardware_class`` serves of version ``key``, per its verdict (None: none)."""
        verdict = self.verdicts.get(key, hardware_class)
        return verdict.artifact if verdict is not None else None

    def _manifest_of(self, name: str, version: str) -> Manifest | None:
        record = self.store.get_version(name, version)
        return record.manifest if record is not None else None

    def _site_of(self, node_id: str) -> str | None:
        node = self.nodes.get(node_id)
        return node.site if node is not None else None

    def _latest_versions(self) -> dict[str, str | None]:
        return {m.name: m.latest for m in self.store.list_models()}

    def _changed_here(self) -> None:
        """A change made by this process (a push, a rollout step, a verdict): re-place here and,
        on a replica, tell the others to re-read."""
        if self.replica is not None:
            self.replica.bump()
        self._changed()

    def _changed(self) -> None:
        # Coalesced: a burst of births (thousands of nodes after a broker restart) or a
        # batch of heartbeat transitions costs one re-placement, not one per node.
        if self._refresh_pending:
            return
        self._refresh_pending = True
        asyncio.get_running_loop().call_soon(self._refresh)

    def _refresh(self) -> None:
        self._refresh_pending = False
        if self._closed:  # queued before close (e.g. a node left during shutdown)
            return
        self.desired.refresh()
        if self.replica is not None:
            self.replica.after_refresh()

    def start(self) -> None:
        """Compute the initial desired state (needs the running loop)."""
        self.desired.refresh()
        self.membership.record_event(self._started_event())
        self.drift.start()
        if self.replica is None:  # a replica runs rollouts only while it leads
            self._rollout_controller.start()  # tells the log of each rollout it resumes

    def _started_event(self) -> Event:
        """``central_started``: a new data dir or not, how the last run stopped, what it resumes."""
        journal = self.events.journal
        detail = {
            "fresh": self._fresh,
            "previous_stop": journal.previous_stop if journal is not None else None,
            "events_restored": len(self.events.last()) if journal is not None else 0,
            "rollouts_resumed": sum(1 for r in self.rollouts.all() if r.in_progress),
        }
        return Event(type="central_started", ts=int(time.time() * 1000), detail=detail)

    def readiness(self) -> dict[str, Any]:
        """``/readyz``: whether this central can take traffic now, and why not."""
        checks: dict[str, bool] = {"store": self.store.reachable()}
        if self.mqtt is not None:
            checks["broker"] = self.mqtt.connected
        body: dict[str, Any] = {}
        if self.replica is not None:
            health = self.replica.health()
            checks["control_session"] = health["control_connected"]
            checks["fleet_feed"] = health["generation_connected"]
            body["replica"] = health
        body["checks"] = checks
        body["ready"] = all(checks.values())
        return body

    def replicas(self) -> dict[str, Any]:
        """The live replicas (a replicated central), or this one process."""
        if self.replica is None:
            return {"replicated": False, "replicas": [{"replica_id": None, "leader": True}]}
        return {
            "replicated": True,
            "this": self.replica.replica_id,
            "leader_id": self.replica.control.leader_id() if self.replica.control is not None else None,
            "replicas": [dataclasses.asdict(r) for r in self.replica.replicas()],
        }

    def close(self) -> None:
        """Release the tracker's timers, the metadata store and the event log (written out)."""
        self._closed = True
        self._rollouts_unsubscribe()
        self._verdicts_unsubscribe()
        self._drift_unsubscribe()
        self.drift.stop()
        self.rollouts.close()
        self.membership.close()
        if self.replica is not None:
            self.replica.close()
        self.store.close()
        for tokens in (self.operator_tokens, self.node_tokens):
            if tokens is not None:
                tokens.close()
        if self.events.journal is not None:
            self.events.journal.close()
