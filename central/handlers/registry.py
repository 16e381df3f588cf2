"""What operators do with models: push, list, describe and delete versions. One method per
use case; a push is one call that runs the rollouts' check, the pipeline, the event and the
activation (MLServer's ``handlers/dataplane.py`` for the registry)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from central.distribution import DesiredStateService
from central.errors import NotFound
from central.events import operator_event
from central.placement import PlacementService
from central.registry.service import RegistryService
from central.registry.staging import StagedFile, StagedUpload, Staging
from central.rollout import RolloutService
from central.storage.protocols import VersionRecord
from fleetwire.manifest import SERVED_BY, Manifest
from fleetwire.mqtt.payloads import Event


@dataclass
class PushRequest:
    """A received push: the staged model, calibration and the metadata that came with it."""

    upload: StagedUpload
    version: str | None
    labels: dict[str, str]
    calibration: StagedFile | None = None
    keep_fp32: bool = False
    #: The ``eval`` part: inputs plus a ``label`` array the accuracy guard judges on.
    eval_data: StagedFile | None = None

    def discard(self) -> None:
        """Delete every staged file of this request (calibration is in the same directory)."""
        self.upload.discard()


@dataclass(frozen=True)
class PushOptions:
    """``threshold`` (None: central's setting) and ``dims`` of one push; ``require_int8``:
    refuse (422) rather than serve FP32 when INT8 cannot be made or proven."""

    threshold: float | None = None
    dims: dict[str, int] = field(default_factory=dict)
    require_int8: bool = False


def served_reason(manifest: Manifest) -> str | None:
    """Why a version is served as FP32 though central quantizes ("INT8 unproven: ..."); None
    when it serves INT8, or when quantization is off."""
    q = manifest.quantization or {}
    int8 = q.get("int8") or {}
    if manifest.artifact != "fp32" or not int8.get("reason"):
        return None
    return f"INT8 {int8['status']}: {int8['reason']}"


def served_by(manifest: Manifest) -> list[str]:
    """The APIs an edge serves this version by (a language model: completions, chat, generate)."""
    return [path.replace("{name}", manifest.name) for path in SERVED_BY.get(manifest.kind, [])]


def version_summary(r: VersionRecord) -> dict[str, Any]:
    """One stored version as the API lists it."""
    m = r.manifest
    return {
        "name": r.name,
        "version": r.version,
        "seq": r.seq,
        "size": m.size,
        "total_size": m.served().total_size,
        "files": [f.path for f in m.files],
        "sha256": m.sha256,
        "chunks": len(m.chunks),
        "labels": m.labels,
        "artifact": m.artifact,
        "artifacts": sorted(r.artifacts),
        "kind": m.kind,
        "served_by": served_by(m),
        "quantization": m.quantization,
        "served_reason": served_reason(m),
        "created_at": r.created_at,
    }


class RegistryHandlers:
    """Push, list, describe and delete model versions."""

    def __init__(
        self,
        registry: RegistryService,
        rollouts: RolloutService,
        staging: Staging,
        placement: PlacementService,
        desired: DesiredStateService,
        record_event: Callable[[Event], None],
    ) -> None:
        self._registry = registry
        self._rollouts = rollouts
        #: Where uploads are streamed to before the pipeline runs.
        self.staging = staging
        self._placement = placement
        self._desired = desired
        self._record_event = record_event

    async def check_push(self, name: str, version: str | None) -> None:
        """Refuse a push before its body is read (bad name, version taken)."""
        await self._registry.check_request(name, version)

    async def push(
        self, name: str, pushed: PushRequest, options: PushOptions, *, activate: bool, actor: str
    ) -> dict[str, Any]:
        """Store a version (its staged files are discarded whatever happens) and, with
        ``activate``, make it what every node serves; the manifest and the pipeline's report."""
        try:
            self._rollouts.before_push(name, activate)
            result = await self._registry.push(
                name,
                pushed.version,
                pushed.labels,
                pushed.upload,
                calibration=pushed.calibration.path if pushed.calibration else None,
                keep_fp32=pushed.keep_fp32,
                eval_data=pushed.eval_data.path if pushed.eval_data else None,
                threshold=options.threshold,
                dims=options.dims,
                require_int8=options.require_int8,
                in_commit=self._rollouts.activation(name) if activate else None,
            )
        finally:
            pushed.discard()
        m = result.manifest
        detail = {"model": name, "version": m.version, "sha256": m.sha256, "size": m.size, "activate": activate}
        self._record_event(operator_event("model_pushed", actor, detail))
        if activate:  # before the coalesced refresh runs: one plan, the new stable version
            self._rollouts.activated(name, m.version, actor)
        return {"manifest": m.model_dump(), "report": result.report}

    async def describe(self, name: str, version: str | None) -> tuple[Manifest, list[str]] | None:
        """The gateway's catalog: a version's manifest (None: the newest) and every stored
        version of the model; None when the model or that version is unknown."""
        return await self._registry.describe(name, version)

    async def list_models(self) -> list[dict[str, Any]]:
        """Every model: name, latest version, how many versions, and what the latest serves
        (``artifact``; ``served_reason`` when it is FP32 because INT8 could not be served)."""
        return [self._model_summary(vars(m), r.manifest if r else None) for m, r in await self._registry.latest()]

    @staticmethod
    def _model_summary(model: dict[str, Any], manifest: Manifest | None) -> dict[str, Any]:
        """The model's row with its newest version's served artifact and why it is FP32
        (``manifest`` None: the model's newest version was deleted since the list was read)."""
        artifact = manifest.artifact if manifest else None
        return {
            **model,
            "artifact": artifact,
            "kind": manifest.kind if manifest else None,
            "served_by": served_by(manifest) if manifest else [],
            "served_reason": served_reason(manifest) if manifest else None,
        }

    async def list_versions(self, name: str) -> list[dict[str, Any]]:
        """The versions of one model, oldest first."""
        return [version_summary(r) for r in await self._registry.list_versions(name)]

    async def manifest(self, name: str, version: str, artifact: str | None = None) -> dict[str, Any]:
        """The served manifest of a version, or that of one of its artifacts."""
        record = await self._registry.get(name, version)
        if artifact is None:
            return record.manifest.model_dump()
        if artifact not in record.artifacts:
            raise NotFound(f"{name}:{version} has no {artifact!r} artifact; it has: {', '.join(record.artifacts)}")
        return record.artifacts[artifact].model_dump()

    async def delete(self, name: str, version: str, actor: str) -> None:
        """Delete a version no node serves or may serve (409 otherwise) and its unshared chunks."""
        self._rollouts.check_deletable(name, version)
        await self._registry.delete(name, version)
        self._record_event(operator_event("version_deleted", actor, {"model": name, "version": version}))

    @property
    def generation(self) -> int:
        """The desired state's generation (a push's placement shows once it moved)."""
        return self._desired.generation

    async def placed(self, generation: int) -> None:
        """Let the coalesced desired-state refresh a push scheduled run."""
        for _ in range(10):
            if self._desired.generation != generation:
                return
            await asyncio.sleep(0)

    def placement_summary(self, name: str, version: str) -> dict[str, Any]:
        """How many chunks of the version each node owns (empty while no edge has joined,
        or when the version is stored without being served)."""
        owners: Counter[str] = Counter()
        for nodes in self._placement.placement((name, version)).values():
            owners.update(nodes)
        return {"nodes": len(self._placement.members()), "owners": dict(sorted(owners.items()))}
