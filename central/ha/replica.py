"""One replica of a replicated central: the glue between its control session (leadership,
partitions), the shared fleet state in PostgreSQL and this process's services.

- Every replica takes registrations and writes them to the shared store; every replica
  mirrors the store's ring members into its node directory and routes its gateway from
  the store's liveness.
- The owner of a heartbeat partition tracks those nodes over MQTT and writes only their
  transitions (and changes of what they report) to the store, fenced by the partition's
  epoch; on a handover the new owner subscribes and grants the usual grace, so nobody is
  declared dead for it.
- The leader places chunks and writes the placement, fenced by its epoch; followers hand
  out exactly that placement. Only the leader runs the rollout controller.
- A change anywhere bumps the fleet generation; ``GenerationWatcher`` (LISTEN/NOTIFY as a
  wake-up, a poll as the guarantee) makes every replica re-read it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from central.fleet_mode.protocol import FleetParts
from central.ha.control import ReplicaControl, ReplicaInfo
from central.ha.control_thread import ControlThread
from central.ha.fencing import Fenced
from central.ha.fleet_store import FleetStore, LivenessRow
from central.ha.generation import GenerationWatcher
from central.ha.view import SharedView, models_to_json
from central.membership.liveness import NodeLiveness as Liveness
from central.membership.liveness import TransitionInfo
from central.rollout.book import RolloutState
from central.settings import CentralSettings
from fleetwire.mqtt.fast import AnyHeartbeat
from fleetwire.mqtt.topics import partition_of

log = logging.getLogger(__name__)

#: Liveness changes are written in batches: a burst of births after a broker restart is a few
#: transactions, not one per node.
_FLUSH_DELAY_S = 0.05
#: At most this often a replica re-reads the fleet snapshot (a storm of generations coalesces).
_SYNC_MIN_INTERVAL_S = 0.2


class Replica:
    """Leadership, partitions and the shared fleet state of one replica."""

    def __init__(self, settings: CentralSettings, fleet: FleetStore, view: SharedView, parts: FleetParts) -> None:
        """Steer ``parts`` from the shared ``fleet`` state (mirrored in ``view``): from here on,
        the tracker's transitions and heartbeats are written out, and the consumer follows no
        partition until the control session hands some out."""
        ha, store = settings.ha, settings.store
        assert ha.replica_id is not None and store.url is not None  # the settings check both
        self.replica_id = ha.replica_id
        self._settings = settings
        self._url = store.url
        self.fleet = fleet
        self.view = view
        self.control: ControlThread | None = None
        self._watcher = GenerationWatcher(store.url, self._on_generation, poll_s=max(ha.tick_s, 0.25))
        self._parts = parts
        self._unsubscribe = [
            parts.liveness.subscribe(self._on_transition),
            parts.liveness.watch_heartbeats(self._on_heartbeat),
        ]
        if parts.consumer is not None:
            parts.consumer.set_partitions(set(), total=ha.partitions)
        self._pending: dict[str, LivenessRow] = {}
        self._written: dict[str, tuple[Any, ...]] = {}
        self._flush_task: asyncio.Task[None] | None = None
        self._flush_handle: asyncio.TimerHandle | None = None
        self._sync_handle: asyncio.TimerHandle | None = None
        self._sync_task: asyncio.Task[None] | None = None
        #: The newest generation the watcher reported (a sync under way may have read an older one).
        self._wanted_gen = 0
        self._last_sync = 0.0
        self._config_gen = -1
        self._written_placement: dict[str, Any] | None = None
        self.leader_epoch: int | None = None
        self.stale_writes = 0
        self.liveness_writes = 0
        self.write_errors = 0
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    async def start(self, *, http_url: str, grpc_address: str) -> None:
        """Read the fleet, join the replicas (leadership, partitions) and follow the generation."""
        s = self._settings
        await self._sync_now()
        self.control = ControlThread(
            lambda relay: ReplicaControl(
                self._url,
                self.replica_id,
                http_url=s.ha.advertise_http or http_url,
                grpc_address=s.ha.advertise_grpc or grpc_address,
                partitions=s.ha.partitions,
                ttl_s=s.ha.replica_ttl_s,
                tick_s=s.ha.tick_s,
                connect_timeout_s=s.store.connect_timeout_s,
                listener=relay,
            ),
            self,
        )
        await self.control.start()
        try:
            await self._watcher.start()
        except BaseException:
            await self.control.stop()  # hand back what it took: this replica is not starting
            raise

    async def stop(self) -> None:
        """Write out pending liveness (after the write under way: never an older row over a newer
        one), hand back leadership and partitions, stop following."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._flush_task is not None:
            await asyncio.gather(self._flush_task, return_exceptions=True)
        await self._flush()
        if self._sync_task is not None:
            self._sync_task.cancel()
            await asyncio.gather(self._sync_task, return_exceptions=True)
        if self.control is not None:
            await self.control.stop()
        await self._watcher.stop()

    def close(self) -> None:
        """Release the store (after ``stop``)."""
        self._closed = True
        for cancel in (self._flush_handle, self._sync_handle):
            if cancel is not None:
                cancel.cancel()
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    @property
    def is_leader(self) -> bool:
        """Whether this replica leads (places chunks, runs rollouts) right now."""
        return self.control is not None and self.control.is_leader

    def replicas(self) -> list[ReplicaInfo]:
        """The live replicas as of the control session's last tick."""
        return self.control.replicas() if self.control is not None else []

    def health(self) -> dict[str, Any]:
        """What ``/readyz`` and the status page say about this replica."""
        c = self.control
        return {
            "replica_id": self.replica_id,
            "leader": self.is_leader,
            "leader_id": c.leader_id() if c is not None else None,
            "leader_epoch": self.leader_epoch,
            "partitions": sorted(c.owned) if c is not None else [],
            "partitions_total": self._settings.ha.partitions,
            "replicas": [r.replica_id for r in self.replicas()],
            "control_connected": c is not None and c.connected,
            "generation_connected": self._watcher.connected,
            "fleet_generation": self.view.gen,
            "stale_writes": self.stale_writes,
            "liveness_writes": self.liveness_writes,
            "write_errors": self.write_errors,
        }

    # ----------------------------------------------------------------- ControlListener

    def leadership_gained(self, epoch: int) -> None:
        """This replica leads from ``epoch``: run rollouts, and place (written on the next refresh)."""
        self.leader_epoch = epoch
        self._written_placement = None
        log.warning("replica %s is the leader (epoch %d)", self.replica_id, epoch)
        self._parts.book.reload()
        self._parts.controller.start()
        self._parts.changed()

    def leadership_lost(self) -> None:
        """Another replica leads (or may): stop the controller at once."""
        log.warning("replica %s lost the leadership (epoch %s)", self.replica_id, self.leader_epoch)
        self.leader_epoch = None
        self._parts.controller.stop()

    def partitions_gained(self, gained: dict[int, int]) -> None:
        """Follow these partitions' heartbeats. Their nodes are new to the tracker, so each gets
        a full window from its first message (the retained birth); one window later the shared
        rows are reconciled with what was heard (``_reconcile``)."""
        self._follow_owned()
        log.info("replica %s took partitions %s", self.replica_id, sorted(gained))
        m = self._settings.mqtt
        window = m.dead_after * m.default_interval_s + 2 * self._settings.ha.tick_s
        if not self._closed:
            asyncio.get_running_loop().call_later(window, self._reconcile, dict(gained))

    def _reconcile(self, gained: dict[int, int]) -> None:
        """A node the shared liveness still calls alive but that this owner found dead (a
        retained death, learnt quietly) or never heard at all in a whole window: dead. Without
        this, a node that died while its partition had no owner would stay alive for everyone."""
        parts = self._parts
        owned = self.control.owned if self.control is not None else {}
        if self._closed:
            return
        still = {k for k, epoch in gained.items() if owned.get(k) == epoch}
        for node_id, row in list(self.view.liveness.items()):
            if row.partition not in still or row.state == "dead":
                continue
            state = parts.liveness.state_of(node_id)
            if state is None or state is Liveness.DEAD:
                log.warning("node %s: alive in the shared liveness, not heard by its new owner: dead", node_id)
                self._queue(node_id, "dead", row.http_address, list(self.view.reported(node_id) or []), row.clock)

    def partitions_released(self, released: set[int]) -> None:
        """Stop following these partitions; their nodes are the new owner's from now."""
        self._follow_owned()
        parts = self._parts
        n = self._settings.ha.partitions
        gone = [node_id for node_id in parts.liveness.node_ids() if partition_of(node_id, n) in released]
        for node_id in gone:
            self._pending.pop(node_id, None)
            self._written.pop(node_id, None)
        parts.liveness.release(gone)
        log.info("replica %s handed over partitions %s", self.replica_id, sorted(released))

    def _follow_owned(self) -> None:
        if self._parts.consumer is not None and self.control is not None:
            self._parts.consumer.set_partitions(set(self.control.owned))

    # ----------------------------------------------------------------- liveness out

    def _on_transition(self, node_id: str, old: Liveness | None, new: Liveness, info: TransitionInfo) -> None:
        view = info.view
        models: list[Any] = view.models
        address = view.http_address
        if view.last_heartbeat_at is None and new is Liveness.ALIVE:
            # Only a birth heard so far (e.g. the retained one, right after taking the partition
            # over): keep what the node last reported to the previous owner until its next
            # heartbeat, or every replica's gateway would see it serving nothing meanwhile.
            known = self.view.liveness.get(node_id)
            if known is not None:
                models = list(self.view.reported(node_id) or [])
                address = address or known.http_address
        clock = _clock_of(view.clock_offset_ms, view.clock_error_ms)
        self._queue(node_id, new.value, address, models, clock)

    def _on_heartbeat(self, node_id: str, hb: AnyHeartbeat) -> None:
        # Every heartbeat of this replica's partitions passes here (10,000 a second at 1 Hz):
        # compare in place, and build a row only when what the node reports changed.
        last = self._written.get(node_id)
        models = tuple((m.name, m.version, m.state, m.error) for m in hb.models)
        clock = _clock_of(hb.clock_offset_ms, hb.clock_error_ms)
        if last is not None and last[2] == models and last[1] == hb.http_address and _same_clock(last[3], clock):
            return
        state = last[0] if last is not None else "alive"
        self._queue(node_id, state, hb.http_address, list(hb.models), clock)

    def _queue(
        self, node_id: str, state: str, http_address: str, models: list[Any], clock: tuple[float, float] | None = None
    ) -> None:
        """Queue the row of ``node_id`` for the next batch (remembering what it says)."""
        body = models_to_json(models)
        signature = (
            state, http_address, tuple((m["name"], m["version"], m["state"], m["error"]) for m in body), clock,
        )  # fmt: skip
        self._written[node_id] = signature
        partition = partition_of(node_id, self._settings.ha.partitions)
        self._pending[node_id] = LivenessRow(node_id, partition, state, http_address, tuple(body), clock)
        if self._flush_handle is None and not self._closed:
            self._flush_handle = asyncio.get_running_loop().call_later(_FLUSH_DELAY_S, self._start_flush)

    def _start_flush(self) -> None:
        self._flush_handle = None
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.get_running_loop().create_task(self._flush())
        else:  # one write at a time; what queued meanwhile goes next
            self._flush_handle = asyncio.get_running_loop().call_later(_FLUSH_DELAY_S, self._start_flush)

    async def _flush(self) -> None:
        """Write the queued rows, per partition, fenced by the epoch this replica holds it at."""
        pending, self._pending = self._pending, {}
        owned = dict(self.control.owned) if self.control is not None else {}
        by_partition: dict[int, list[LivenessRow]] = {}
        for row in pending.values():
            by_partition.setdefault(row.partition, []).append(row)
        for partition, rows in sorted(by_partition.items()):
            epoch = owned.get(partition)
            if epoch is None:
                continue  # handed over meanwhile: the new owner writes what it sees
            try:
                await asyncio.to_thread(self.fleet.put_liveness, partition, epoch, rows)
                self.liveness_writes += len(rows)
            except Fenced:
                self.stale_writes += 1
                log.warning("liveness of partition %d refused: epoch %d is stale", partition, epoch)
            except Exception as exc:  # PostgreSQL away: keep the rows for the next flush
                self.write_errors += 1
                log.warning("liveness write failed (%s); retrying", exc)
                for row in rows:
                    self._pending.setdefault(row.node_id, row)
                if not self._closed and self._flush_handle is None:
                    self._flush_handle = asyncio.get_running_loop().call_later(0.5, self._start_flush)

    # ----------------------------------------------------------------- fleet in

    def _on_generation(self, gen: int) -> None:
        self._wanted_gen = max(self._wanted_gen, gen)
        if gen <= self.view.gen or self._sync_handle is not None or self._sync_task is not None or self._closed:
            return
        wait = max(0.0, self._last_sync + _SYNC_MIN_INTERVAL_S - time.monotonic())
        self._sync_handle = asyncio.get_running_loop().call_later(wait, self._sync_soon)

    def _sync_soon(self) -> None:
        self._sync_handle = None
        self._sync_task = asyncio.get_running_loop().create_task(self._sync())

    async def _sync(self) -> None:
        """One sync; again when a newer generation came while it read (the watcher reports each once)."""
        try:
            await self._sync_now()
        except Exception as exc:  # the store is away: try again
            self.write_errors += 1
            log.warning("reading the fleet state failed: %s; retrying", exc)
            if not self._closed:
                self._sync_handle = asyncio.get_running_loop().call_later(1.0, self._sync_soon)
            return
        finally:
            self._sync_task = None
        if self._wanted_gen > self.view.gen:
            self._on_generation(self._wanted_gen)

    async def _sync_now(self) -> None:
        """Re-read what changed in the fleet state; mirror the ring (when registrations or deaths
        changed it) and re-read rollouts and decisions (when the configuration generation moved:
        every write of either bumps it); then re-place. The read runs in a worker thread: a
        snapshot of a large fleet, or a wait for a restarting PostgreSQL, never holds the loop."""
        self._last_sync = time.monotonic()
        if not self.view.gen:
            snap = await asyncio.to_thread(self.fleet.snapshot)
            if snap is None or self._closed:
                return
            self.view.apply(snap)
            ring_changed = replan = config_changed = True
        else:
            changes = await asyncio.to_thread(self.fleet.changes, self.view.gen)
            if changes is None or self._closed:
                return
            ring_changed = self.view.apply_changes(changes)
            config_changed = changes.config_gen != self._config_gen
            replan = ring_changed or changes.placement is not None or config_changed
            self._config_gen = changes.config_gen
        parts = self._parts
        if not replan:
            return  # liveness only: the gateway routes from the view already
        if config_changed:  # a rollout step, a push, a decision: only these bump it
            rollouts, adopt_decisions = await asyncio.to_thread(self._read_config)
            if self._closed:
                return
            parts.book.adopt(rollouts)
            adopt_decisions()
        if ring_changed:
            parts.directory.mirror(self.view.members())
        parts.changed()

    def _read_config(self) -> tuple[RolloutState, Callable[[], None]]:
        """The rollouts and decisions as stored (a worker thread: store reads only); applied
        on the loop by the caller."""
        return self._parts.book.read(), self._parts.read_decisions()

    def after_refresh(self) -> None:
        """Right after the desired state was recomputed: the leader stores its placement (if it
        changed), a follower takes the leader's over its own guess."""
        parts = self._parts
        if self.is_leader and self.leader_epoch is not None:
            body = parts.placement.export()
            if body == self._written_placement:
                return
            try:
                self.fleet.put_placement(self.leader_epoch, body)
                self._written_placement = body
            except Fenced:
                self.stale_writes += 1
                log.warning("placement refused: epoch %d is stale; stepping down", self.leader_epoch)
                self.leadership_lost()
            except Exception as exc:
                self.write_errors += 1
                log.warning("placement write failed (%s); retrying at the next change", exc)
        elif self.view.placement is not None:
            parts.placement.restore(self.view.placement)


#: A node's clock estimate is written again only when it moved this much (ms): offsets are
#: re-measured every minute and wobble by fractions of a millisecond.
_CLOCK_STEP_MS = 10.0


def _clock_of(offset_ms: float | None, error_ms: float | None) -> tuple[float, float] | None:
    return (offset_ms, error_ms) if offset_ms is not None and error_ms is not None else None


def _same_clock(written: tuple[float, float] | None, now: tuple[float, float] | None) -> bool:
    """Whether ``now`` says what ``written`` said, within ``_CLOCK_STEP_MS``."""
    if written is None or now is None:
        return written is now
    return abs(written[0] - now[0]) < _CLOCK_STEP_MS and abs(written[1] - now[1]) < _CLOCK_STEP_MS
