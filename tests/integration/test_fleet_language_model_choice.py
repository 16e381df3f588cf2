"""A language model's artifact choice is shared like a tensor model's: the first edge of a
hardware class times the weight-only artifacts of the trained zoo Llama by decode tokens/s,
central hears its verdict in the heartbeat (a real Mosquitto), and the next edge of the
class serves the same artifact without timing, having fetched only that one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.server import EdgeServer
from modelfleet.zoo.llm import eval_text, trained_llm
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, version_state
from support.wait import wait_for

QUANTIZE = {"enabled": True, "text": {"recipes": ["int4-b32", "int8-wo"], "max_windows": 4}}
QUICK_CHOICE = {"budget_s": 1.0, "min_rounds": 2, "max_rounds": 4, "warmup_runs": 1}


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    settings = central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, quantize=QUANTIZE)
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


def _options(broker: MosquittoBroker) -> dict[str, Any]:
    return {
        # No live shadow: its FP32 reference would be assembled beside the served artifact, and
        # this test counts what the verdict alone makes an edge assemble.
        "inference": {"choice": QUICK_CHOICE, "shadow_sample": 0.0},
        "heartbeat": {"enabled": True, "interval_s": 0.3},
        "broker": {"host": broker.host, "port": broker.port},
    }


async def _choice(edge: EdgeServer) -> ArtifactChoice:
    deadline = time.monotonic() + 60
    while version_state(edge, "zoo-llm", "1") != "complete" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert version_state(edge, "zoo-llm", "1") == "complete"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=10) as client:
        status = (await client.get("/api/v1/status")).json()
    return ArtifactChoice.from_json(status["artifacts"]["zoo-llm:1"])


async def test_a_language_models_decode_verdict_serves_the_next_node_of_the_class(
    mqtt_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory
) -> None:
    folder = trained_llm()
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    files.append(("eval", ("eval.txt", eval_text().encode())))
    async with httpx.AsyncClient(base_url=mqtt_central.http_url, timeout=120) as api:
        response = await api.post("/api/v1/models/zoo-llm/versions", files=files)
    assert response.status_code == 201, response.text

    edge_a = await make_edge("edge-a", mqtt_central, **_options(mosquitto))
    timed = await _choice(edge_a)
    assert timed.source == "measured" and "tokens/s b1/b8" in timed.reason
    verdicts = mqtt_central.central.verdicts
    klass = edge_a.edge.hardware_class
    await wait_for(lambda: verdicts.get(("zoo-llm", "1"), klass) is not None, 10, "central hears the verdict")

    edge_b = await make_edge("edge-b", mqtt_central, **_options(mosquitto))
    reused = await _choice(edge_b)
    assert (reused.artifact, reused.source, reused.from_node) == (timed.artifact, "verdict", "edge-a")
    assert (reused.speedup_b1, reused.speedup_b8) == (timed.speedup_b1, timed.speedup_b8)
    versions = edge_b.settings.data_dir / "versions" / "zoo-llm" / "1"
    assert [p.name for p in versions.iterdir()] == [timed.artifact]  # nothing else assembled, nothing timed
    assert (versions / timed.artifact / "genai_config.json").is_file()
