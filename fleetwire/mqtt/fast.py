"""A fast decoder for the two payloads central reads at fleet rate: heartbeats and statuses.

The pydantic models in ``payloads`` are the contract (the committed JSON Schemas are made
from them, edges build their payloads with them). Central reads one heartbeat per node
per interval, 10,000 a second for a 10k fleet, and pydantic's validation was a quarter
of its CPU there (it builds five model instances per heartbeat). msgspec validates the
same constraints into plain structs several times faster. ``tests/fleetwire`` holds the
two definitions to each other: same fields, same limits, same verdict on good and bad
payloads, so the structs cannot drift from the contract unnoticed.

``to_model`` turns a struct into the contract's pydantic model when something wants one
(an API view of a node); that happens per request, not per heartbeat.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from fleetwire.mqtt.payloads import (
    MAX_CHOICE_NAME,
    MAX_CHOICE_REASON,
    MAX_REASON_CODE,
    MAX_WIRE_INT,
    ArtifactChoiceInfo,
    CacheInfo,
    GenerationInfo,
    Heartbeat,
    LoadInfo,
    ModelInfo,
    NodeStatus,
    ShadowInfo,
)
from fleetwire.names import ADDRESS_PATTERN, MAX_ADDRESS_CHARS, is_address

__all__ = [
    "AnyHeartbeat",
    "DecodeError",
    "FastCache",
    "FastChoice",
    "FastGeneration",
    "FastHeartbeat",
    "FastLoad",
    "FastModel",
    "FastShadow",
    "decode_heartbeat",
    "decode_status",
]

DecodeError = msgspec.DecodeError
"""Raised for malformed JSON and for payloads that break the contract (a ``ValueError``)."""

_NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_WIRE_INT)]
_NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
_Address = Annotated[str, msgspec.Meta(max_length=MAX_ADDRESS_CHARS, pattern=ADDRESS_PATTERN)]


class FastLoad(msgspec.Struct, frozen=True):
    """``LoadInfo``."""

    inflight: _NonNegInt = 0
    queue_depth: _NonNegInt = 0
    cpu_percent: _NonNegFloat = 0.0
    rps: _NonNegFloat = 0.0
    p50_ms: _NonNegFloat = 0.0
    p99_ms: _NonNegFloat = 0.0


_ChoiceName = Annotated[str, msgspec.Meta(max_length=MAX_CHOICE_NAME)]


class FastChoice(msgspec.Struct, frozen=True):
    """``ArtifactChoiceInfo``."""

    artifact: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_CHOICE_NAME)]
    source: Annotated[str, msgspec.Meta(max_length=16)]
    hardware_class: _ChoiceName = ""
    reason: Annotated[str, msgspec.Meta(max_length=MAX_CHOICE_REASON)] = ""
    speedup_b1: _NonNegFloat | None = None
    speedup_b8: _NonNegFloat | None = None
    from_node: _ChoiceName | None = None


class FastShadow(msgspec.Struct, frozen=True):
    """``ShadowInfo``."""

    reference: _ChoiceName = "fp32"
    candidate: _ChoiceName = ""
    samples: _NonNegInt = 0
    top1_agree: _NonNegInt = 0
    top1_samples: _NonNegInt = 0
    measure: Annotated[str, msgspec.Meta(max_length=MAX_REASON_CODE)] = ""
    measure_sum: _NonNegFloat = 0.0
    measure_sumsq: _NonNegFloat = 0.0
    dropped: _NonNegInt = 0


class FastGeneration(msgspec.Struct, frozen=True):
    """``GenerationInfo``."""

    tokens_per_s: _NonNegFloat = 0.0
    running: _NonNegInt = 0
    waiting: _NonNegInt = 0
    kv_usage: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    ttft_p50_ms: _NonNegFloat | None = None
    ttft_p99_ms: _NonNegFloat | None = None


class FastModel(msgspec.Struct, frozen=True):
    """``ModelInfo``."""

    name: str
    version: str
    state: str
    error: str | None = None
    reason: Annotated[str, msgspec.Meta(max_length=MAX_REASON_CODE)] | None = None
    errors: _NonNegInt = 0
    choice: FastChoice | None = None
    shadow: FastShadow | None = None
    generation: FastGeneration | None = None


class FastCache(msgspec.Struct, frozen=True):
    """``CacheInfo``."""

    bytes: _NonNegInt = 0
    capacity: _NonNegInt = 0
    hits: _NonNegInt = 0
    misses: _NonNegInt = 0


class FastHeartbeat(msgspec.Struct, frozen=True):
    """``Heartbeat``."""

    node_id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    bdseq: _NonNegInt
    seq: _NonNegInt
    ts: _NonNegInt
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)]
    state: str = "online"
    load: FastLoad = msgspec.field(default_factory=FastLoad)
    models: Annotated[list[FastModel], msgspec.Meta(max_length=1024)] = msgspec.field(default_factory=list)
    cache: FastCache = msgspec.field(default_factory=FastCache)
    grpc_address: _Address = ""
    http_address: _Address = ""
    hardware_class: _ChoiceName = ""
    site: Annotated[str, msgspec.Meta(max_length=128)] = ""
    mode: Annotated[str, msgspec.Meta(max_length=16)] = "synced"
    autonomous_since: _NonNegInt | None = None
    clock_offset_ms: float | None = None
    clock_error_ms: _NonNegFloat | None = None

    def __post_init__(self) -> None:
        # msgspec's ``pattern`` searches (``$`` also matches before a trailing newline) and cannot
        # bound the port: the contract's own full check, as the pydantic model runs it.
        for address in (self.grpc_address, self.http_address):
            if not is_address(address):
                raise ValueError(f"{address[:64]!r} is not host:port")

    def to_model(self) -> Heartbeat:
        """The contract's model of the same heartbeat (already validated: no checks run)."""
        return Heartbeat.model_construct(
            node_id=self.node_id,
            bdseq=self.bdseq,
            seq=self.seq,
            ts=self.ts,
            interval_s=self.interval_s,
            state=self.state,
            load=load_model(self.load),
            models=[model_info(m) for m in self.models],
            cache=cache_model(self.cache),
            grpc_address=self.grpc_address,
            http_address=self.http_address,
            hardware_class=self.hardware_class,
            site=self.site,
            mode=self.mode,
            autonomous_since=self.autonomous_since,
            clock_offset_ms=self.clock_offset_ms,
            clock_error_ms=self.clock_error_ms,
        )


