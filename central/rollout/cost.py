"""What a rollout will cost in bytes, before it starts: per node, per site, and from central.

A pure function of what central knows (the version's manifest, the placement the version
will get, what each node holds), so it is cheap, writes nothing and can be checked
against what the edges report they fetched once the rollout ran.

The model follows the edge's fetch path (``edge_node.fetch.fetcher``) chunk by chunk:

- **What a node fetches.** A targeted node fetches the chunks of the artifact(s) it will
  serve (``artifacts_to_fetch``: a pinned artifact, the only one, the verdict of its
  hardware class, else every artifact, which it times); every node, targeted or not, also
  seeds the chunks it owns of the version (its desired state lists every active version);
  an owner that serves the version fetches what it owns of other artifacts only when a
  peer asks it for them (a relay). Minus what it holds already: chunks shared with a
  version it serves or seeds.
- **From where.** The owners of a chunk are those of the first active version holding it
  (models, then versions, sorted: what central and the edge both use). A node that is no
  owner, or owns the chunk at rank k > 0, asks the owners ahead of it, same site first,
  and takes the chunk from the first of them (who relays it if it lacks it: that owner's
  own fetch is counted at that owner). The first owner, and every node of a chunk nobody
  owns (placement off), fetches from central.
- **Central egress** is the sum of the nodes' bytes from central: about once per new
  chunk (its first owner), not once per node.

Assumptions, said in ``RolloutPreview.assumptions`` too: every targeted node switches
(waves and canaries change when bytes move, not how many); every first try succeeds (no
peer timeouts, refusals or retries, which would move bytes to central or to later owners);
membership does not change meanwhile; nothing held is evicted; a node holds the chunks of
what it serves now and of everything it owns of the active versions (seeding is not
reported, so it is taken as done)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from fleetwire.manifest import ArtifactRef, Manifest

__all__ = [
    "ASSUMPTIONS",
    "PIN_LABEL",
    "NodeCost",
    "PreviewNode",
    "RolloutPreview",
    "SiteCost",
    "artifacts_to_fetch",
    "owner_map",
    "preview_costs",
]

VersionKey = tuple[str, str]
#: The manifest label that pins the artifact every node serves (the edge reads the same one).
PIN_LABEL = "modelfleet.artifact"
ASSUMPTIONS = (
    "every targeted node switches to the version (waves change when, not how many bytes move)",
    "each chunk comes from the first source the edge tries: no peer timeouts, refusals or retries",
    "membership and placement stay as they are now; nothing held is evicted from a cache",
    "a node holds the chunks of what it serves now (its last heartbeat, else the rollout plan)"
    " and of everything it owns of the active versions (seeding is taken as done)",
    "a node with no verdict for its hardware class fetches every artifact of a version that has several,"
    " to time them (unless its heartbeat says timing is off: then the default only)",
)


@dataclass(frozen=True)
class PreviewNode:
    """One node as the preview sees it."""

    node_id: str
    site: str
    #: Whether the rollout's selector picks it (it will serve the version).
    targeted: bool
    #: Names of the artifacts it fetches to serve the version (empty when not targeted).
    artifacts: tuple[str, ...] = ()
    #: Digests it holds now (any version, any model).
    holds: frozenset[str] = frozenset()


@dataclass
class NodeCost:
    """Bytes one node will fetch for the rollout, by source."""

    node_id: str
    site: str
    targeted: bool
    artifacts: list[str]
    chunks: int = 0
    bytes_total: int = 0
    bytes_from_peers: int = 0
    bytes_from_own_site: int = 0
    bytes_from_other_sites: int = 0
    bytes_from_central: int = 0
    #: Bytes of what it needs that it holds already (shared with what it serves or seeds).
    bytes_reused: int = 0

    def add(self, size: int, source: str) -> None:
        """Count one chunk of ``size`` bytes from ``source``: central, own_site or other_sites."""
        self.chunks += 1
        self.bytes_total += size
        if source == "central":
            self.bytes_from_central += size
            return
        self.bytes_from_peers += size
        if source == "own_site":
            self.bytes_from_own_site += size
        else:
            self.bytes_from_other_sites += size


@dataclass
class SiteCost:
    """A site's nodes together; ``bytes_in`` is what crosses its WAN link inward."""

    site: str
    nodes: int = 0
    bytes_total: int = 0
    bytes_from_peers: int = 0
    bytes_from_own_site: int = 0
    bytes_from_other_sites: int = 0
    bytes_from_central: int = 0

    @property
    def bytes_in(self) -> int:
        """Bytes from outside the site: central's and other sites' peers'."""
        return self.bytes_from_central + self.bytes_from_other_sites


@dataclass
class RolloutPreview:
    """The whole preview, as the API returns it (``as_dict``)."""

    model: str
    version: str
    previous_version: str | None
    targets: list[str]
    nodes: list[NodeCost]
    sites: list[SiteCost]
    placement_enabled: bool = True
    #: Why a real start would be refused now (a rollout in progress, ...), else None.
    refused: str | None = None
    assumptions: list[str] = field(default_factory=lambda: list(ASSUMPTIONS))

    @property
    def central_egress_bytes(self) -> int:
        """Bytes central will send, all nodes together."""
        return sum(n.bytes_from_central for n in self.nodes)

    def as_dict(self) -> dict[str, object]:
        """JSON form: per node, per site (with ``bytes_in``) and totals."""
        nodes = [asdict(n) for n in self.nodes]
        return {
            "model": self.model,
            "version": self.version,
            "previous_version": self.previous_version,
            "dry_run": True,
            "refused": self.refused,
            "placement_enabled": self.placement_enabled,
            "targets": self.targets,
            "nodes": nodes,
            "sites": [{**asdict(s), "bytes_in": s.bytes_in} for s in self.sites],
            "totals": {
                "nodes_fetching": sum(1 for n in self.nodes if n.bytes_total),
                "bytes_total": sum(n.bytes_total for n in self.nodes),
                "bytes_from_peers": sum(n.bytes_from_peers for n in self.nodes),
                "bytes_cross_site": sum(n.bytes_from_other_sites for n in self.nodes),
                "central_egress_bytes": self.central_egress_bytes,
            },
            "assumptions": self.assumptions,
        }


