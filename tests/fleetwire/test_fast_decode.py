"""The fast heartbeat/status decoder against the contract's pydantic models: same fields,
same limits, and the same verdict on good and broken payloads."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from fleetwire.mqtt.fast import (
    DecodeError,
    FastCache,
    FastChoice,
    FastGeneration,
    FastHeartbeat,
    FastLoad,
    FastModel,
    decode_heartbeat,
    decode_status,
)
from fleetwire.mqtt.payloads import (
    ArtifactChoiceInfo,
    CacheInfo,
    GenerationInfo,
    Heartbeat,
    LoadInfo,
    ModelInfo,
    NodeStatus,
)

PAIRS: list[tuple[type[BaseModel], type[msgspec.Struct]]] = [
    (Heartbeat, FastHeartbeat),
    (LoadInfo, FastLoad),
    (ModelInfo, FastModel),
    (CacheInfo, FastCache),
    (ArtifactChoiceInfo, FastChoice),
    (GenerationInfo, FastGeneration),
]
#: JSON Schema keywords that carry a limit; both sides must state the same ones.
LIMITS = ("type", "minimum", "exclusiveMinimum", "maximum", "minLength", "maxLength", "maxItems", "enum", "const")


def _props(schema: dict[str, Any], name: str) -> tuple[dict[str, Any], set[str]]:
    defs = schema.get("$defs", {})
    body = defs.get(name, schema)
    return body["properties"], set(body.get("required", []))


def _limits(prop: dict[str, Any]) -> dict[str, Any]:
    if "anyOf" in prop:  # X | None
        return {"anyOf": sorted(json.dumps(_limits(p), sort_keys=True) for p in prop["anyOf"])}
    if "$ref" in prop or "items" in prop:
        return {k: prop[k] for k in ("type", "maxItems") if k in prop}
    return {k: prop[k] for k in LIMITS if k in prop}


@pytest.mark.parametrize(("model", "struct"), PAIRS, ids=lambda c: c.__name__)
def test_every_field_and_limit_is_the_same(model: type[BaseModel], struct: type[msgspec.Struct]) -> None:
    ours, ours_required = _props(msgspec.json.schema(struct), struct.__name__)
    theirs, theirs_required = _props(model.model_json_schema(), model.__name__)
    assert set(ours) == set(theirs)
    assert ours_required == theirs_required
    for field in theirs:
        assert _limits(ours[field]) == _limits(theirs[field]), field
        if "default" in theirs[field]:  # default_factory fields show none; the decode test covers them
            assert ours[field].get("default") == theirs[field]["default"], field


def _good() -> dict[str, Any]:
    return {
        "node_id": "edge-a",
        "bdseq": 3,
        "seq": 7,
        "ts": 1_700_000_000_000,
        "interval_s": 5.0,
        "state": "online",
        "load": {"inflight": 1, "queue_depth": 0, "cpu_percent": 12.5, "rps": 3.0, "p50_ms": 4.0, "p99_ms": 9.0},
        "models": [
            {"name": "digits", "version": "1", "state": "ready",
             "choice": {"artifact": "int8-u8s8-qdq", "hardware_class": "x86_64/avx2/2c/cpu", "source": "measured",
                        "reason": "fastest of 3 on this node", "speedup_b1": 1.9, "speedup_b8": 1.7,
                        "from_node": "edge-a"}},
            {"name": "m", "version": "2", "state": "failed", "error": "x", "reason": "network", "errors": 2},
            {"name": "chat", "version": "1", "state": "ready",
             "generation": {"tokens_per_s": 41.5, "running": 2, "waiting": 1, "kv_usage": 0.25,
                            "ttft_p50_ms": 12.0, "ttft_p99_ms": 80.5}},
        ],
        "cache": {"bytes": 10, "capacity": 100, "hits": 1, "misses": 0},
        "grpc_address": "10.0.0.1:50051",
        "http_address": "10.0.0.1:8081",
        "hardware_class": "x86_64/avx2/2c/cpu",
    }  # fmt: skip


#: Values that are wrong somewhere in the contract (or right, for a string field).
_ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=140),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_PATHS = [
    ("node_id",), ("bdseq",), ("seq",), ("ts",), ("interval_s",), ("state",), ("load",), ("load", "rps"),
    ("load", "inflight"), ("models",), ("models", 0), ("models", 0, "name"), ("models", 1, "errors"),
    ("cache",), ("cache", "bytes"), ("grpc_address",), ("hardware_class",), ("models", 0, "choice"),
    ("models", 0, "choice", "artifact"), ("models", 0, "choice", "speedup_b8"), ("models", 0, "choice", "reason"),
    ("models", 0, "choice", "from_node"), ("models", 1, "reason"), ("models", 2, "generation"),
    ("models", 2, "generation", "kv_usage"), ("models", 2, "generation", "ttft_p50_ms"),
    ("models", 2, "generation", "ttft_p99_ms"),
]  # fmt: skip


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


def _verdicts(raw: bytes) -> tuple[bool, bool]:
    try:
        Heartbeat.model_validate_json(raw, strict=True)
        slow = True
    except ValidationError:
        slow = False
    try:
        decode_heartbeat(raw)
        fast = True
    except DecodeError:
        fast = False
    return slow, fast


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(_PATHS), value=_ODD, drop=st.booleans())
def test_a_broken_heartbeat_gets_the_same_verdict(path: tuple[str | int, ...], value: Any, drop: bool) -> None:
    doc = _good()
    if drop and len(path) == 1:
        del doc[str(path[0])]
    else:
        _set(doc, path, value)
    raw = json.dumps(doc).encode()
    slow, fast = _verdicts(raw)
    assert slow == fast, raw


def test_a_good_heartbeat_decodes_to_the_same_model() -> None:
    raw = json.dumps(_good()).encode()
    assert decode_heartbeat(raw).to_model() == Heartbeat.model_validate_json(raw)
    minimal = b'{"node_id": "n", "bdseq": 0, "seq": 0, "ts": 0, "interval_s": 1}'
    assert decode_heartbeat(minimal).to_model() == Heartbeat.model_validate_json(minimal)


@pytest.mark.parametrize(
    "raw",
    [b"{", b"[]", b'"x"', b'{"state": "sleeping", "bdseq": 1, "ts": 1}', b'{"state": "online", "bdseq": -1, "ts": 1}',
     b'{"state": "online", "ts": 1}', b'{"state": "offline", "bdseq": 2, "ts": 3, "extra": true}',
     b'{"state": "online", "bdseq": 18446744073709551616, "ts": 1}', b'{"state": "online", "bdseq": 1, "ts": 1e400}',
     b'{"state": "online", "bdseq": 9007199254740992, "ts": 1}'],
)  # fmt: skip
def test_statuses_get_the_same_verdict(raw: bytes) -> None:
    try:
        expected: NodeStatus | None = NodeStatus.model_validate_json(raw, strict=True)
    except ValidationError:
        expected = None
    try:
        got: NodeStatus | None = decode_status(raw)
    except DecodeError:
        got = None
    assert got == expected
