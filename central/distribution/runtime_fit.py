"""Which artifacts of a version each node's ONNX Runtime loads.

A push is fitted to central's own ONNX Runtime (``central.registry.runtime_compat``), but edges
run their own, often older, one: a model at opset 21 that central loads fails on every edge
whose runtime stops at opset 20, after the bytes were fetched. So every edge reports what its
runtime loads when it registers (``NodeRecord.runtime``), the push report records each
artifact's IR version and opsets (``formats``), and the desired state of a node holds only
what it can load:

- every artifact loads: nothing changes (the node times them, or takes its class's verdict);
- some do (one converted for an older runtime, or an INT8 one of another opset): the node is
  told to serve the first of those (``force_artifact``);
- none does: central converts the FP32 graph for the node's runtime when ONNX's converter can
  (``central.registry.conversion``; until it is stored the version is not assigned there, and
  the node counts as loading; once stored, a node that still loads none of the artifacts is
  refused like one central cannot convert for), else the version is not assigned to the node and central
  reports it failed there with reason ``runtime``, where the edges' own failures show:
  rollouts' per-node failures, ``GET /api/v1/nodes``, ``modelfleet nodes``.

An edge that does not report its runtime (older than this) is taken to run central's own; a
version pushed before central recorded formats is taken to load everywhere. Pure functions
and a small cache, over plain values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetwire.manifest import Manifest
from fleetwire.runtime_limits import ModelFormat, RuntimeLimits, manifest_formats, runtime_limits

__all__ = ["RUNTIME_REASON", "RuntimeFit", "VersionFit", "fit_version"]

#: The per-node failure reason of a version no artifact of which the node's runtime loads.
RUNTIME_REASON = "runtime"
#: ``convert(manifest, runtime)``: why no artifact can be converted for ``runtime`` (None: under way).
Convert = Callable[[Manifest, RuntimeLimits], "str | None"]
#: Manifests whose formats are kept parsed (one per active version and artifact set).
_CACHED_MANIFESTS = 1024


@dataclass(frozen=True)
class VersionFit:
    """What a node's runtime makes of one version's artifacts."""

    #: The artifacts it loads, in the manifest's order (the default first).
    loadable: tuple[str, ...]
    #: Whether it loads every artifact (then nothing needs forcing).
    every: bool
    #: Why it loads none (the default artifact's reason), for the per-node failure; None: some
    #: load, or one is being converted for it.
    refusal: str | None = None

    def artifact_for(self, wanted: str | None) -> str | None:
        """The artifact to force: ``wanted`` (another rule's choice) when it loads, else the
        first that does when not every one does; None: no need to force one."""
        if wanted is not None and wanted in self.loadable:
            return wanted
        return None if self.every else next(iter(self.loadable), None)


def fit_version(manifest: Manifest, formats: dict[str, ModelFormat], runtime: RuntimeLimits) -> VersionFit:
    """Which of ``manifest``'s servable artifacts ``runtime`` loads, given their ``formats``
    (an artifact without a recorded format is taken to load)."""
    loadable: list[str] = []
    first_refusal: str | None = None
    names = [a.artifact for a in manifest.artifacts()]
    for name in names:
        fmt = formats.get(name)
        why = runtime.refusal(fmt) if fmt is not None else None
        if why is None:
            loadable.append(name)
        elif first_refusal is None:
            first_refusal = f"{name}: {why}"
    if loadable:
        return VersionFit(tuple(loadable), every=len(loadable) == len(names))
    plural = "its only artifact" if len(names) == 1 else f"none of its {len(names)} artifacts loads"
    return VersionFit((), every=False, refusal=f"{manifest.name}:{manifest.version}, {plural}: {first_refusal}")


class RuntimeFit:
    """``fit_version`` for nodes by id, from what each registered with."""

    def __init__(
        self,
        runtime_of: Callable[[str], RuntimeLimits | None],
        own: Callable[[], RuntimeLimits] = runtime_limits,
        convert: Convert | None = None,
    ) -> None:
        """``runtime_of(node_id)``: what the node reported (None: it did not say); ``own``:
        central's runtime, assumed for such nodes; ``convert(manifest, runtime)``: asked for an
        artifact converted for a runtime that loads none, it says why there cannot be one (None:
        one is under way; the node waits for it, unassigned but not failed)."""
        self._runtime_of = runtime_of
        self._own = own
        self._convert = convert
        self._formats: dict[tuple[str, str, str], dict[str, ModelFormat]] = {}

    def runtime(self, node_id: str) -> RuntimeLimits:
        """What ``node_id``'s runtime loads: its report, else central's own."""
        return self._runtime_of(node_id) or self._own()

    def check(self, node_id: str, manifest: Manifest) -> VersionFit:
        """Which artifacts of ``manifest`` ``node_id`` loads."""
        runtime = self.runtime(node_id)
        fit = fit_version(manifest, self._formats_of(manifest), runtime)
        if fit.refusal is None or self._convert is None:
            return fit
        why = self._convert(manifest, runtime)
        if why is None:
            return VersionFit((), every=False)  # converting: not assigned yet, not failed
        return VersionFit((), every=False, refusal=f"{fit.refusal}; central cannot convert it: {why}")

    def _formats_of(self, manifest: Manifest) -> dict[str, ModelFormat]:
        key = (manifest.name, manifest.version, manifest.signature or manifest.sha256)
        found = self._formats.get(key)
        if found is None:
            if len(self._formats) >= _CACHED_MANIFESTS:
                self._formats.clear()  # re-read lazily: a few dicts per active version
            found = self._formats[key] = manifest_formats(manifest.quantization)
        return found
