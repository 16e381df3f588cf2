"""Faults of a replicated central, with real processes: replicas SIGKILLed mid-push, mid-rollout
and while edges fetch; PostgreSQL restarted under them, and the S3 server (SeaweedFS, its data
on disk) SIGKILLed and restarted mid-push and while edges fetch."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from faults._faults import CENTRAL_ENV, EDGE_ENV, mqtt_envs, version, wait_until

from bench._fleet import sha256_of
from bench._ha_s3 import unstored_versions
from bench._replicas import ReplicatedFleet, replica_env
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from modelfleet.zoo.synthetic import build_mlp
from support.brokers import MosquittoBroker

PARTITIONS = 8


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    """A fresh bucket on the session's S3 server."""
    return s3_server.new_bucket()


@pytest.fixture
def fleet(
    tmp_path: Path, postgres: PostgresInstance, s3_server: S3Server, bucket: str, mosquitto: MosquittoBroker
) -> Iterator[ReplicatedFleet]:
    """Two replicas (more on demand) on a fresh database and bucket; edges know them all."""
    central_mqtt, edge_mqtt = mqtt_envs(mosquitto)
    env = replica_env(
        store_url=postgres.fresh_database(),
        blob_env=s3_server.blob_env(bucket),
        broker=(mosquitto.host, mosquitto.port),
        partitions=PARTITIONS,
        tick_s=0.2,
    )
    with ReplicatedFleet(
        root=tmp_path, central_env={**CENTRAL_ENV, **central_mqtt, **env}, edge_env={**EDGE_ENV, **edge_mqtt}
    ) as f:
        f.start_replicas(2)
        wait_until(lambda: f.leader() is not None, 15, "a leader")
        yield f


def _slow_body(path: Path, block: int, pause_s: float, sent: threading.Event) -> Iterator[bytes]:
    data = path.read_bytes()
    for i in range(0, len(data), block):
        if i >= len(data) // 2:
            sent.set()  # half of it is on the wire
        yield data[i : i + block]
        time.sleep(pause_s)


def _versions(fleet: ReplicatedFleet, url: str, model: str) -> list[str]:
    r = fleet.client.get(f"{url}/api/v1/models/{model}/versions")
    return [] if r.status_code == 404 else [v["version"] for v in r.json()]


def test_a_leader_killed_mid_push_leaves_the_push_refused_and_nothing_half_written(
    fleet: ReplicatedFleet, model_file: Path
) -> None:
    leader = fleet.leader()
    assert leader is not None
    target = fleet.replicas[leader]
    half = threading.Event()
    outcome: dict[str, Any] = {}

    def push() -> None:
        try:
            r = httpx.post(
                f"{target.http_url}/api/v1/models/mlp/versions",
                content=_slow_body(model_file, 64 * 1024, 0.02, half),
                headers={"Content-Type": "application/octet-stream"},
                timeout=30,
            )
            outcome["status"] = r.status_code
        except httpx.HTTPError as exc:
            outcome["error"] = type(exc).__name__

    pusher = threading.Thread(target=push)
    pusher.start()
    assert half.wait(30), "the upload never got half-way"
    fleet.kill_replica(leader)
    pusher.join(30)
    assert "error" in outcome or outcome.get("status") != 201, f"a push to a killed replica was acked: {outcome}"

    survivor = fleet.live()[0]
    wait_until(lambda: fleet.leader() == survivor.name, 10, "the survivor leads")
    assert _versions(fleet, survivor.http_url, "mlp") == [], "nothing of the refused push is listed"
    pushed = fleet.push("mlp", "1", model_file)  # the client pushes again: it lands whole
    assert pushed.manifest["sha256"] == sha256_of(model_file)
    assert _versions(fleet, survivor.http_url, "mlp") == ["1"]


