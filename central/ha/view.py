"""The fleet as every replica of a replicated central sees it: what PostgreSQL holds.

Registrations come from whichever replica took an edge's ``Register``; liveness and the
models each node reports come from the owner of the node's heartbeat partition. Each
replica keeps this copy current from the shared store's snapshots (``FleetStore``) and
routes (gateway), places (leader) and judges rollouts (leader) from it, so no decision
depends on which replica happens to hold a node's heartbeats or its watch stream."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from central.gateway import Candidate
from central.membership.nodes import NodeRecord
from fleetwire.mqtt.payloads import ModelInfo
from fleetwire.runtime_limits import RuntimeLimits
from fleetwire.transfer import site_or_default

if TYPE_CHECKING:  # psycopg (the [postgres] extra) is imported only where replicas run
    from central.ha.fleet_store import FleetChanges, FleetSnapshot, LivenessRow

#: Liveness states a node routes and places from; a node without any row yet (registered,
#: no heartbeat heard) counts as alive, as a fresh registration does on a single central.
_DEAD = "dead"


def record_to_json(record: NodeRecord) -> dict[str, Any]:
    """What a replica stores of a registration (no stream count, no local clock)."""
    return {
        "grpc_address": record.grpc_address,
        "http_address": record.http_address,
        "capacity": record.capacity,
        "labels": dict(record.labels),
        "hardware_class": record.hardware_class,
        "site": record.site,
        "runtime": record.runtime.as_json() if record.runtime is not None else None,
    }


def record_from_json(node_id: str, body: Mapping[str, Any]) -> NodeRecord:
    """A registration as another replica stored it."""
    return NodeRecord(
        node_id=node_id,
        grpc_address=str(body.get("grpc_address", "")),
        http_address=str(body.get("http_address", "")),
        capacity=max(1, int(body.get("capacity", 1))),
        labels={str(k): str(v) for k, v in dict(body.get("labels", {})).items()},
        hardware_class=str(body.get("hardware_class", "")),
        site=site_or_default(str(body.get("site", ""))),
        runtime=_runtime_from_json(body.get("runtime")),
    )


def _runtime_from_json(body: Any) -> RuntimeLimits | None:
    """A stored registration's runtime; None when it said none (or a row this version cannot read)."""
    if not isinstance(body, Mapping):
        return None
    try:
        return RuntimeLimits.from_json(body)
    except (KeyError, TypeError, ValueError):
        return None


def models_to_json(models: Sequence[Any]) -> list[dict[str, Any]]:
    """The part of a heartbeat's models the fleet decides from (state and error, not counters)."""
    return [{"name": m.name, "version": m.version, "state": m.state, "error": m.error} for m in models]


class SharedView:
    """Registrations, liveness and reported models of every node, as of one snapshot."""

    def __init__(self) -> None:
        self.gen = 0
        self.records: dict[str, NodeRecord] = {}
        self.liveness: dict[str, LivenessRow] = {}
        self.placement: dict[str, Any] | None = None
        self.placement_epoch: int | None = None
        self._reported: dict[str, list[ModelInfo]] = {}
        #: model → version → ids of the alive nodes ready with it, and each node's keys there
        self._ready: dict[str, dict[str, set[str]]] = {}
        self._ready_keys: dict[str, set[tuple[str, str]]] = {}

    def apply(self, snap: FleetSnapshot) -> None:
        """Take a whole snapshot: registrations and liveness as they are now."""
        self.gen = snap.gen
        self.records = {n: record_from_json(n, body) for n, body in snap.nodes.items()}
        self.liveness, self._reported, self._ready, self._ready_keys = {}, {}, {}, {}
        for row in snap.liveness.values():
            self._take(row)
        self.placement = snap.placement
        self.placement_epoch = snap.placement_epoch

    def apply_changes(self, changes: FleetChanges) -> bool:
        """Take what changed since ``gen``; True when the registrations changed (the ring may)."""
        self.gen = changes.gen
        ring_changed = bool(changes.nodes) or any(n not in changes.node_ids for n in self.records)
        for node_id in [n for n in self.records if n not in changes.node_ids]:
            del self.records[node_id]
        for node_id, body in changes.nodes.items():
            self.records[node_id] = record_from_json(node_id, body)
        for row in changes.liveness.values():
            old = self.liveness.get(row.node_id)
            was_dead = old is not None and old.state == _DEAD  # no row yet: a member, as in alive()
            ring_changed |= was_dead != (row.state == _DEAD)
            self._take(row)
        if changes.placement is not None:
            self.placement = changes.placement
            self.placement_epoch = changes.placement_epoch
        return ring_changed

    def _take(self, row: LivenessRow) -> None:
        node_id = row.node_id
        self.liveness[node_id] = row
        if row.models:
            self._reported[node_id] = [ModelInfo.model_validate(m) for m in row.models]
        else:
            self._reported.pop(node_id, None)
        keys = (
            {(str(m["name"]), str(m["version"])) for m in row.models if m.get("state") == "ready"}
            if row.state == "alive"
            else set()
        )
        for name, version in self._ready_keys.pop(node_id, set()) - keys:
            self._ready[name][version].discard(node_id)
        for name, version in keys:
            self._ready.setdefault(name, {}).setdefault(version, set()).add(node_id)
        if keys:
            self._ready_keys[node_id] = keys

    def alive(self, node_id: str) -> bool:
        """Not declared dead by its partition's owner (a registered node with no row yet is)."""
        row = self.liveness.get(node_id)
        return row is None or row.state != _DEAD

    def members(self) -> dict[str, NodeRecord]:
        """The ring: registered nodes that are not dead, as fresh records."""
        return {n: dataclasses.replace(r) for n, r in self.records.items() if self.alive(n)}

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """Alive nodes whose last report lists ``model`` (``version``) ready, with their HTTP address."""
        by_version = self._ready.get(model, {})
        ids = (
            by_version.get(version, []) if version is not None else sorted({n for v in by_version.values() for n in v})
        )
        out = []
        for node_id in ids:
            row = self.liveness[node_id]
            address = row.http_address or (self.records[node_id].http_address if node_id in self.records else "")
            if address:
                out.append(Candidate(node_id, address))
        return out

    def clock(self, node_id: str) -> tuple[float, float] | None:
        """``(offset_ms, error_ms)`` of the node's clock as its partition's owner last wrote it."""
        row = self.liveness.get(node_id)
        return row.clock if row is not None else None

    def reported(self, node_id: str) -> list[ModelInfo] | None:
        """The models ``node_id`` last reported (None before any report)."""
        return self._reported.get(node_id)

    def counts(self) -> dict[str, int]:
        """Nodes per liveness state (registered nodes without a row count as ``registered``)."""
        counts: dict[str, int] = {}
        for row in self.liveness.values():
            counts[row.state] = counts.get(row.state, 0) + 1
        counts["registered"] = len(self.records)
        return counts


class SharedNodeSource:
    """Gateway candidates of a replica: from the shared liveness, whoever tracks the node."""

    def __init__(self, view: SharedView) -> None:
        self._view = view

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """Node id and HTTP address of every alive node that reported ``model`` (``version``) ready."""
        return self._view.candidates(model, version)
