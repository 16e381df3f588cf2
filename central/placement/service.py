"""Central's view of who owns which chunk, kept current as edges join and leave.

The service is the single place that answers "which edges own this digest" and
"may this edge pull it from origin". Origin egress is the scarce resource: with
placement on, only a chunk's first owner fetches it from origin and everyone
else fetches from an owner, falling back to origin only when every owner ahead
of them has failed. Pure in-memory and synchronous so callers can wrap it in
whatever locking or event loop they use.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from central.placement.ring import Placement, RingMember, place
from central.placement.sites import place_by_site

__all__ = ["PlacementService", "VersionKey"]

#: (model name, version) of one active model version.
VersionKey = tuple[str, str]


class PlacementService:
    """Holds ring membership and the placement of every active model version."""

    def __init__(
        self, *, replicas: int = 2, load_factor: float = 1.25, enabled: bool = True, site_aware: bool = False
    ) -> None:
        """Start with no members and no versions.

        ``enabled=False`` is the naive baseline where every edge fetches from
        origin: placements are still computed (so toggling is instant) but every
        owners list reads as empty. ``site_aware``: owners in every site
        (``central.placement.sites``); off, one ring over all members, sites ignored.
        """
        # Validate the settings now rather than on the first join.
        place([], [], replicas=replicas, load_factor=load_factor)
        self.replicas = replicas
        self.load_factor = load_factor
        self.enabled = enabled
        self.site_aware = site_aware
        self._members: dict[str, RingMember] = {}
        self._versions: dict[VersionKey, list[str]] = {}
        self._placements: dict[VersionKey, Placement] = {}
        self._digest_keys: dict[str, list[VersionKey]] = {}

    def members(self) -> list[RingMember]:
        """Current ring members, sorted by node id."""
        return [self._members[node_id] for node_id in sorted(self._members)]

    def join(self, member: RingMember) -> bool:
        """Add a member or change its capacity; True if membership changed.

        All versions are recomputed canonically: a joining node takes its share
        as the ring says, so placement converges back to the canonical layout.
        """
        if self._members.get(member.node_id) == member:
            return False
        self._members[member.node_id] = member
        for key in self._versions:
            self._placements[key] = self._place(key, previous=None)
        return True

    def leave(self, node_id: str) -> bool:
        """Remove a member; True if it was one.

        Recomputed in sticky mode so only the (digest, owner) pairs the leaver
        held move: the surviving owners already have the bytes.
        """
        if self._members.pop(node_id, None) is None:
            return False
        for key in self._versions:
            self._placements[key] = self._place(key, previous=self._placements.get(key))
        return True

    def set_versions(self, versions: Mapping[VersionKey, Sequence[str]]) -> None:
        """Replace the set of active versions (key -> chunk digests in file order).

        New keys (or keys whose digest set changed) are placed canonically,
        removed keys are dropped, unchanged keys keep their current placement so
        a routine refresh never reshuffles bytes already on the edges.
        """
        placements: dict[VersionKey, Placement] = {}
        stored: dict[VersionKey, list[str]] = {}
        for key, digests in versions.items():
            stored[key] = list(digests)
            old = self._versions.get(key)
            if old is not None and set(old) == set(digests) and key in self._placements:
                placements[key] = self._placements[key]
            else:
                placements[key] = self._compute(stored[key], previous=None)
        self._versions = stored
        self._placements = placements
        self._reindex()

    def placement(self, key: VersionKey) -> dict[str, list[str]]:
        """Digest -> owners for one version, in file order; {} for an unknown key."""
        current = self._placements.get(key)
        if current is None:
            return {}
        return {digest: self._visible(owners) for digest, owners in current.items()}

    def owners(self, digest: str) -> list[str]:
        """Owners of ``digest`` under the first (sorted) version key containing it.

        A digest shared by versions may be owned differently in each (loads are
        bounded per version); the sorted-first rule makes the answer stable.
        """
        keys = self._digest_keys.get(digest)
        if not keys:
            return []
        return self._visible(self._placements[keys[0]][digest])

    def versions_of(self, digest: str) -> list[VersionKey]:
        """The active versions whose manifests hold ``digest`` (sorted; [] for none)."""
        return list(self._digest_keys.get(digest, []))

    def owns(self, node_id: str, digest: str) -> bool:
        """Whether ``node_id`` owns ``digest`` in any active version (never when disabled)."""
        if not self.enabled:
            return False
        return any(node_id in self._placements[key][digest] for key in self._digest_keys.get(digest, []))

    def owned_by(self, node_id: str) -> set[str]:
        """Digests ``node_id`` owns in any active version (empty when disabled)."""
        if not self.enabled:
            return set()
        return {
            digest for current in self._placements.values() for digest, owners in current.items() if node_id in owners
        }

    def origin_allowed(self, digest: str, requester: str, failed_owners: Collection[str]) -> tuple[bool, list[str]]:
        """Origin protection: may ``requester`` fetch ``digest`` from origin?

        Allowed when placement is disabled, when the digest has no owners, or
        when every owner ahead of the requester has failed (so the first owner is
        always allowed; a non-owner needs all owners failed). With several
        versions it is allowed if any version's owners list allows it. Returns
        the owners list that decided (the allowing one, else ``owners(digest)``).
        """
        if not self.enabled:
            return True, []
        failed = set(failed_owners)
        for key in self._digest_keys.get(digest, []):
            owners = list(self._placements[key][digest])
            if _ahead_all_failed(owners, requester, failed):
                return True, owners
        owners = self.owners(digest)
        return not owners, owners

    def export(self) -> dict[str, dict[str, list[str]]]:
        """Every version's placement as plain JSON (``"model/version"`` → digest → owners): what
        the leader of a replicated central stores for its followers."""
        return {
            f"{name}/{version}": {d: list(o) for d, o in p.items()} for (name, version), p in self._placements.items()
        }

    def restore(self, body: Mapping[str, Mapping[str, Sequence[str]]]) -> int:
        """Take the leader's placements (``export``'s form) for every active version whose
        digests they cover exactly, so a follower hands out the leader's owners, not its own
        guess; versions the leader has not placed yet keep the local placement. Returns how
        many versions were taken."""
        taken = 0
        for key, digests in self._versions.items():
            stored = body.get(f"{key[0]}/{key[1]}")
            if stored is None or set(stored) != set(digests):
                continue
            self._placements[key] = {d: list(stored[d]) for d in digests}
            taken += 1
        if taken:
            self._reindex()
        return taken

    def _place(self, key: VersionKey, previous: Placement | None) -> Placement:
        """Place one version's digests under the current membership."""
        return self._compute(self._versions[key], previous)

    def _compute(self, digests: Sequence[str], previous: Placement | None) -> Placement:
        """``digests`` placed over the current members, per site when site-aware."""
        placer = place_by_site if self.site_aware else place
        return placer(digests, self.members(), replicas=self.replicas, load_factor=self.load_factor, previous=previous)

    def _visible(self, owners: Sequence[str]) -> list[str]:
        """Owners as callers see them: a copy, or [] when placement is disabled."""
        return list(owners) if self.enabled else []

    def _reindex(self) -> None:
        """Rebuild digest -> sorted version keys, so lookups by digest stay O(1)."""
        index: dict[str, list[VersionKey]] = {}
        for key in sorted(self._placements):
            for digest in self._placements[key]:
                index.setdefault(digest, []).append(key)
        self._digest_keys = index


def _ahead_all_failed(owners: Sequence[str], requester: str, failed: set[str]) -> bool:
    """True when every owner standing ahead of ``requester`` is in ``failed``."""
    ahead = owners[: owners.index(requester)] if requester in owners else owners
    return all(owner in failed for owner in ahead)
