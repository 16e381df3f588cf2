"""Central's /metrics on a real fleet: two edges heartbeating through Mosquitto, a push,
inference through the gateway, one edge leaving. Each step must show in the scrape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from central.server import CentralServer
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.metrics import metric_samples, sample
from support.wait import wait_for

_PROGRESS = ("pending", "loading", "ready", "failed")
_BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": np.ones(32).tolist()}]}


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker))
    await server.start()
    yield server
    await server.stop()


async def _scrape(api: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return metric_samples(response.text)


async def test_metrics_follow_membership_pushes_gateway_traffic_and_a_failover(
    mqtt_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    edges = [await make_edge(f"edge-{i}", mqtt_central, heartbeat=heartbeat, broker=broker) for i in range(2)]
    tracker = mqtt_central.central.liveness
    await wait_for(lambda: tracker.counts()["alive"] == 2, 20, "two alive nodes")
    async with httpx.AsyncClient(base_url=mqtt_central.http_url, timeout=30) as api:
        before = await _scrape(api)
        assert sample(before, "modelfleet_membership_nodes", state="alive") == 2
        assert sample(before, "modelfleet_nodes") == 2
        assert ("modelfleet_registry_models", frozenset()) in before and sample(
            before, "modelfleet_registry_models"
        ) == 0
        assert sample(before, "modelfleet_registry_blob_bytes") == 0

        pushed = await push(api, "tiny", small_model_file)
        assert pushed.status_code == 201
        manifest = pushed.json()["manifest"]
        await wait_for(lambda: len(tracker.ready_endpoints("tiny")) == 2, 30, "tiny ready on both edges")
        for _ in range(5):
            assert (await api.post("/v2/models/tiny/infer", json=_BODY)).status_code == 200
        assert (await api.post("/v2/models/ghost/infer", json=_BODY)).status_code == 404  # never pushed

        staged = await api.post("/api/v1/models/tiny/versions?activate=false", content=small_model_file.read_bytes())
        assert staged.status_code == 201
        started = await api.post("/api/v1/models/tiny/rollouts", json={"version": "2", "canary": 0.5})
        assert started.status_code == 201
        during = await _scrape(api)
        assert sample(during, "modelfleet_rollouts", state="canary") == 1
        assert sample(during, "modelfleet_rollouts", state="complete") == 0
        progress = [sample(during, "modelfleet_rollout_nodes", model="tiny", version="2", state=s) for s in _PROGRESS]
        assert sum(progress) == len(started.json()["targets"]) == 2
        assert sample(during, "modelfleet_registry_versions") == 2

        # A clean "offline" on MQTT only: dead at once and evicted by the failover coordinator.
        # (A whole edge.stop() also closes its watch stream, which may take it off the ring
        # first, as a leave rather than a failover.)
        await edges[0].edge.heartbeat.stop()
        await wait_for(lambda: tracker.counts()["dead"] == 1, 10, "the leaver dead")
        after = await _scrape(api)

    assert sample(after, "modelfleet_membership_nodes", state="alive") == 1
    assert sample(after, "modelfleet_membership_nodes", state="dead") == 1
    assert sample(after, "modelfleet_membership_events_total", type="node_dead") == 1
    assert sample(after, "modelfleet_failovers_total") == 1
    assert sample(after, "modelfleet_nodes") == 1
    assert sample(after, "modelfleet_heartbeats_processed_total") > sample(
        before, "modelfleet_heartbeats_processed_total"
    )
    # the survivor now owns every chunk of the active version
    assert sample(after, "modelfleet_placement_chunks", node="edge-1") == len({c["digest"] for c in manifest["chunks"]})
    assert sample(after, "modelfleet_registry_models") == 1
    assert sample(after, "modelfleet_registry_blob_bytes") == manifest["size"]  # v2 has the same bytes: deduplicated
    assert sample(after, "modelfleet_origin_sent_bytes_total") > 0
    assert sample(after, "modelfleet_gateway_requests_total", model="tiny", outcome="ok") == 5
    assert sample(after, "modelfleet_gateway_requests_total", model="ghost", outcome="not_found") == 1
    assert sample(after, "modelfleet_gateway_request_duration_seconds_count", model="tiny") == 5
    assert sample(after, "modelfleet_gateway_request_duration_seconds_bucket", model="tiny", le="+Inf") == 5
    assert sample(after, "modelfleet_gateway_attempts_total") >= 5
    assert sample(after, "modelfleet_gateway_timeouts_total") == 0
    assert sample(after, "modelfleet_membership_messages_dropped_total", reason="malformed") == 0
    assert sample(after, "modelfleet_membership_bdseq_ahead_ignored_total") == 0
