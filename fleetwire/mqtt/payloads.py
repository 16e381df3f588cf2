"""MQTT payloads (JSON). The committed JSON Schemas in ``fleetwire/schemas/`` are
generated from these models (``python -m fleetwire.mqtt.schemas``) and checked in tests."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from fleetwire.names import ADDRESS_PATTERN, MAX_ADDRESS_CHARS, is_address

#: Anything larger is dropped unread by consumers: a heartbeat is well under 16 KiB.
MAX_PAYLOAD_BYTES = 64 * 1024
#: The largest integer any payload may carry: the largest a JSON number holds exactly in every
#: reader (JavaScript's ``Number.MAX_SAFE_INTEGER``; a browser dashboard reads the feed). A
#: larger one would also break 64-bit JSON encoders downstream (an API answering 500).
MAX_WIRE_INT = 2**53 - 1


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)


class NodeStatus(_Payload):
    """Birth (``online``) or death (``offline``) of a node, Sparkplug style.

    ``bdseq`` grows by one per connect; the Last Will carries the same ``bdseq`` as the
    birth it belongs to, so a death older than the latest birth is recognisably stale."""

    state: Literal["online", "offline"]
    bdseq: int = Field(ge=0, le=MAX_WIRE_INT)
    ts: int = Field(ge=0, le=MAX_WIRE_INT, description="Unix time, milliseconds.")


class LoadInfo(_Payload):
    """What the node is doing right now."""

    inflight: int = Field(0, ge=0, le=MAX_WIRE_INT)
    queue_depth: int = Field(0, ge=0, le=MAX_WIRE_INT)
    cpu_percent: float = Field(0.0, ge=0)
    rps: float = Field(0.0, ge=0)
    p50_ms: float = Field(0.0, ge=0)
    p99_ms: float = Field(0.0, ge=0)


def _address(value: str) -> str:
    if not is_address(value):
        raise ValueError(f"{value[:64]!r} is not host:port (an IPv6 host in brackets, port at most 65535)")
    return value


Address = Annotated[
    str,
    Field(
        max_length=MAX_ADDRESS_CHARS,
        pattern=ADDRESS_PATTERN,
        description="host:port (IPv6 in brackets) or empty; never a path, query or scheme.",
    ),
    AfterValidator(_address),
]
"""An address a node announces: central builds URLs from it, so nothing but ``host:port``."""

#: Longest hardware class, artifact name or node id in an artifact choice.
MAX_CHOICE_NAME = 128
#: Longest reason text of an artifact choice.
MAX_CHOICE_REASON = 256


class ArtifactChoiceInfo(_Payload):
    """Which of a version's artifacts the node serves, and why.

    ``source``: ``measured`` (timed on this node), ``verdict`` (timed by ``from_node``, a
    node of the same hardware class, and shared through central), ``pinned`` (the manifest
    label ``modelfleet.artifact``), ``only`` (one artifact), ``default`` (timing off or failed:
    central's default). Central shares ``measured`` and ``verdict`` choices with the nodes
    of ``hardware_class``."""

    artifact: str = Field(min_length=1, max_length=MAX_CHOICE_NAME)
    hardware_class: str = Field("", max_length=MAX_CHOICE_NAME, description="e.g. x86_64/avx2/2c/cpu")
    source: str = Field(max_length=16, description="measured, verdict, pinned, only or default.")
    reason: str = Field("", max_length=MAX_CHOICE_REASON, description='e.g. "fastest of 3 on this node".')
    speedup_b1: float | None = Field(None, ge=0, description="FP32's time over the artifact's at batch 1.")
    speedup_b8: float | None = Field(None, ge=0, description="The same at batch 8.")
    from_node: str | None = Field(None, max_length=MAX_CHOICE_NAME, description="The node that timed it.")


#: Longest failure reason code (``signature``, ``disk``, ``cache_too_small``, ``network``, ``load``).
MAX_REASON_CODE = 32


class ShadowInfo(_Payload):
    """INT8 against its reference artifact (FP32) on a sample of live requests, since the version
    loaded: counts and sums, so central can add nodes up and put a confidence bound on them.

    ``top1_*`` counts samples whose decision (label or argmax) both artifacts made, for
    classifiers; ``measure`` is the guard's continuous measure (``cosine`` for classifiers,
    ``relative_error`` as ``max(0, 1 - error)`` otherwise) with its per-sample sum and sum of
    squares.

    A language model's counts are per served token of the sampled generations: ``top1_*`` is
    greedy agreement (the reference's argmax is the served token; greedy requests only),
    ``measure`` is ``token_nll`` (the served token's negative log-probability under the
    reference), ``samples`` the tokens scored and ``dropped`` the generations not scored."""

    reference: str = Field(
        "fp32", max_length=MAX_CHOICE_NAME, description="The artifact the served one is checked against."
    )
    candidate: str = Field(
        "",
        max_length=MAX_CHOICE_NAME,
        description="A pending INT8 artifact run beside the served reference (the counts are the candidate's); "
        "empty: the served artifact is the one checked.",
    )
    samples: int = Field(
        0,
        ge=0,
        le=MAX_WIRE_INT,
        description="Live samples run on both artifacts (a language model: served tokens scored).",
    )
    top1_agree: int = Field(
        0,
        ge=0,
        le=MAX_WIRE_INT,
        description="Samples whose top-1 decision matched (classifiers; a language model: greedy tokens the"
        " reference agrees with).",
    )
    top1_samples: int = Field(
        0,
        ge=0,
        le=MAX_WIRE_INT,
        description="Samples with a top-1 decision (0 for non-classifiers; a language model: greedy tokens).",
    )
    measure: str = Field(
        "", max_length=MAX_REASON_CODE, description="cosine, relative_error, or token_nll (a language model)."
    )
    measure_sum: float = Field(0.0, ge=0, description="Sum of the per-sample measure.")
    measure_sumsq: float = Field(0.0, ge=0, description="Sum of its squares.")
    dropped: int = Field(
        0, ge=0, le=MAX_WIRE_INT, description="Sampled requests dropped because the shadow queue was full."
    )


class GenerationInfo(_Payload):
    """A language model's generation engine now: what central and the dashboard show per node
    and model, and what routing by load (issue 27) reads."""

    tokens_per_s: float = Field(0.0, ge=0, description="Tokens generated per second since the last heartbeat.")
    running: int = Field(0, ge=0, le=MAX_WIRE_INT, description="Sequences in the running batch.")
    waiting: int = Field(0, ge=0, le=MAX_WIRE_INT, description="Requests waiting for KV room or a batch slot.")
    kv_usage: float = Field(0.0, ge=0, le=1, description="Share of the KV cache budget in use.")
    ttft_p50_ms: float | None = Field(
        None, ge=0, description="Median time to first token of the version's recent streams, ms; None before any."
    )
    ttft_p99_ms: float | None = Field(
        None, ge=0, description="99th percentile time to first token of the version's recent streams, ms."
    )


class ModelInfo(_Payload):
    """One model version on the node and its state (loading, ready, failed, ...).

    A failed version carries ``reason``, a short code saying why it could not be made ready
    (``signature``, ``disk``, ``cache_too_small``, ``network``, ``load``), beside ``error``,
    the message in words. Older edges send no reason."""

    name: str
    version: str
    state: str
    error: str | None = None
    reason: str | None = Field(
        None,
        max_length=MAX_REASON_CODE,
        description="Why a failed version failed: signature, disk, cache_too_small, network or load.",
    )
    errors: int = Field(
        0, ge=0, le=MAX_WIRE_INT, description="Inference requests this version failed (server-side errors)."
    )
    choice: ArtifactChoiceInfo | None = Field(None, description="The artifact served, and why; absent before load.")
    shadow: ShadowInfo | None = Field(None, description="INT8 against FP32 on live samples; absent when not sampled.")
    generation: GenerationInfo | None = Field(None, description="A language model's engine; absent for tensor models.")

    @model_serializer(mode="wrap")
    def _omit_zero_errors(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Sent only when non-zero (or set): a healthy fleet's heartbeats stay as small as before.
        data: dict[str, Any] = handler(self)
        if not data.get("errors"):
            data.pop("errors", None)
        if data.get("choice") is None:
            data.pop("choice", None)
        if data.get("reason") is None:
            data.pop("reason", None)
        if data.get("shadow") is None:
            data.pop("shadow", None)
        if data.get("generation") is None:
            data.pop("generation", None)
        return data


class CacheInfo(_Payload):
    """The node's chunk cache."""

    bytes: int = Field(0, ge=0, le=MAX_WIRE_INT)
    capacity: int = Field(0, ge=0, le=MAX_WIRE_INT)
    hits: int = Field(0, ge=0, le=MAX_WIRE_INT)
    misses: int = Field(0, ge=0, le=MAX_WIRE_INT)


class Heartbeat(_Payload):
    """Sent every ``interval_s`` on ``…/nodes/{node_id}/heartbeat``."""

    node_id: str = Field(min_length=1, max_length=128)
    bdseq: int = Field(ge=0, le=MAX_WIRE_INT)
    seq: int = Field(ge=0, le=MAX_WIRE_INT, description="Grows by one per heartbeat within a connection.")
    ts: int = Field(ge=0, le=MAX_WIRE_INT, description="Unix time, milliseconds.")
    interval_s: float = Field(gt=0, le=3600)
    state: str = Field("online", description="The node's own view: online, draining, ...")
    load: LoadInfo = Field(default_factory=LoadInfo)
    models: list[ModelInfo] = Field(default_factory=list, max_length=1024)
    cache: CacheInfo = Field(default_factory=CacheInfo)
    grpc_address: Address = ""
    http_address: Address = ""
    hardware_class: str = Field(
        "", max_length=MAX_CHOICE_NAME, description="ISA flags, cores and provider, e.g. x86_64/avx2/2c/cpu."
    )
    site: str = Field("", max_length=128, description="Where the node is; empty from nodes that name none.")
    mode: str = Field(
        "synced",
        max_length=16,
        description="synced: following central's desired state; autonomous: serving its last one without central.",
    )
    autonomous_since: int | None = Field(
        None,
        ge=0,
        le=MAX_WIRE_INT,
        description="Unix time, milliseconds, since when the node runs on its own (autonomous only).",
    )
    clock_offset_ms: float | None = Field(
        None, description="Central's wall clock minus this node's, as the node last measured it; absent: unknown."
    )
    clock_error_ms: float | None = Field(
        None, ge=0, description="Bound on the offset's error: half the round trip of the measuring call."
    )


class CentralStatus(_Payload):
    """Central's own retained status; ``offline`` is also its Last Will."""

    state: Literal["online", "offline"]
    ts: int = Field(ge=0, le=MAX_WIRE_INT)
    central_id: str = ""


class Event(_Payload):
    """A fleet event: node_suspect, node_dead, node_alive, rollout_started, model_pushed, ..."""

    type: str
    ts: int = Field(ge=0, le=MAX_WIRE_INT)
    node_id: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
    seq: int | None = Field(
        None,
        ge=1,
        le=MAX_WIRE_INT,
        description="Position in central's event log: grows with every event, across restarts.",
    )
    actor: str | None = Field(
        None,
        description="Operator token name behind the event (push, delete, rollout actions); 'anonymous' without auth.",
    )
