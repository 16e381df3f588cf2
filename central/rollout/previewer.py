"""Gathers what central knows for a rollout's cost preview (``central.rollout.cost``):
the version's manifest, the placement it has or will get, every node's site, hardware
class and labels, and what each node holds now. Reads only; a preview writes nothing."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from central.errors import NotFound
from central.membership import NodeDirectory
from central.membership.nodes import NodeRecord
from central.placement import Placement, PlacementService, place, place_by_site
from central.rollout.book import RolloutBook
from central.rollout.cost import (
    PreviewNode,
    RolloutPreview,
    VersionKey,
    artifacts_to_fetch,
    chunks_of,
    owner_map,
    preview_costs,
    site_totals,
)
from central.rollout.fleet import FleetView
from central.rollout.labels import matches
from central.rollout.model import RolloutRequest
from central.rollout.plan import ServingPlan
from central.storage.protocols import MetadataStore
from fleetwire.manifest import Manifest
from fleetwire.mqtt.payloads import ModelInfo

#: (model, version), hardware class → the artifact that class serves (None: no verdict).
VerdictOf = Callable[[VersionKey, str], "str | None"]


class RolloutPreviewer:
    """Builds ``RolloutPreview``s from the live registry, plan, placement and node directory."""

    def __init__(
        self,
        book: RolloutBook,
        store: MetadataStore,
        fleet: FleetView,
        placement: PlacementService,
        nodes: NodeDirectory,
        verdict_of: VerdictOf | None = None,
    ) -> None:
        """``verdict_of(key, hardware_class)``: the artifact a class's verdict names, if any."""
        self._book = book
        self._store = store
        self._fleet = fleet
        self._placement = placement
        self._nodes = nodes
        self._verdict_of = verdict_of or (lambda key, hardware_class: None)

    def preview(
        self, model: str, request: RolloutRequest, previous: str | None, refused: str | None = None
    ) -> RolloutPreview:
        """The cost of rolling ``request.version`` of ``model`` out to its selector; 404 for an
        unknown version. ``previous`` and ``refused`` come from the rollout service."""
        record = self._store.get_version(model, request.version)
        if record is None:
            raise NotFound(f"model {model!r} has no version {request.version!r}")
        target = record.manifest
        plan = self._book.plan()
        active = self._active(plan)
        placements = {key: self._placement.placement(key) for key in active}
        target_placement = placements.get(target.key) or self._place(target)
        placements[target.key] = target_placement
        records = sorted(self._nodes.nodes(), key=lambda r: r.node_id)
        owned = _owned_by_node({key: placements[key] for key in active})
        nodes = [self._node(r, target, request.selector, plan, owned.get(r.node_id, {})) for r in records]
        costs = preview_costs(target, nodes, target_placement, owner_map(placements, placements))
        return RolloutPreview(
            model=model,
            version=request.version,
            previous_version=previous,
            targets=[n.node_id for n in nodes if n.targeted],
            nodes=costs,
            sites=site_totals(costs),
            placement_enabled=self._placement.enabled,
            refused=refused,
        )

    def _active(self, plan: ServingPlan) -> dict[VersionKey, Manifest]:
        """Every version some node serves or may serve now (what desired states list)."""
        active: dict[VersionKey, Manifest] = {}
        for model in plan.models:
            for version in sorted(plan.versions_needed(model)):
                record = self._store.get_version(model, version)
                if record is not None:
                    active[record.manifest.key] = record.manifest
        return active

    def _place(self, target: Manifest) -> Placement:
        """The placement ``target`` will get when it becomes active: canonical over today's members."""
        p = self._placement
        digests = [c.digest for c in target.unique_chunks()]
        placer = place_by_site if p.site_aware else place
        placed = placer(digests, p.members(), replicas=p.replicas, load_factor=p.load_factor)
        return placed if p.enabled else {digest: [] for digest in placed}

    def _node(
        self,
        record: NodeRecord,
        target: Manifest,
        selector: dict[str, str],
        plan: ServingPlan,
        owned: Mapping[VersionKey, set[str]],
    ) -> PreviewNode:
        """The node as the preview sees it. It holds the chunks of what it serves and what it
        owns of the active versions it does not serve (seeded; a served version's owned chunks
        of other artifacts it fetches only to relay them, so they are not counted)."""
        node_id, hardware_class = record.node_id, record.hardware_class
        reports = self._fleet.reported(node_id)
        timing = not _timing_off(reports)
        targeted = matches(selector, record.labels)
        artifacts = artifacts_to_fetch(target, self._verdict(target, hardware_class), timing) if targeted else []
        holds = self._served_chunks(record, plan, reports, timing)
        serves = plan.serving(node_id, record.labels)
        for key, digests in owned.items():
            if key not in serves:
                holds |= digests
        return PreviewNode(node_id, record.site, targeted, tuple(a.artifact for a in artifacts), frozenset(holds))

    def _served_chunks(
        self, record: NodeRecord, plan: ServingPlan, reports: list[ModelInfo] | None, timing: bool
    ) -> set[str]:
        """Chunks of what the node serves now: the versions its last heartbeat reports ready
        (the artifact it names, or every one when it timed them), else, without a heartbeat,
        what the plan has it serve."""
        held: set[str] = set()
        if reports is not None:
            served = [
                (m.name, m.version, m.choice.artifact if m.choice else None, _timed(m)) for m in reports
                if m.state == "ready"
            ]  # fmt: skip
        else:
            served = [(n, v, None, False) for n, v in plan.serving(record.node_id, record.labels)]
        for name, version, artifact, timed in served:
            stored = self._store.get_version(name, version)
            if stored is None:
                continue
            m = stored.manifest
            if timed:
                held |= chunks_of(m.artifacts())
                continue
            named = m.artifact_named(artifact) if artifact else None
            held |= chunks_of(
                [named] if named else artifacts_to_fetch(m, self._verdict(m, record.hardware_class), timing)
            )
        return held

    def _verdict(self, manifest: Manifest, hardware_class: str) -> str | None:
        """The artifact the class's verdict names, used as the desired state does: only for a
        version with alternatives."""
        return self._verdict_of(manifest.key, hardware_class) if manifest.alternatives and hardware_class else None


def _owned_by_node(
    placements: Mapping[VersionKey, Mapping[str, Sequence[str]]],
) -> dict[str, dict[VersionKey, set[str]]]:
    """node id → version → the digests it owns there (one pass over every placement)."""
    owned: dict[str, dict[VersionKey, set[str]]] = {}
    for key, placement in placements.items():
        for digest, owners in placement.items():
            for owner in owners:
                owned.setdefault(owner, {}).setdefault(key, set()).add(digest)
    return owned


def _timed(report: ModelInfo) -> bool:
    """Whether the node timed every artifact of the version itself: it fetched them all to
    do so, and keeps the ones it does not serve in its cache (a delta of any of them is
    cheap for it), so all of them count as held, not only the one it serves."""
    return report.choice is not None and report.choice.source == "measured"


def _timing_off(reports: list[ModelInfo] | None) -> bool:
    """Whether the node said it does not time artifacts (its choices fall back to the default)."""
    return any(
        m.choice is not None and m.choice.source == "default" and "timing is off" in m.choice.reason
        for m in reports or []
    )