def test_edges_fetching_from_a_killed_replica_finish_from_another(
    fleet: ReplicatedFleet, model_file: Path, tmp_path: Path
) -> None:
    edges = [fleet.start_edge(f"e{i}") for i in range(2)]
    wait_until(lambda: all(fleet.edge_status(e.name).get("central") for e in edges), 15, "edges registered")
    pushed = fleet.push("mlp", "1", model_file)
    followed = {fleet.edge_status(e.name)["central"]["address"] for e in edges}
    victim = next(p.name for p in fleet.live() if p.grpc_address in followed)
    fleet.kill_replica(victim)
    done = fleet.wait_complete("mlp", "1", timeout_s=60)
    assert set(done) == {e.name for e in edges}
    for e in edges:
        assert sha256_of(fleet.model_file(e.name, "mlp", "1")) == pushed.manifest["sha256"]
        assert fleet.edge_status(e.name)["central"]["address"] != fleet.replicas[victim].grpc_address


def test_a_rollout_goes_on_under_the_next_leader(fleet: ReplicatedFleet, tmp_path: Path) -> None:
    v1 = build_mlp(tmp_path / "v1.onnx", width=32, hidden_layers=1, seed=1)
    v2 = build_mlp(tmp_path / "v2.onnx", width=32, hidden_layers=1, seed=2)
    for i in range(2):
        fleet.start_edge(f"e{i}")
    fleet.push("m", "1", v1)
    fleet.wait_complete("m", "1", timeout_s=60)
    url = _url(fleet)
    r = fleet.client.post(
        f"{url}/api/v1/models/m/versions",
        params={"version": "2", "activate": "false"},
        content=v2.read_bytes(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 201, r.text
    started = fleet.client.post(f"{url}/api/v1/models/m/rollouts", json={"version": "2", "canary": 0.5, "soak_s": 2.0})
    assert started.status_code in (200, 201), started.text
    wait_until(
        lambda: _rollout(fleet)["state"] == "canary" and _rollout(fleet)["ready"] >= 1,
        30,
        f"a canary ready: {_rollout(fleet)}",
    )

    leader = fleet.leader()
    assert leader is not None
    fleet.kill_replica(leader)
    wait_until(lambda: fleet.leader() not in (None, leader), 10, "a new leader")
    wait_until(lambda: _rollout(fleet)["state"] == "complete", 60, "the rollout completed under the new leader")
    events = fleet.client.get(f"{_url(fleet)}/api/v1/events", params={"limit": 500}).json()
    assert any(e["type"] == "rollout_resumed" for e in events), "the new leader said it resumed the rollout"


def _url(fleet: ReplicatedFleet) -> str:
    """A live replica's REST base URL."""
    assert fleet.central is not None
    return fleet.central.http_url


def _rollout(fleet: ReplicatedFleet) -> dict[str, Any]:
    return dict(fleet.client.get(f"{_url(fleet)}/api/v1/models/m/rollout").json())


def test_postgresql_restarted_writes_are_refused_with_retry_after_then_resume(
    fleet: ReplicatedFleet, postgres: PostgresInstance, small_model_file: Path
) -> None:
    pushed = fleet.push("tiny", "1", small_model_file)
    postgres.stop_server()  # every session is cut at once
    try:
        replica = fleet.live()[0]
        r = fleet.client.post(
            f"{replica.http_url}/api/v1/models/tiny/versions",
            content=small_model_file.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 503, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert "unavailable" in r.json()["error"]
        seen: dict[str, Any] = {}

        def none_ready() -> bool:
            seen.update({p.name: fleet.readiness(p) for p in fleet.live()})
            return all((body or {}).get("ready") is False for body in seen.values())

        try:
            wait_until(none_ready, 10, "no replica ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last /readyz bodies: {seen}") from None
    finally:
        postgres.start_again()
    wait_until(lambda: all((fleet.readiness(p) or {}).get("ready") for p in fleet.live()), 30, "ready again")
    wait_until(lambda: fleet.leader() is not None, 15, "a leader again")
    for p in fleet.live():
        assert _versions(fleet, p.http_url, "tiny") == ["1"], "nothing lost"
    again = fleet.client.post(
        f"{fleet.live()[-1].http_url}/api/v1/models/tiny/versions",
        content=small_model_file.read_bytes(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert again.status_code == 201, again.text
    assert pushed.manifest["sha256"] == again.json()["manifest"]["sha256"]


def _pushing(
    url: str, model_file: Path, half: threading.Event, sent: threading.Event, outcome: dict[str, Any]
) -> threading.Thread:
    """A slow push of ``model_file`` to ``url`` in a thread; ``half`` is set once half the body
    is on the wire, ``sent`` once all of it is; ``outcome`` gets the status, the Retry-After
    header and the body."""

    def body() -> Iterator[bytes]:
        yield from _slow_body(model_file, 64 * 1024, 0.01, half)
        sent.set()

    def push() -> None:
        r = httpx.post(
            f"{url}/api/v1/models/mlp/versions",
            params={"version": "2"},
            content=body(),
            headers={"Content-Type": "application/octet-stream"},
            timeout=120,
        )
        outcome.update(status=r.status_code, retry_after=r.headers.get("Retry-After"), body=r.text)

    return threading.Thread(target=push)


def test_the_s3_server_killed_mid_push_keeps_what_was_acked_and_lists_no_half_push(
    fleet: ReplicatedFleet, s3_server: S3Server, bucket: str, model_file: Path, tmp_path: Path
) -> None:
    acked = fleet.push("mlp", "1", build_mlp(tmp_path / "v1.onnx", width=384, hidden_layers=4, seed=1))
    replica = fleet.live()[0]
    half, sent = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}
    pusher = _pushing(replica.http_url, model_file, half, sent, outcome)
    pusher.start()
    assert half.wait(30), "the upload never got half-way"
    s3_server.freeze()  # the rest of the body arrives, its chunks wait on the frozen store...
    try:
        assert sent.wait(30), "the upload never finished"
        time.sleep(0.5)
    finally:
        s3_server.restart()  # ... which then crashes (SIGKILL) and comes back on its disk
    pusher.join(120)
    assert outcome.get("status") in (201, 503), outcome
    if outcome["status"] == 503:  # refused clearly, and nothing of it listed
        assert outcome["retry_after"] and int(outcome["retry_after"]) >= 1, outcome
        assert _versions(fleet, replica.http_url, "mlp") == ["1"], "a refused push leaves nothing listed"
    else:
        assert _versions(fleet, replica.http_url, "mlp") == ["1", "2"]
    # acked before the crash: listed everywhere, every chunk in the bucket byte for byte; and no
    # listed version (the cut push, had it been listed) lacks a chunk
    assert unstored_versions(fleet, s3_server, bucket, "mlp", [acked.version]) == []
    assert unstored_versions(fleet, s3_server, bucket, "mlp") == []
    pushed = fleet.push("mlp", "3", model_file)  # and the store takes the next push
    assert pushed.manifest["sha256"] == sha256_of(model_file)


def test_edges_fetching_while_the_s3_server_is_killed_finish_byte_for_byte(
    fleet: ReplicatedFleet, s3_server: S3Server, bucket: str, model_file: Path
) -> None:
    pushed = fleet.push("mlp", "1", model_file)
    s3_server.freeze()  # the origin's reads hang on the frozen store...
    try:
        edges = [fleet.start_edge(f"e{i}") for i in range(2)]
        wait_until(
            lambda: all(version(fleet, e.name, "mlp", "1").get("state") == "fetching" for e in edges),
            30,
            "both edges fetching",
        )
    finally:
        s3_server.restart()  # ... until it crashes and comes back
    fleet.wait_complete("mlp", "1", timeout_s=60)
    for e in edges:
        assert sha256_of(fleet.model_file(e.name, "mlp", "1")) == pushed.manifest["sha256"]
    assert unstored_versions(fleet, s3_server, bucket, "mlp", ["1"]) == []
