"""Wires central's services together once, for one fleet mode, and hands the transports
their handlers (``central.handlers``); no transport sees this object."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from central.auth.tokens import operator_record
from central.dashboard import DashboardService, DashboardSources
from central.distribution import DesiredStateService, VerdictBook
from central.distribution.runtime_fit import RuntimeFit
from central.distribution.transfer_policy import TransferPolicy
from central.events import create_event_log
from central.fleet_mode import FleetParts
from central.fleet_mode.factory import open_fleet_mode
from central.gateway import create_gateway
from central.gateway.catalog import GatedCatalog
from central.gateway.prefix_index import PrefixIndex
from central.gateway.text_proxy import TextGateway
from central.gateway.text_routing import GenerationLoads, TextRouting
from central.handlers import ApiHandlers, EdgeHandlers, FleetHandlers, HealthHandlers, RegistryHandlers, RolloutHandlers
from central.membership import NodeDirectory
from central.membership.registered import RegisteredNodeSource
from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.observability import CentralMetrics, CentralStateCollector
from central.origin import EgressBucket, OriginService
from central.placement import PlacementService
from central.quantize import GuardStep, QuantizeStep
from central.quantize.llm import TextGuardStep, TextQuantizeStep
from central.registry.chunker import Chunker
from central.registry.conversion import RuntimeConversions
from central.registry.pending import PendingDecisions
from central.registry.pipeline import ChunkStep, KindSteps, ManifestStep, PushPipeline, PushStep, ValidateStep
from central.registry.service import RegistryService
from central.registry.signing import ManifestSigner
from central.registry.staging import Staging
from central.rollout import DirectoryFleet, RolloutBook, RolloutController, RolloutService
from central.rollout.drift import DriftWatch
from central.rollout.flip import FlipRules
from central.rollout.previewer import RolloutPreviewer
from central.rollout.promotion import PromotionWatch
from central.settings import CentralSettings
from central.storage.factory import open_storage
from central.storage.offload import StoreCalls
from fleetwire.manifest import KIND_DECODER, KIND_TENSOR, Manifest
from fleetwire.mqtt.payloads import Event
from fleetwire.tls import client_ssl_context


def _pipeline(settings: CentralSettings, central: Central) -> PushPipeline:
    q = settings.quantize
    steps: list[PushStep] = [
        ValidateStep(),
        KindSteps("quantize", {KIND_TENSOR: QuantizeStep(q), KIND_DECODER: TextQuantizeStep(q)}),
        *([KindSteps("guard", {KIND_TENSOR: GuardStep(), KIND_DECODER: TextGuardStep(q)})] if q.enabled else []),
        ChunkStep(Chunker(settings.chunking), central.blobs),
        ManifestStep(central.signer),
    ]
    return PushPipeline(steps)


class Central:
    """The registry, placement, node directory, liveness, rollouts, desired state and origin of
    one central, in one fleet mode (alone, or one replica)."""

    def __init__(self, settings: CentralSettings) -> None:
        self.settings = settings
        self._refresh_pending = False
        self._closed = False
        data = settings.data_dir
        #: Every store, SQLite (one ``central.sqlite3``) or PostgreSQL, picked once.
        self._storage = storage = open_storage(settings)
        self._fresh = storage.fresh
        self.blobs, self.store = storage.blobs, storage.metadata
        #: Where the transports' store calls run: worker threads, never the event loop.
        self.store_calls = StoreCalls(settings.store.threads)
        self.blobs.remove_temp_files()
        self._events = create_event_log(settings.events, storage.events)
        self.staging = Staging(data / "staging", settings.max_upload_bytes, settings.min_free_disk_bytes)
        #: What differs between a central alone and one replica: picked once, here.
        self.mode = open_fleet_mode(settings)
        self.signer: ManifestSigner = self.mode.signer(data)
        self.signer.sign_stored(self.store)
        p = settings.placement
        self.placement = PlacementService(
            replicas=p.replicas, load_factor=p.load_factor, enabled=p.enabled, site_aware=p.site_aware
        )
        self.registry = RegistryService(
            self.store,
            self.blobs,
            _pipeline(settings, self),
            on_change=self._changed_here,
            transaction=storage.transaction,
            calls=self.store_calls,
        )
        self.registry.remove_orphan_blobs()
        self._membership(settings)
        self._serving(settings)
        self._distribution(settings)
        self.mode.steer(self._fleet_parts())  # before the metrics: registering them reads the mode's
        self.dashboard = DashboardService(self._dashboard_sources())
        self._metrics = CentralMetrics(self._state_collector(), self.gateway, self.liveness)
        #: What the HTTP API (and the gateway's gRPC) serves.
        self.handlers = self._handlers()
        #: What edges ask over the gRPC Registry service.
        self.edge_handlers = EdgeHandlers(
            directory=self.directory,
            signer=self.signer,
            desired=self._desired,
            registry=self.registry,
            origin=self.origin,
            partitions=self.mode.heartbeat_partitions,
            node_tokens=self._storage.node_tokens,
            calls=self.store_calls,
        )

    def _membership(self, settings: CentralSettings) -> None:
        """The node directory (gRPC registrations), the liveness tracker and its MQTT consumer."""
        self.directory = NodeDirectory(self.placement, on_change=self._changed, sink=self.mode.registrations)
        m = settings.mqtt
        #: Liveness from heartbeats (the MQTT consumer feeds it).
        self.liveness = make_tracker(m, events=self._events)
        self._failover = self.mode.failover(self.liveness, self.directory) if m.enabled else None
        self.mqtt = MembershipConsumer(m, self.liveness, broker=settings.broker) if m.enabled else None

    def _serving(self, settings: CentralSettings) -> None:
        """The gateway, the rollouts and the INT8 drift watch."""
        tls = settings.tls
        #: The TLS files, read and checked once here for the gateway's client and both listeners.
        self.tls_material = material = tls.material() if tls.enabled else None
        self.gateway = create_gateway(
            RegisteredNodeSource(self.mode.node_source(self.liveness), self.directory),
            settings.gateway,
            scheme=tls.edge_scheme,
            ssl_context=client_ssl_context(material) if material is not None and tls.edge_scheme == "https" else None,
            catalog=self.registry.describe,
        )
        #: The text APIs over the gateway: prefix-aware routing on the heartbeats' generation load.
        self.text_gateway = self._text_gateway(settings)
        self._rollouts = self._rollout_service(settings)
        #: Which artifact each hardware class serves, as the first node of the class timed it.
        records, counts, mode = self._storage.decisions, self.mode.shadow_counts(), self.mode
        self.verdicts = VerdictBook(
            self.directory.hardware_class, on_new=self._changed_here, records=records, calls=self.store_calls
        )
        #: INT8 against FP32 on live traffic, as edges report it; fallbacks per the version's policy.
        self._drift = DriftWatch(
            self._manifest_of,
            emit=self._events.record,
            on_change=self._changed_here,
            roll_back=self._rollouts.roll_back_version,
            assigned=self._serves,
            records=records,
            counts=counts,
            leading=mode.leads,
            fence=mode.leader_epoch,
            calls=self.store_calls,
        )
        self._rollouts.forced = self._drift.forced
        #: Pending INT8 candidates judged on live traffic; promoted or rejected in a new manifest.
        decisions = PendingDecisions(self.store, self.signer, self._changed_here, self._storage.transaction)
        self._promotion = PromotionWatch(
            self._manifest_of,
            promote=decisions.promote,
            reject=decisions.reject,
            emit=self._events.record,
            holders=self._holders,
            assigned=self._serves,
            counts=counts,
            leading=mode.leads,
            calls=self.store_calls,
        )
        self._unsubscribe = [
            self.liveness.watch_heartbeats(self.text_gateway.routing.loads.harvest),
            self.liveness.watch_heartbeats(self.verdicts.harvest),
            self.liveness.watch_heartbeats(self._drift.harvest),
            self.liveness.watch_heartbeats(self._promotion.harvest),
            self.liveness.subscribe(lambda *_: self._rollout_controller.poke()),
        ]

    def _distribution(self, settings: CentralSettings) -> None:
        """Edges' transfer caps, the desired state of every node and the origin."""
        #: Artifacts converted for nodes whose ONNX Runtime loads none of a version's.
        self.conversions = RuntimeConversions(
            self.store,
            self.blobs,
            Chunker(settings.chunking),
            self.signer,
            on_change=self._changed_here,
            transaction=self._storage.transaction,
        )
        #: Edges' chunk byte-rate caps (``PUT /api/v1/transfer`` replaces them live).
        self._transfer = TransferPolicy(
            settings.transfer,
            self._site_of,
            on_change=self._changed,
            records=self._storage.decisions,
            calls=self.store_calls,
        )
        self._desired = DesiredStateService(
            self.placement,
            self._rollouts.active_versions,
            self.directory.peers,
            serving=self._rollouts.serving,
            grace_s=settings.origin.replaced_state_grace_s,
            verdicts=self.verdicts,
            hardware_class=self.directory.hardware_class,
            peer_sites=self.directory.sites,
            limits=self._transfer.caps_for,
            holding=self._rollouts.holding,
            runtime_fit=RuntimeFit(self.directory.runtime, convert=self.conversions.request),
        )
        self._rollout_fleet.refusals = self._desired.runtime_refusals
        origin = settings.origin
        self.origin = OriginService(
            self.blobs,
            self.placement,
            EgressBucket(origin.egress_bytes_s),
            origin.max_concurrent_streams,
            origin.max_waiting_streams,
            entitled=self._desired.allows_chunk,
        )

    def _text_gateway(self, settings: CentralSettings) -> TextGateway:
        """OpenAI-compatible and OIP generate requests, routed by prefix and load."""
        g = settings.gateway
        index = PrefixIndex(g.prefix_blocks_per_node)
        routing = TextRouting(self.gateway.router, GenerationLoads(), index, by_prefix=g.text_routing == "prefix")
        return TextGateway(
            self.gateway,
            routing,
            read_timeout_s=g.text_read_timeout_s,
            names=self._model_names,
            catalog=self.registry.describe,
        )

    def _rollout_service(self, settings: CentralSettings) -> RolloutService:
        """Rollouts over the node directory and heartbeats, stored beside the registry."""
        mode = self.mode
        fleet: DirectoryFleet = mode.rollout_fleet(self.directory, self.liveness)
        self._rollout_fleet = fleet
        self._rollout_book = book = RolloutBook(
            self._storage.rollouts, self._latest_versions, on_write=mode.changed_here
        )
        r = settings.rollout
        self._rollout_controller = controller = RolloutController(
            book,
            fleet,
            emit=self._events.record,
            on_change=self._changed_here,
            interval_s=r.interval_s,
            stuck_after_s=r.stuck_after_s,
            leading=mode.leads,
            epoch=mode.leader_epoch,
            flip_rules=FlipRules(r.flip_lead_s, r.flip_max_clock_offset_s, r.flip_max_clock_error_s),
        )
        previewer = RolloutPreviewer(book, self.store, fleet, self.placement, self.directory, self._verdict_artifact)
        return RolloutService(book, controller, self.store, fleet, previewer)

    def _handlers(self) -> ApiHandlers:
        record = self._events.record
        return ApiHandlers(
            registry=RegistryHandlers(
                self.registry, self._rollouts, self.staging, self.placement, self._desired, record
            ),
            fleet=FleetHandlers(
                directory=self.directory,
                liveness=self.liveness,
                consumer=self.mqtt,
                placement=self.placement,
                verdicts=self.verdicts,
                desired=self._desired,
                origin=self.origin,
                transfer=self._transfer,
                record_event=record,
            ),
            rollouts=RolloutHandlers(self._rollouts, self._drift, self._promotion),
            health=HealthHandlers(self.store.reachable, self.mqtt, self.mode, self.store_calls),
            gateway=self.gateway,
            metrics=self._metrics,
            dashboard=self.dashboard,
            operator_tokens=self._storage.operator_tokens,
            store_calls=self.store_calls,
            catalog=GatedCatalog(self.registry.describe, self._reader_check()),
            text=self.text_gateway,
        )

    async def _model_names(self) -> list[str]:
        return [m.name for m in await self.registry.list_models()]

    def _reader_check(self) -> Callable[[str | None], Awaitable[bool]] | None:
        """With ``auth.protect_reads``: whether a token is an operator's (any role); else None."""
        auth, tokens = self.settings.auth, self._storage.operator_tokens
        if not (auth.enabled and auth.protect_reads) or tokens is None:
            return None

        async def is_reader(token: str | None) -> bool:
            return await self.store_calls(operator_record, tokens, token) is not None

        return is_reader

    def _fleet_parts(self) -> FleetParts:
        return FleetParts(
            directory=self.directory,
            liveness=self.liveness,
            consumer=self.mqtt,
            placement=self.placement,
            book=self._rollout_book,
            controller=self._rollout_controller,
            changed=self._changed,
            read_decisions=self._read_decisions,
        )

    def _read_decisions(self) -> Callable[[], None]:
        """Another replica stored a decision (or a leader change left this one to judge): read
        the fallbacks, verdicts and transfer policy as stored (in the caller's thread: a worker)
        and return what takes them, on the loop."""
        drift, verdicts, transfer = self._drift.read_stored(), self.verdicts.read_stored(), self._transfer.read_stored()

        def adopt() -> None:
            self._drift.adopt(drift)
            self.verdicts.adopt(verdicts)
            self._transfer.adopt(transfer)

        return adopt

    def _dashboard_sources(self) -> DashboardSources:
        return DashboardSources(
            liveness=self.liveness,
            directory=self.directory,
            registry=self.registry,
            placement=self.placement,
            desired=self._desired,
            origin=self.origin,
            gateway=self.gateway,
            gateway_enabled=self.settings.gateway.enabled,
            mqtt_enabled=self.mqtt is not None,
            shared=self.mode.shared_liveness,
            replicas=self.mode.replicas,
        )

    def _state_collector(self) -> CentralStateCollector:
        return CentralStateCollector(
            liveness=self.liveness,
            directory=self.directory,
            failover=self._failover,
            placement=self.placement,
            desired=self._desired,
            registry=self.registry,
            origin=self.origin,
            gateway=self.gateway,
            rollouts=self._rollouts,
            mode_metrics=self.mode.metrics,
        )

    def _verdict_artifact(self, key: tuple[str, str], hardware_class: str) -> str | None:
        """The artifact ``hardware_class`` serves of version ``key``, per its verdict (None: none)."""
        verdict = self.verdicts.get(key, hardware_class)
        return verdict.artifact if verdict is not None else None

    def _serves(self, node_id: str, key: tuple[str, str]) -> bool:
        """Whether ``node_id`` is registered and its desired state has it serve version ``key``."""
        return self.directory.get(node_id) is not None and key in self._rollouts.serving(node_id)

    def _holders(self, key: tuple[str, str]) -> int:
        """How many registered nodes serve version ``key`` (asked only when a decision is near)."""
        return sum(key in self._rollouts.serving(n.node_id) for n in self.directory.nodes())

    def _manifest_of(self, name: str, version: str) -> Manifest | None:
        record = self.store.get_version(name, version)
        return record.manifest if record is not None else None

    def _site_of(self, node_id: str) -> str | None:
        node = self.directory.get(node_id)
        return node.site if node is not None else None

    def _latest_versions(self) -> dict[str, str | None]:
        return {m.name: m.latest for m in self.store.list_models()}

    def _changed_here(self) -> None:
        """A change made by this process (a push, a rollout step, a verdict): re-place here and
        tell whoever shares the fleet's state."""
        self.mode.changed_here()
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
        self._desired.refresh()
        self.mode.after_refresh()

    def start(self) -> None:
        """Compute the initial desired state (needs the running loop)."""
        self._desired.refresh()
        self._events.record(self._started_event())
        self._drift.start()
        self._promotion.start()
        self.mode.start_rollouts()  # tells the log of each rollout it resumes

    def _started_event(self) -> Event:
        """``central_started``: a new data dir or not, how the last run stopped, what it resumes."""
        journal = self._events.journal
        detail = {
            "fresh": self._fresh,
            "previous_stop": journal.previous_stop if journal is not None else None,
            "events_restored": len(self._events.last()) if journal is not None else 0,
            "rollouts_resumed": sum(1 for r in self._rollouts.all() if r.in_progress),
        }
        return Event(type="central_started", ts=int(time.time() * 1000), detail=detail)

    def close(self) -> None:
        """Release the tracker's timers, the fleet mode and the stores (the event log written out)."""
        self._closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._drift.stop()
        self._promotion.stop()
        self.verdicts.close()
        # After the transports and the watches stopped: no call is left to start, and a call of
        # a watch's pass under way ends before the stores it uses close.
        self.store_calls.close()
        self._rollouts.close()
        self._storage.decisions.close()
        self.liveness.close()
        self.mode.close()
        self.store.close()
        for tokens in (self._storage.operator_tokens, self._storage.node_tokens):
            if tokens is not None:
                tokens.close()
        if self._events.journal is not None:
            self._events.journal.close()