def artifacts_to_fetch(manifest: Manifest, verdict: str | None, timing: bool = True) -> list[ArtifactRef]:
    """The artifacts a node fetches to serve ``manifest``, as ``edge_node.sync.selection``
    decides: the pinned one, the only one, its class's verdict, else all (timed) or the
    default (timing off)."""
    for name in (manifest.labels.get(PIN_LABEL), verdict):
        chosen = manifest.artifact_named(name) if name is not None else None
        if chosen is not None:
            return [chosen]
    artifacts = manifest.artifacts()
    return artifacts if timing else artifacts[:1]


def chunks_of(artifacts: Iterable[ArtifactRef]) -> set[str]:
    """Digests of every file of ``artifacts``."""
    return {c.digest for a in artifacts for c in a.all_chunks()}


def owner_map(
    keys: Iterable[VersionKey], placements: Mapping[VersionKey, Mapping[str, Sequence[str]]]
) -> dict[str, list[str]]:
    """digest → owners under the first of ``keys`` (sorted) that holds it: the owners both
    central's origin rule and the edge's fetcher go by when versions share a chunk."""
    owners: dict[str, list[str]] = {}
    for key in sorted(keys):
        for digest, listed in placements.get(key, {}).items():
            owners.setdefault(digest, list(listed))
    return owners


def _source(node: PreviewNode, owners: Sequence[str], site_of: Mapping[str, str]) -> str | None:
    """The peer ``node`` gets a chunk owned by ``owners`` from (the first owner ahead of it,
    same site first), or None: from central."""
    ahead = list(owners[: owners.index(node.node_id)]) if node.node_id in owners else list(owners)
    ahead = [o for o in ahead if o in site_of]  # an owner the fleet lists no address for is skipped
    same = [o for o in ahead if site_of[o] == node.site]
    chosen = same or ahead
    return chosen[0] if chosen else None


def _wanted(
    target: Manifest, nodes: Sequence[PreviewNode], placement: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """digest → the nodes that fetch it of their own accord: a target the chunks of the
    artifacts it will serve, any other node the chunks it owns (it seeds them). A target
    does not seed what it owns of artifacts it does not serve: it fetches those only when a
    peer asks it for them (``preview_costs`` follows such relays)."""
    wanted: dict[str, list[str]] = {}
    serving = {a.artifact: chunks_of([a]) for a in target.artifacts()}
    for node in nodes:
        if node.targeted:
            digests = set().union(*(serving.get(a, set()) for a in node.artifacts))
            for digest in digests:
                wanted.setdefault(digest, []).append(node.node_id)
    seeders = {n.node_id for n in nodes if not n.targeted}
    for digest, owners in placement.items():
        wanted.setdefault(digest, []).extend(o for o in owners if o in seeders)
    return wanted


def preview_costs(
    target: Manifest,
    nodes: Sequence[PreviewNode],
    target_placement: Mapping[str, Sequence[str]],
    owners: Mapping[str, Sequence[str]],
) -> list[NodeCost]:
    """Per node (those that fetch or are targeted), the bytes the rollout of ``target`` makes
    it fetch. ``target_placement``: the version's own placement (who seeds what);
    ``owners``: digest → owners the fetch goes by (``owner_map`` over every active key).

    Chunk by chunk: each node that wants it and lacks it fetches it once from its source;
    a peer source that lacks it fetches it too (a relay), once, from its own source."""
    sizes = {c.digest: c.size for c in target.unique_chunks()}
    by_id = {n.node_id: n for n in nodes}
    site_of = {n.node_id: n.site for n in nodes}
    costs = {n.node_id: NodeCost(n.node_id, n.site, n.targeted, list(n.artifacts)) for n in nodes}
    for digest, wanting in sorted(_wanted(target, nodes, target_placement).items()):
        size, fetching, done = sizes[digest], list(wanting), set()
        while fetching:
            node = by_id[fetching.pop()]
            if node.node_id in done:
                continue
            done.add(node.node_id)
            if digest in node.holds:
                costs[node.node_id].bytes_reused += size
                continue
            peer = _source(node, owners.get(digest, ()), site_of)
            if peer is None:
                costs[node.node_id].add(size, "central")
                continue
            costs[node.node_id].add(size, "own_site" if site_of[peer] == node.site else "other_sites")
            if digest not in by_id[peer].holds:
                fetching.append(peer)  # it relays: it fetches the chunk itself first
    return [costs[n] for n in sorted(costs) if costs[n].targeted or costs[n].chunks]


def site_totals(costs: Iterable[NodeCost]) -> list[SiteCost]:
    """``costs`` summed per site, sites sorted by name."""
    sites: dict[str, SiteCost] = {}
    for c in costs:
        s = sites.setdefault(c.site, SiteCost(c.site))
        s.nodes += 1
        s.bytes_total += c.bytes_total
        s.bytes_from_peers += c.bytes_from_peers
        s.bytes_from_own_site += c.bytes_from_own_site
        s.bytes_from_other_sites += c.bytes_from_other_sites
        s.bytes_from_central += c.bytes_from_central
    return [sites[name] for name in sorted(sites)]
