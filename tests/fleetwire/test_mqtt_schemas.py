"""The committed JSON Schemas of the MQTT payloads: up to date, and they accept what the
models produce and reject what the models reject."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ValidationError

from fleetwire.mqtt import schemas
from fleetwire.mqtt.payloads import (
    MAX_PAYLOAD_BYTES,
    CacheInfo,
    CentralStatus,
    Event,
    Heartbeat,
    LoadInfo,
    ModelInfo,
    NodeStatus,
)
from fleetwire.mqtt.topics import Topics

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "fleetwire" / "schemas"


def load_schema(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text()))


def validator(name: str) -> jsonschema.Draft202012Validator:
    schema = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


SAMPLES: dict[str, list[BaseModel]] = {
    "node_status": [
        NodeStatus(state="online", bdseq=1, ts=1_700_000_000_000),
        NodeStatus(state="offline", bdseq=0, ts=0),
    ],
    "heartbeat": [
        Heartbeat(node_id="edge-a", bdseq=3, seq=0, ts=1_700_000_000_000, interval_s=5.0),
        Heartbeat(
            node_id="edge-b",
            bdseq=7,
            seq=42,
            ts=1_700_000_000_123,
            interval_s=0.2,
            state="draining",
            load=LoadInfo(inflight=3, queue_depth=2, cpu_percent=150.5, rps=99.9, p50_ms=1.5, p99_ms=20.25),
            models=[
                ModelInfo(name="mlp", version="v1", state="ready"),
                ModelInfo(name="mlp", version="v2", state="failed", error="bad graph"),
            ],
            cache=CacheInfo(bytes=1024, capacity=8 * 1024**3, hits=10, misses=2),
            grpc_address="10.0.0.2:5001",
            http_address="10.0.0.2:8080",
        ),
    ],
    "central_status": [
        CentralStatus(state="online", ts=1_700_000_000_000, central_id="central-1"),
        CentralStatus(state="offline", ts=1),
    ],
    "event": [
        Event(type="node_dead", ts=1_700_000_000_000, node_id="edge-a", detail={"last_seen_ms": 12, "why": "will"}),
        Event(type="placement_changed", ts=5),
    ],
}


def test_committed_schemas_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert schemas.main(["--check"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json")) == sorted(
        f"{name}.schema.json" for name in schemas.MODELS
    )


def test_check_mode_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fleetwire.mqtt.schemas", "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_every_model_has_samples() -> None:
    assert set(SAMPLES) == set(schemas.MODELS)


@pytest.mark.parametrize(("name", "index"), [(n, i) for n, samples in SAMPLES.items() for i in range(len(samples))])
def test_sample_payloads_validate(name: str, index: int) -> None:
    sample = SAMPLES[name][index]
    assert isinstance(sample, schemas.MODELS[name])
    wire = json.loads(sample.model_dump_json())  # what goes on the wire
    validator(name).validate(wire)
    assert len(sample.model_dump_json().encode()) < MAX_PAYLOAD_BYTES
    assert schemas.MODELS[name].model_validate_json(json.dumps(wire)) == sample  # and back


def _heartbeat(**changes: Any) -> dict[str, Any]:
    wire = json.loads(SAMPLES["heartbeat"][1].model_dump_json())
    wire.update(changes)
    return dict(wire)


def _without(wire: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in wire.items() if k != key}


INVALID: list[tuple[str, dict[str, Any]]] = [
    ("node_status", {"state": "online", "ts": 1}),  # missing bdseq
    ("node_status", {"state": "zombie", "bdseq": 1, "ts": 1}),  # wrong state
    ("node_status", {"state": "online", "bdseq": -1, "ts": 1}),  # negative bdseq
    ("node_status", {"state": "offline", "bdseq": 1}),  # missing ts
    ("node_status", {"state": "online", "bdseq": 2**64, "ts": 1}),  # beyond any JSON reader's exact range
    ("heartbeat", _heartbeat(bdseq=2**53)),
    ("heartbeat", _heartbeat(cache={"hits": 2**63})),
    ("heartbeat", _heartbeat(seq=-1)),  # negative seq
    ("heartbeat", _without(_heartbeat(), "bdseq")),  # missing bdseq
    ("heartbeat", _heartbeat(node_id="")),  # empty node id
    ("heartbeat", _heartbeat(interval_s=0)),  # interval must be > 0
    ("heartbeat", _heartbeat(load={"inflight": -2})),  # negative load
    ("heartbeat", _heartbeat(models=[{"name": "m", "state": "ready"}])),  # model without version
    ("heartbeat", _heartbeat(cache={"bytes": -1})),
    ("central_status", {"state": "maybe", "ts": 1}),  # wrong state
    ("central_status", {"state": "online"}),  # missing ts
    ("event", {"ts": 1}),  # missing type
    ("event", {"type": "node_dead", "ts": -1}),
]


@pytest.mark.parametrize(("name", "wire"), INVALID)
def test_invalid_payloads_fail_the_schema_and_the_model(name: str, wire: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator(name).validate(wire)
    with pytest.raises(ValidationError):
        schemas.MODELS[name].model_validate(wire)


def test_the_schema_is_stricter_than_the_lax_models_about_numeric_strings() -> None:
    wire = {"state": "online", "bdseq": "1", "ts": 1}
    with pytest.raises(jsonschema.ValidationError):
        validator("node_status").validate(wire)
    assert NodeStatus.model_validate(wire).bdseq == 1  # pydantic's lax mode coerces "1"


def test_stale_schema_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in SCHEMA_DIR.glob("*.schema.json"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "heartbeat.schema.json").write_text("{}\n")
    monkeypatch.setattr(schemas, "SCHEMA_DIR", tmp_path)
    assert schemas.main(["--check"]) == 1
    assert schemas.main([]) == 0  # rewrites it
    assert schemas.main(["--check"]) == 0


def test_topics_round_trip_node_ids() -> None:
    topics = Topics()
    assert topics.node_id_of(topics.node_status("edge-a")) == "edge-a"
    assert topics.node_id_of(topics.node_heartbeat("edge-a")) == "edge-a"
    assert topics.node_id_of(topics.central_status) is None
    assert topics.node_id_of("other/v1/nodes/x/status") is None
