"""What a heartbeat says about the node, and where each figure comes from.

The publisher only needs a ``Callable[[], HeartbeatBody]``; ``HeartbeatSources`` names
the few readings an edge supplies (addresses, cache counters, model states, refused
versions, load, its own state, its hardware class and the artifact each version is
served as), so the heartbeat depends on those and not on the whole edge object."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from edge_node.cache import CacheStats
from edge_node.inference.load import LoadTracker
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, CacheInfo, GenerationInfo, LoadInfo, ModelInfo, ShadowInfo

__all__ = ["MAX_ERROR_CHARS", "MAX_MODELS", "HeartbeatBody", "HeartbeatSources", "ModelReport"]

#: Longest model error string carried in a heartbeat.
MAX_ERROR_CHARS = 512
#: Most model versions listed in one heartbeat (the payload has a size cap).
MAX_MODELS = 1024


@dataclass(frozen=True)
class HeartbeatBody:
    """What the edge reports in a heartbeat; the publisher adds ids, sequence numbers and time."""

    state: str = "online"
    load: LoadInfo = field(default_factory=LoadInfo)
    models: Sequence[ModelInfo] = ()
    cache: CacheInfo = field(default_factory=CacheInfo)
    grpc_address: str = ""
    http_address: str = ""
    hardware_class: str = ""
    site: str = ""
    #: Since when the node runs without central (Unix seconds); None: synced.
    autonomous_since: float | None = None
    #: Central's clock minus this node's, and the bound on its error (ms); None: unknown.
    clock_offset_ms: float | None = None
    clock_error_ms: float | None = None


def _no_failures() -> Mapping[tuple[str, str], tuple[str, str]]:
    return {}


def _no_choices() -> Mapping[tuple[str, str], ArtifactChoiceInfo]:
    return {}


class ModelReport(Protocol):
    """What a heartbeat reads of one model version (``edge_node.inference.LoadedModel``)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def errors(self) -> int: ...
    @property
    def shadow_info(self) -> ShadowInfo | None: ...
    @property
    def generation_info(self) -> GenerationInfo | None: ...


@dataclass(frozen=True)
class HeartbeatSources:
    """The readings a heartbeat is built from, each called at every beat."""

    addresses: Callable[[], tuple[str, str]]
    """The gRPC and HTTP addresses the node announces (known once its listeners are bound)."""
    cache: Callable[[], CacheStats]
    """The chunk cache's figures."""
    models: Callable[[], Iterable[ModelReport]]
    """Every model version ONNX Runtime knows, with its state."""
    refusals: Callable[[], Mapping[tuple[str, str], str]]
    """Versions refused before loading, (name, version) → reason (e.g. a cache too small)."""
    load: LoadTracker
    """Request load figures."""
    state: Callable[[], str]
    """The node's own state: ``online``, or ``stopping`` once it shuts down."""
    failures: Callable[[], Mapping[tuple[str, str], tuple[str, str]]] = _no_failures
    """Versions that could not be fetched or assembled, (name, version) → (reason code, message)."""
    choices: Callable[[], Mapping[tuple[str, str], ArtifactChoiceInfo]] = _no_choices
    """(name, version) → the artifact it is served as, and why (``edge_node.sync.chooser``)."""
    hardware_class: str = ""
    """This node's hardware class (``edge_node.inference.hardware``)."""
    site: str = ""
    """This node's site."""
    autonomous_since: Callable[[], float | None] = lambda: None
    """Since when the node runs without central (None: synced with it)."""
    staged: Callable[[], Iterable[tuple[str, str]]] = lambda: ()
    """Versions assembled and held for a flip, not loaded yet (reported ``staged``)."""
    clock: Callable[[], tuple[float | None, float | None]] = lambda: (None, None)
    """``(offset, error)`` of central's clock against this node's, in ms (None: unknown)."""

    def snapshot(self) -> HeartbeatBody:
        """The body of a heartbeat sent now."""
        grpc_address, http_address = self.addresses()
        stats = self.cache()
        choices = self.choices()
        failures, refusals, staged = self.failures(), self.refusals(), list(self.staged())
        # A version retired here and wanted again (staged, failed, refused) reports what happens
        # to it now, not that an older load of it was retired.
        again = set(failures) | set(refusals) | set(staged)
        models = [
            ModelInfo(
                name=m.name,
                version=m.version,
                state=str(m.state),
                error=m.error[:MAX_ERROR_CHARS] if m.error else None,
                reason="load" if m.state in ("failed", "error") else None,
                errors=m.errors,
                choice=choices.get((m.name, m.version)),
                shadow=m.shadow_info if m.state == "ready" else None,
                generation=m.generation_info,
            )
            for m in self.models()
            if not (m.state == "retired" and (m.name, m.version) in again)
        ]
        known = {(m.name, m.version) for m in models}
        models += [
            ModelInfo(name=name, version=ver, state="failed", reason=reason, error=error[:MAX_ERROR_CHARS])
            for (name, ver), (reason, error) in failures.items()
            if (name, ver) not in known
        ]
        known = {(m.name, m.version) for m in models}
        models += [
            ModelInfo(name=name, version=ver, state="failed", reason="cache_too_small", error=reason[:MAX_ERROR_CHARS])
            for (name, ver), reason in refusals.items()
            if (name, ver) not in known
        ]
        known = {(m.name, m.version) for m in models}
        models += [ModelInfo(name=n, version=v, state="staged") for n, v in staged if (n, v) not in known]
        offset_ms, error_ms = self.clock()
        return HeartbeatBody(
            state=self.state(),
            load=self.load.snapshot(),
            models=models[:MAX_MODELS],
            cache=CacheInfo(bytes=stats.bytes, capacity=stats.capacity, hits=stats.hits, misses=stats.misses),
            grpc_address=grpc_address,
            http_address=http_address,
            hardware_class=self.hardware_class,
            site=self.site,
            autonomous_since=self.autonomous_since(),
            clock_offset_ms=offset_ms,
            clock_error_ms=error_ms,
        )
