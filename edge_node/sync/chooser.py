"""Which of a version's artifacts this node fetches, pins and serves.

In order: an operator's pin (the signed manifest label ``modelfleet.artifact``) wins; a
version with one artifact serves it; a choice this node made before for the same version
and hardware class stands (kept in ``choices.json`` across restarts); then central's
verdict for this node's class (another node timed the artifacts: this one fetches only
the chosen one); else, with timing on, every artifact is fetched and timed here
(``edge_node.inference.artifact_timer``; a language model by decode tokens/s), and the
losers' chunks are unpinned afterwards.

The served artifact goes through assembly and loading as a manifest whose top-level fields
describe it (``served_as``): the store and the session cache key on those. That copy keeps
the original's signature and lists the original's default artifact first among its
alternatives, so ``signed_form`` can rebuild the manifest central signed and a copy on disk
is verified like any other."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from edge_node.inference.artifact_timer import PIN_LABEL, ArtifactChoice, ArtifactTimer
from edge_node.inference.shadow import shadow_companion
from edge_node.sync.saved_choices import SavedChoices
from edge_node.sync.state import DesiredVersion
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest

log = logging.getLogger(__name__)

__all__ = ["ArtifactChooser", "served_as", "signed_form"]

Key = tuple[str, str]


def served_as(manifest: Manifest, artifact: str) -> Manifest:
    """``manifest`` with its top-level fields describing ``artifact`` (itself if it already does)."""
    if artifact == manifest.artifact:
        return manifest
    chosen = manifest.artifact_named(artifact)
    if chosen is None:
        raise ValueError(f"{manifest.name}:{manifest.version} has no artifact {artifact!r}")
    return manifest.model_copy(
        update={
            "artifact": chosen.artifact,
            "sha256": chosen.sha256,
            "size": chosen.size,
            "chunks": chosen.chunks,
            "files": chosen.files,
            "quantization": chosen.quantization,
            "alternatives": [manifest.served(), *manifest.alternatives],
        }
    )


def signed_form(copy: Manifest) -> Manifest | None:
    """The manifest a ``served_as`` copy was made from (None: ``copy`` is no such copy). Its
    signature verifies only if it is that manifest; the caller checks it."""
    if not copy.alternatives or copy.alternatives[0].artifact == copy.artifact:
        return None
    default = copy.alternatives[0]
    original = copy.model_copy(
        update={
            "artifact": default.artifact,
            "sha256": default.sha256,
            "size": default.size,
            "chunks": default.chunks,
            "files": default.files,
            "quantization": default.quantization,
            "alternatives": copy.alternatives[1:],
        }
    )
    return original if original.artifact_named(copy.artifact) == copy.served() else None


def _servable(m: Manifest, artifact: str) -> bool:
    """Whether ``artifact`` is one ``m`` may serve (a pending candidate is not, until promoted)."""
    return any(a.artifact == artifact for a in m.artifacts())


class ArtifactChooser:
    """Decides, per version, the artifact to serve and which artifacts to fetch for it: the
    :class:`ArtifactChoice` of each, made by the rules above (timing on this node with the
    :class:`ArtifactTimer` last), remembered across restarts in :class:`SavedChoices`."""

    def __init__(
        self,
        hardware_class: str = "",
        node_id: str = "",
        timer: ArtifactTimer | None = None,
        saved: SavedChoices | None = None,
        shadow_sample: float = 0.0,
    ) -> None:
        self.hardware_class = hardware_class
        #: Share of an INT8 version's requests checked against FP32 (``edge_node.inference.shadow``):
        #: above 0, FP32 is fetched and assembled beside the INT8 artifact served.
        self.shadow_sample = shadow_sample
        #: Versions served unchecked: the cache cannot hold their FP32 reference beside them.
        self.unchecked: set[Key] = set()
        self.node_id = node_id
        self._timer = timer
        self._saved = saved
        #: The choice behind every version this node serves now: what its heartbeat reports.
        self.choices: dict[Key, ArtifactChoice] = {}

    def _choice(self, artifact: str, source: str, reason: str, **extra: object) -> ArtifactChoice:
        return ArtifactChoice(artifact, self.hardware_class, source, reason, **extra)  # type: ignore[arg-type]

    def decided(self, version: DesiredVersion) -> ArtifactChoice | None:
        """The artifact ``version`` is served as without timing anything, or None: time them."""
        m = version.manifest
        forced = version.force_artifact
        if forced is not None:
            if m.artifact_named(forced) is not None:
                return self._choice(forced, "central", "fallback by central")
            log.warning("%s:%s: central forces %r, which it has no artifact of; ignoring it", m.name, m.version, forced)
        pin = m.labels.get(PIN_LABEL)
        if pin is not None:
            if m.artifact_named(pin) is not None:
                return self._choice(pin, "pinned", f"pinned by label {PIN_LABEL}")
            log.warning("%s:%s pins %r, which it has no artifact of; ignoring the pin", m.name, m.version, pin)
        if len(m.artifacts()) == 1:
            return self._choice(m.artifact, "only", f"only {m.artifact}")
        mine = self.choices.get(m.key)
        if mine is None and self._saved is not None:
            mine = self._saved.get(m, self.hardware_class)
        if mine is not None and mine.source not in ("central", "only") and _servable(m, mine.artifact):
            # A fallback central ordered is not this node's choice: it ends with the order; nor is
            # the only artifact of a manifest re-issued with more (a pending INT8 promoted).
            return mine
        v = version.verdict
        if v is not None and m.artifact_named(v.artifact) is not None:
            reason = f"verdict of class {v.hardware_class} from node {v.node_id}"
            return self._choice(
                v.artifact, "verdict", reason, speedup_b1=v.speedup_b1, speedup_b8=v.speedup_b8, from_node=v.node_id
            )
        if self._timer is None:
            return self._choice(m.artifact, "default", "central's default (timing is off on this node)")
        return None

    def plan(self, version: DesiredVersion) -> list[ArtifactRef]:
        """The artifacts to fetch for serving ``version``: the decided one (and its FP32
        reference when it is INT8 checked on live traffic), or all to time."""
        m = version.manifest
        decided = self.decided(version)
        if decided is None:
            return m.artifacts()
        chosen = m.artifact_named(decided.artifact) or m.served()
        companion = self.companion(version, decided.artifact)
        return [chosen] if companion is None else [chosen, companion]

    def companion(self, version: DesiredVersion, served: str) -> ArtifactRef | None:
        """The artifact assembled beside ``served`` for the live shadow (``edge_node.inference.shadow``):
        FP32 to check a served INT8 (or a language model's INT4/INT8 weights, scored teacher-forced
        by ``edge_node.generation.shadow``) against, or a pending INT8 candidate beside a served FP32;
        or None. A cache too small for it serves unchecked (``Admission``)."""
        if version.manifest.key in self.unchecked:
            return None
        return shadow_companion(version.manifest, served, self.shadow_sample)

    def serving_chunks(self, version: DesiredVersion) -> list[ChunkRef]:
        """Unique chunks of the planned artifacts, in file order."""
        seen: set[str] = set()
        out: list[ChunkRef] = []
        for artifact in self.plan(version):
            for c in artifact.all_chunks():
                if c.digest not in seen:
                    seen.add(c.digest)
                    out.append(c)
        return out

    def time(self, manifest: Manifest, paths: Mapping[str, Path]) -> ArtifactChoice:
        """Time the assembled artifacts ``paths`` (blocking); on any failure serve the default."""
        if self._timer is None:
            return self._choice(manifest.artifact, "default", "central's default (timing is off on this node)")
        keys = {a.artifact: a.sha256 for a in manifest.artifacts()}
        try:
            if manifest.is_language_model:
                return self._timer.choose_decoder(paths)
            return self._timer.choose({a: (p, keys[a]) for a, p in paths.items()})
        except Exception as exc:
            log.warning("%s:%s: timing failed (%s); serving the default artifact", manifest.name, manifest.version, exc)
            return self._choice(manifest.artifact, "default", f"central's default (timing failed: {exc})")

    def adopt(self, manifest: Manifest, choice: ArtifactChoice) -> None:
        """``choice`` now serves ``manifest``'s version: report it, and remember what was timed."""
        self.choices[manifest.key] = choice
        if self._saved is not None and choice.source in ("measured", "verdict"):
            self._saved.put(manifest, choice)

    def keep(self, keys: Iterable[Key]) -> None:
        """Forget the choices of versions this node no longer serves."""
        wanted = set(keys)
        for key in set(self.choices) - wanted:
            del self.choices[key]
        if self._saved is not None:
            self._saved.keep(wanted)
