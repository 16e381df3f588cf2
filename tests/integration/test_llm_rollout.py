"""Language models through central's rollouts and live check (a real central, Mosquitto, real
edges): a decoder version rolls out in waves and by a staged flip and the edges' generation
API answers with it; a 4-bit artifact whose greedy tokens FP32 disagrees with on live prompts
(the push's held-out text was unlike them) is flagged and the edge falls back to FP32."""

from __future__ import annotations

import sysconfig
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.brokers import MosquittoBroker
from support.decoder_models import build_decoder
from support.fleet import EdgeFactory, central_settings, events_of, wait_rollout
from support.wait import wait_for

MODEL = "chat"
PUSH = f"/api/v1/models/{MODEL}/versions"
GENERATION = {"intra_op_threads": 1, "prefix_cache": False}
#: Live prompts: lines of real code, each a prefix the model has not seen in the held-out text.
PROMPTS = [
    line.strip()
    for line in (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text().splitlines()
    if len(line.strip()) > 20
]


async def _central(tmp_path: Path, mosquitto: MosquittoBroker, **overrides: Any) -> CentralServer:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    settings = central_settings(
        tmp_path / "central", mqtt=mqtt, broker=broker, rollout={"interval_s": 0.2}, **overrides
    )
    server = CentralServer(settings)
    await server.start()
    return server


@pytest.fixture
async def lm_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    server = await _central(tmp_path, mosquitto)
    yield server
    await server.stop()


@pytest.fixture
async def quantizing_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    server = await _central(tmp_path, mosquitto, quantize={"enabled": True})
    yield server
    await server.stop()


async def _edge(make_edge: EdgeFactory, node_id: str, central: CentralServer, mosquitto: MosquittoBroker,
                **inference: Any) -> EdgeServer:  # fmt: skip
    return await make_edge(
        node_id, central, heartbeat={"enabled": True, "interval_s": 0.3},
        broker={"host": mosquitto.host, "port": mosquitto.port}, generation=GENERATION,
        inference={"choice": {"enabled": False}, **inference},
    )  # fmt: skip


async def _push(api: httpx.AsyncClient, folder: Path, version: str, eval_text: str | None = None,
                **params: str) -> dict[str, Any]:  # fmt: skip
    files = [("file", ("model.onnx", (folder / "model.onnx").read_bytes()))]
    files += [("data", (p.name, p.read_bytes())) for p in sorted(folder.iterdir()) if p.name != "model.onnx"]
    if eval_text is not None:
        files.append(("eval", ("eval.txt", eval_text.encode())))
    response = await api.post(PUSH, params={"version": version, **params}, files=files)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def _generate(edge: EdgeServer, prompt: str = "def f(x):") -> dict[str, Any]:
    """OIP generate on the edge, greedy: which version answered and its text."""
    body = {"text_input": prompt, "parameters": {"max_tokens": 6, "temperature": 0}}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as http:
        reply = await http.post(f"/v2/models/{MODEL}/generate", json=body)
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


def _serving(edge: EdgeServer) -> str | None:
    try:
        return edge.edge.repository.get(MODEL).version
    except Exception:
        return None


async def test_a_language_model_rolls_out_in_waves_and_by_a_staged_flip(
    lm_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edges = [await _edge(make_edge, f"edge-{i}", lm_central, mosquitto) for i in range(2)]
    tracker = lm_central.central.liveness
    async with httpx.AsyncClient(base_url=lm_central.http_url, timeout=60) as api:
        await _push(api, build_decoder(tmp_path / "v1"), "1")
        await wait_for(lambda: len(tracker.ready_endpoints(MODEL, "1")) == 2, 60, "v1 ready on both edges")
        first = await _generate(edges[0])
        assert first["model_version"] == "1"

        await _push(api, build_decoder(tmp_path / "v2", peaked=False), "2", activate="false")
        body = {"version": "2", "waves": ["1", "100%"], "soak_s": 0}
        started = await api.post(f"/api/v1/models/{MODEL}/rollouts", json=body)
        assert started.status_code == 201, started.text
        done = await wait_rollout(api, "complete", lambda r: r["state"] == "complete", model=MODEL, timeout=60)
        assert done["ready"] == 2 and done["failed"] == 0 and done["wave_sizes"] == [1, 2]
        await wait_for(lambda: all(_serving(e) == "2" for e in edges), 30, "both edges on v2")
        answers = [await _generate(e) for e in edges]
        assert [a["model_version"] for a in answers] == ["2", "2"]
        assert answers[0]["text_output"] == answers[1]["text_output"] != first["text_output"]

        await _push(api, build_decoder(tmp_path / "v3", layers=3), "3", activate="false")
        await wait_for(lambda: all(e.edge.clock.estimate is not None for e in edges), 10, "clock offsets measured")
        started = await api.post(f"/api/v1/models/{MODEL}/rollouts", json={"version": "3", "stage": True})
        assert started.status_code == 201 and started.json()["state"] == "staging", started.text
        await wait_rollout(api, "staged", lambda r: set(r["nodes"].values()) == {"staged"}, model=MODEL, timeout=60)
        assert all(_serving(e) == "2" for e in edges)  # loaded and held, not served yet
        assert (await api.post(f"/api/v1/models/{MODEL}/rollout/flip", json={})).status_code == 200
        await wait_rollout(api, "complete", lambda r: r["state"] == "complete", model=MODEL, timeout=30)
        await wait_for(lambda: all(_serving(e) == "3" for e in edges), 15, "the flip to v3")
        assert [(await _generate(e))["model_version"] for e in edges] == ["3", "3"]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edges[1].http_port}/v1", timeout=30) as oai:
            listed = (await oai.get("/models")).json()["data"]
        assert [m["id"] for m in listed] == [MODEL]


async def test_a_4_bit_decoder_drifting_on_live_greedy_prompts_falls_back_to_fp32(
    quantizing_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    # Plain random weights: 4 bits flip many of their near-tied decisions. The held-out text is
    # one repeated letter, on which 4 bits agree with FP32 everywhere: the guard passes int4.
    folder = build_decoder(tmp_path / "plain", peaked=False)
    edge = await _edge(make_edge, "edge-0", quantizing_central, mosquitto, shadow_sample=1.0, shadow_cpu_share=0.5)
    async with httpx.AsyncClient(base_url=quantizing_central.http_url, timeout=120) as api:
        pushed = await _push(api, folder, "1", eval_text="a" * 3000)
        int4 = pushed["manifest"]["artifact"]
        assert int4.startswith("int4-"), pushed["report"]
        await wait_for(lambda: _serving(edge) == "1", 60, "int4 served")
        assert edge.edge.repository.get(MODEL).artifact == int4

        url = f"http://127.0.0.1:{edge.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            sent, deadline = 0, time.monotonic() + 90
            while not await events_of(api, "int8_drift"):
                assert time.monotonic() < deadline, "no int8_drift from live greedy traffic"
                for prompt in PROMPTS[sent % len(PROMPTS) :][:10]:  # a few first tokens of many prompts
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0}
                    reply = await http.post("/v1/completions", json=body)
                    assert reply.status_code == 200, reply.text
                sent += 10
            (drift,) = await events_of(api, "int8_drift")
            assert drift["detail"]["artifact"] == int4 and drift["detail"]["nodes"] == ["edge-0"]
            assert drift["detail"]["measure"] == "top1" and drift["detail"]["threshold"] == 0.9
            assert drift["detail"]["reason"].startswith("greedy agreement")
            await wait_for(lambda: edge.edge.repository.get(MODEL).artifact == "fp32", 30, "the edge on FP32")
            (fallback,) = await events_of(api, "int8_fallback")
            assert fallback["detail"]["nodes"] == ["edge-0"] and fallback["detail"]["artifact"] == "fp32"
            reply = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 3})
            assert reply.status_code == 200, reply.text  # FP32 serves the same API

        report = (await api.get(f"/api/v1/models/{MODEL}/versions/1/agreement")).json()
        node = report["nodes"]["edge-0"]
        assert node["serves"] == "fp32" and node["verdict"]["flagged"]
        assert node["shadow"]["measure"] == "token_nll" and node["shadow"]["top1_samples"] >= 10
        logprob = node["token_logprob"]
        assert logprob["mean"] < 0 and logprob["tokens"] == node["shadow"]["samples"]
        assert report["token_logprob"][int4]["tokens"] == logprob["tokens"]
