"""The dashboard's data: one snapshot document and the live SSE stream, against a real
in-process central (REST, gRPC, gateway) and a real edge serving a pushed model.

Liveness is fed through the tracker's own input (``on_heartbeat``, what the MQTT consumer
calls for every heartbeat); the browser test covers the MQTT path end to end."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import numpy as np

from central.server import CentralServer
from fleetwire.mqtt.payloads import CacheInfo, GenerationInfo, Heartbeat, LoadInfo, ModelInfo
from support.decoder_models import build_decoder
from support.fleet import EdgeFactory, central_settings, push, version_state, wait_serving
from support.sse import sse_events
from support.wait import wait_for

#: The heartbeat interval while the test sets up (a loaded machine takes seconds there), and
#: the one the node then goes silent on: suspect and dead within a second or so.
SETUP_INTERVAL_S = 60.0
INTERVAL_S = 0.2


def heartbeat(node_id: str, http_address: str, seq: int, interval_s: float = INTERVAL_S) -> Heartbeat:
    return Heartbeat(
        node_id=node_id,
        bdseq=1,
        seq=seq,
        ts=int(time.time() * 1000),
        interval_s=interval_s,
        load=LoadInfo(inflight=2, rps=7.5, p50_ms=3.0, p99_ms=11.0),
        models=[ModelInfo(name="tiny", version="1", state="ready")],
        cache=CacheInfo(bytes=4096, capacity=1 << 20, hits=3, misses=1),
        http_address=http_address,
    )


async def test_stream_sends_the_fleet_then_each_state_change_as_it_happens(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    edge = await make_edge("edge-a", central)
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", 30, "edge-a holding tiny:1")
    await wait_serving(edge, "tiny", "1")
    tracker = central.central.liveness
    address = f"127.0.0.1:{edge.http_port}"
    tracker.on_heartbeat("edge-a", heartbeat("edge-a", address, 0, SETUP_INTERVAL_S))
    await wait_for(lambda: bool(tracker.ready_endpoints("tiny")), 10, "edge-a ready in the tracker")
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": np.ones(32).tolist()}]}
    assert (await api.post("/v2/models/tiny/infer", json=body)).status_code == 200

    async with api.stream("GET", "/api/v1/stream") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
        name, snap = await anext(events)
        assert name == "snapshot"
        (node,) = snap["nodes"]
        assert (node["node_id"], node["state"], node["registered"]) == ("edge-a", "alive", True)
        assert node["load"]["rps"] == 7.5 and node["cache"]["bytes"] == 4096 and node["owned_chunks"] > 0
        (model,) = snap["models"]
        assert model["latest"] == "1" and model["versions"][0]["placed"] is True
        assert model["serving"] == {"1": {"ready": ["edge-a"]}}
        (placed,) = snap["placement"]
        assert placed["model"] == "tiny" and placed["per_node"]["edge-a"]["primary"] == placed["chunks"] > 0
        assert snap["gateway"]["totals"]["requests"] == 1
        assert snap["rollouts"] is None or isinstance(snap["rollouts"], list)

        # The edge's heartbeats stop: the stream says so between snapshots, suspect then dead.
        tracker.on_heartbeat("edge-a", heartbeat("edge-a", address, 1))  # the last, on the short interval
        seen: list[str] = []
        async with asyncio.timeout(20):
            async for name, data in events:
                if name == "membership" and data["node_id"] == "edge-a":
                    seen.append(data["state"])
                    if data["state"] == "dead":
                        assert data["event"]["type"] == "node_dead"
                        break
        assert seen == ["suspect", "dead"]
        name, snap = await anext(events)
        assert name == "snapshot" and snap["nodes"][0]["state"] == "dead"
        assert [e["type"] for e in snap["events"][:2]] == ["node_dead", "node_suspect"]


async def test_a_pushed_language_model_is_listed_unserved_then_with_its_engines_figures(
    central: CentralServer, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The Language models panel's data: a decoder pushed but served nowhere is named (the page
    says so), and a node's heartbeat with the engine's figures makes its row."""
    folder = build_decoder(tmp_path / "tiny")
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    assert (await api.post("/api/v1/models/chat/versions", files=files)).status_code == 201
    panel = (await api.get("/api/v1/dashboard")).json()["language_models"]
    assert panel == {"rows": [], "tokens_per_s": 0, "declared": ["chat"]}

    figures = GenerationInfo(tokens_per_s=55.0, running=2, waiting=0, kv_usage=0.125, ttft_p50_ms=8.0, ttft_p99_ms=31.0)
    beat = heartbeat("edge-a", "127.0.0.1:9", 0, SETUP_INTERVAL_S).model_copy(
        update={"models": [ModelInfo(name="chat", version="1", state="ready", generation=figures)]}
    )
    central.central.liveness.on_heartbeat("edge-a", beat)
    snap = (await api.get("/api/v1/dashboard")).json()
    (row,) = snap["language_models"]["rows"]
    assert (row["node_id"], row["node_state"], row["model"], row["version"], row["kind"]) == (
        "edge-a", "alive", "chat", "1", "decoder",
    )  # fmt: skip
    assert (row["tokens_per_s"], row["running"], row["waiting"], row["kv_usage"]) == (55.0, 2, 0, 0.125)
    assert (row["ttft_p50_ms"], row["ttft_p99_ms"]) == (8.0, 31.0)
    assert snap["language_models"]["tokens_per_s"] == 55.0 and snap["models"][0]["kind"] == "decoder"


async def test_page_and_assets_are_served_from_the_package(api: httpx.AsyncClient) -> None:
    page = await api.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/dashboard/app.js">' in page.text and "/dashboard/style.css" in page.text
    script = await api.get("/dashboard/app.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert (await api.get("/dashboard/style.css")).headers["content-type"].startswith("text/css")
    missing = await api.get("/dashboard/secrets.txt")
    assert missing.status_code == 404 and "secrets.txt" in missing.json()["error"]
    snapshot = (await api.get("/api/v1/dashboard")).json()
    assert snapshot["nodes"] == [] and snapshot["models"] == [] and snapshot["gateway"]["enabled"] is True


async def test_central_stops_while_a_browser_keeps_a_stream_open(tmp_path: Path) -> None:
    server = CentralServer(central_settings(tmp_path / "central"))
    await server.start()
    async with (
        httpx.AsyncClient(base_url=server.http_url) as client,
        client.stream("GET", "/api/v1/stream") as response,
    ):
        events = sse_events(response)
        assert (await anext(events))[0] == "snapshot"
        await asyncio.wait_for(server.stop(), 15)  # would wait forever on the open stream
        rest = [name async for name, _ in events]
    assert "membership" not in rest
