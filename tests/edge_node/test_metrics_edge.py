"""An edge's /metrics on a real fleet: chunk bytes by source, the cache, heartbeats,
versions and inference all move as a user would expect after pushes and requests."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, push, version_state, wait_serving
from support.metrics import Samples, metric_samples, sample
from support.wait import wait_for

_BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": np.ones(32).tolist()}]}


async def _scrape(edge: EdgeServer) -> Samples:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}") as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return metric_samples(response.text)


async def test_edge_metrics_count_sources_cache_heartbeats_versions_and_requests(
    central: CentralServer, api: httpx.AsyncClient, mosquitto: MosquittoBroker, make_edge: EdgeFactory,
    small_model_file: Path,
) -> None:  # fmt: skip
    heartbeat = {"enabled": True, "interval_s": 0.2}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    edges = [await make_edge(f"edge-{i}", central, heartbeat=heartbeat, broker=broker) for i in range(2)]
    empty = await _scrape(edges[0])
    assert sample(empty, "modelfleet_edge_versions", state="complete") == 0
    assert sample(empty, "modelfleet_fetch_bytes_total", source="origin") == 0

    manifest = (await push(api, "tiny", small_model_file)).json()["manifest"]
    await wait_for(lambda: all(version_state(e, "tiny", "1") == "complete" for e in edges), 30, "tiny on both")
    unique = {c["digest"]: c["size"] for c in manifest["chunks"]}
    # the same bytes under another name: every chunk is already in each cache
    await push(api, "tiny-copy", small_model_file)
    await wait_for(lambda: all(version_state(e, "tiny-copy", "1") == "complete" for e in edges), 30, "copy on both")
    for edge in edges:  # both versions loaded: the model gauge below counts two ready ones per edge
        await wait_serving(edge, "tiny", "1")
        await wait_serving(edge, "tiny-copy", "1")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edges[0].http_port}") as client:
        for _ in range(3):
            assert (await client.post("/v2/models/tiny/infer", json=_BODY)).status_code == 200
    await wait_for(lambda: all(e.edge.heartbeat.heartbeats_sent >= 2 for e in edges), 10, "heartbeats")

    scrapes = [await _scrape(e) for e in edges]
    for s in scrapes:
        fetched = sample(s, "modelfleet_fetch_bytes_total", source="peer") + sample(
            s, "modelfleet_fetch_bytes_total", source="origin"
        )
        assert fetched == sum(unique.values())  # every chunk came over the wire exactly once
        assert sample(s, "modelfleet_fetch_bytes_total", source="cache") >= sum(unique.values())
        assert sample(s, "modelfleet_fetch_chunks_total", source="cache") >= len(unique)
        assert sample(s, "modelfleet_cache_written_bytes_total") == sum(unique.values())
        assert sample(s, "modelfleet_cache_bytes") >= sum(unique.values())
        assert sample(s, "modelfleet_fetch_failures_total") == 0
        assert sample(s, "modelfleet_edge_versions", state="complete") == 2
        assert sample(s, "modelfleet_edge_models", state="ready") == 2
        assert sample(s, "modelfleet_heartbeats_sent_total") >= 2
        assert sample(s, "modelfleet_mqtt_connected") == 1 and sample(s, "modelfleet_central_connected") == 1
    # with two owners per chunk, the first owner pulls from central and the second from it
    origin = sum(sample(s, "modelfleet_fetch_bytes_total", source="origin") for s in scrapes)
    served = sum(sample(s, "modelfleet_peer_served_bytes_total") for s in scrapes)
    relayed = sum(sample(s, "modelfleet_fetch_bytes_total", source="peer") for s in scrapes)
    if sum(sample(s, "modelfleet_fetch_peer_errors_total") for s in scrapes) == 0:
        assert origin == sum(unique.values()) and served == relayed > 0
    else:  # a peer that timed out under load: its chunk came from the origin instead
        assert sum(unique.values()) <= origin <= 2 * sum(unique.values()) and served >= relayed
    assert sample(scrapes[0], "modelfleet_inference_requests_total", model="tiny", version="1", outcome="ok") == 3