class _FastStatus(msgspec.Struct, frozen=True):
    state: Literal["online", "offline"]
    bdseq: _NonNegInt
    ts: _NonNegInt


AnyHeartbeat = Heartbeat | FastHeartbeat
"""What central's tracker accepts: the same attributes either way."""

_HEARTBEAT = msgspec.json.Decoder(FastHeartbeat)
_STATUS = msgspec.json.Decoder(_FastStatus)


def decode_heartbeat(payload: bytes | bytearray | memoryview) -> FastHeartbeat:
    """Decode and validate one heartbeat; ``DecodeError`` when it breaks the contract."""
    return _HEARTBEAT.decode(payload)


def decode_status(payload: bytes | bytearray | memoryview) -> NodeStatus:
    """Decode and validate one birth/death (rare: returned as the contract's model)."""
    s = _STATUS.decode(payload)
    return NodeStatus.model_construct(state=s.state, bdseq=s.bdseq, ts=s.ts)


def load_model(load: FastLoad | LoadInfo) -> LoadInfo:
    """``LoadInfo`` of either form."""
    if isinstance(load, LoadInfo):
        return load
    return LoadInfo.model_construct(**msgspec.structs.asdict(load))


def cache_model(cache: FastCache | CacheInfo) -> CacheInfo:
    """``CacheInfo`` of either form."""
    if isinstance(cache, CacheInfo):
        return cache
    return CacheInfo.model_construct(**msgspec.structs.asdict(cache))


def model_info(model: FastModel | ModelInfo) -> ModelInfo:
    """``ModelInfo`` of either form."""
    if isinstance(model, ModelInfo):
        return model
    fields = msgspec.structs.asdict(model)
    choice = fields.pop("choice")
    shadow = fields.pop("shadow")
    generation = fields.pop("generation")
    return ModelInfo.model_construct(
        **fields,
        choice=choice_info(choice) if choice is not None else None,
        shadow=shadow_info(shadow) if shadow is not None else None,
        generation=GenerationInfo.model_construct(**msgspec.structs.asdict(generation))
        if generation is not None
        else None,
    )


def choice_info(choice: FastChoice | ArtifactChoiceInfo) -> ArtifactChoiceInfo:
    """``ArtifactChoiceInfo`` of either form."""
    if isinstance(choice, ArtifactChoiceInfo):
        return choice
    return ArtifactChoiceInfo.model_construct(**msgspec.structs.asdict(choice))


def shadow_info(shadow: FastShadow | ShadowInfo) -> ShadowInfo:
    """``ShadowInfo`` of either form."""
    if isinstance(shadow, ShadowInfo):
        return shadow
    return ShadowInfo.model_construct(**msgspec.structs.asdict(shadow))
