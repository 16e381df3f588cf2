"""Which versions of a desired state this node may fetch at all, decided before any chunk is.

Two gates: central's signature on the manifest (``ManifestTrust``: a manifest not signed by
the pinned key is refused, reason ``signature``), and the cache's cap. A version whose
chunks alone exceed the cap is refused up front (never pinned nor fetched, reason
``cache_too_small``): it could only complete by growing the cache past the cap, so it fails
with a reason and the version served now stays. An INT8 version checked against its FP32
reference on live traffic that fits only without that reference is admitted unchecked."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_node.sync.chooser import ArtifactChooser, signed_form
from edge_node.sync.state import DesiredVersion
from edge_node.sync.trust import ManifestTrust
from fleetwire.manifest import Manifest
from fleetwire.signing import SignatureError

__all__ = ["Admission", "SizeVerdict"]

log = logging.getLogger(__name__)

Key = tuple[str, str]


@dataclass
class SizeVerdict:
    """What one pass of the cache-size gate decided."""

    #: Versions refused now, each with whether it was refused for the first time.
    refused: list[tuple[DesiredVersion, bool]] = field(default_factory=list)
    #: Refused versions the desired state no longer holds: their refusal is lifted.
    dropped: list[Key] = field(default_factory=list)


class Admission:
    """The signature and cache-size gates; ``refusals`` holds the versions the cache cannot
    hold, (name, version) → the reason, which the heartbeat reports."""

    def __init__(self, chooser: ArtifactChooser, capacity: Callable[[], int], trust: ManifestTrust | None) -> None:
        self._chooser = chooser
        self._capacity = capacity
        #: Checks central's signature on every manifest before any of its chunks is fetched.
        self._trust = trust
        self.refusals: dict[Key, str] = {}

    def signature_refusal(self, manifest: Manifest) -> str | None:
        """Why ``manifest`` must not be fetched (a bad or missing signature), or None."""
        if self._trust is None:
            return None
        try:
            self._trust.verify(manifest)
        except SignatureError as exc:
            log.error("refusing %s:%s: %s", manifest.name, manifest.version, exc)
            return f"manifest refused: {exc}"
        return None

    def refused_on_disk(self, manifest: Manifest) -> str | None:
        """Why a version found on disk must not be served: the signature refusal of the
        manifest central signed (the one a ``served_as`` copy was made from, when it is one)."""
        if self._trust is None:
            return None
        try:
            self._trust.verify(manifest)
            return None
        except SignatureError:
            original = signed_form(manifest)  # a served_as copy: its original must verify
        return self.signature_refusal(original if original is not None else manifest)

    def check_sizes(self, wanted: dict[Key, DesiredVersion]) -> SizeVerdict:
        """Refuse every wanted version whose unique chunks exceed the cache's cap."""
        capacity = self._capacity()
        verdict = SizeVerdict(dropped=[key for key in self.refusals if key not in wanted])
        for key in verdict.dropped:
            del self.refusals[key]
        for key, version in wanted.items():
            needed = self._overflow(key, version, capacity)
            if needed is None:
                self.refusals.pop(key, None)
                continue
            first = key not in self.refusals
            if first:
                m = version.manifest
                reason = (
                    f"cache too small: {m.name}:{m.version} needs {needed} bytes of chunks, the cache cap is"
                    f" {capacity} bytes (MODELFLEET_CACHE_BYTES); keeping the version served now"
                )
                log.error("refusing %s", reason)
                self.refusals[key] = reason
            verdict.refused.append((version, first))
        return verdict

    def _needed(self, version: DesiredVersion) -> int:
        return sum(c.size for c in self._chooser.serving_chunks(version))

    def _overflow(self, key: Key, version: DesiredVersion, capacity: int) -> int | None:
        """The bytes ``version`` needs when the cache cannot hold them, else None (it fits, with
        its FP32 reference or, failing that, served unchecked without it)."""
        unchecked = self._chooser.unchecked
        checked = key not in unchecked
        unchecked.discard(key)
        needed = self._needed(version)
        if needed <= capacity:
            return None
        unchecked.add(key)  # what it serves may fit without its FP32 reference
        if self._needed(version) <= capacity:
            if checked:
                m = version.manifest
                log.warning(
                    "%s:%s: the cache (%d bytes) cannot hold the FP32 reference beside the artifact served;"
                    " serving it without live checks",
                    m.name, m.version, capacity,
                )  # fmt: skip
            return None
        unchecked.discard(key)
        return needed
