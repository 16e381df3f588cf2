"""A pending INT8 candidate promoted on live evidence, end to end: a real quantizing central
and a real edge. The push's guard had too few samples to prove INT8 (32 calibration rows: 16
held out, all agreeing, cannot prove 97 %), so FP32 is served and the candidate travels as
``pending``; the edge runs it beside FP32 on live requests, central pools the counts and,
once their lower bound clears the threshold, re-issues the version's signed manifest with
INT8 as its default. The edge switches to it; the candidate's evidence is on the API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.zoo.digits import DigitsModel, build_digits
from support.brokers import MosquittoBroker
from support.cli import run_cli
from support.fleet import EdgeFactory, central_settings, events_of
from support.wait import wait_for

URL = "/api/v1/models/digits/versions"
ROWS = 32


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    return build_digits(tmp_path_factory.mktemp("zoo"))


@pytest.fixture
async def central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, quantize={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


async def _push_unproven(api: httpx.AsyncClient, digits: DigitsModel, tmp_path: Path) -> dict[str, Any]:
    with np.load(digits.calibration_path) as data:
        np.savez(tmp_path / "few.npz", **{name: data[name][:32] for name in data.files})
    files = {"file": digits.onnx_path.read_bytes(), "calibration": (tmp_path / "few.npz").read_bytes()}
    pushed = await api.post(URL, files=files)
    assert pushed.status_code == 201, pushed.text
    return dict(pushed.json())


async def _infer(client: httpx.AsyncClient, digits: DigitsModel, start: int) -> None:
    rows = np.take(digits.test_x, range(start, start + ROWS), axis=0, mode="wrap").astype(np.float32)
    body = {"inputs": [{"name": digits.input_name, "datatype": "FP32", "shape": list(rows.shape),
                        "data": rows.ravel().tolist()}]}  # fmt: skip
    response = await client.post("/v2/models/digits/infer", json=body)
    assert response.status_code == 200, response.text


async def _manifest(api: httpx.AsyncClient) -> dict[str, Any]:
    response = await api.get(f"{URL}/1")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def _edge_artifact(client: httpx.AsyncClient) -> str | None:
    status = (await client.get("/api/v1/status")).json()
    choice = status.get("artifacts", {}).get("digits:1")
    return choice["artifact"] if choice else None


async def test_a_pending_int8_is_shadowed_then_promoted_and_served(
    central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, digits: DigitsModel, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=central.http_url, timeout=120) as api:
        pushed = await _push_unproven(api, digits, tmp_path)
        manifest, int8 = pushed["manifest"], pushed["report"]["quantization"]["int8"]
        assert manifest["artifact"] == "fp32" and int8["status"] == "unproven"
        [candidate] = int8["pending"]
        assert [p["artifact"] for p in manifest["pending"]] == [candidate]
        assert manifest["alternatives"] == []  # nothing servable but FP32 until promoted

        # Every request sampled; timing off, so the edge serves central's default as it changes.
        edge: EdgeServer = await make_edge(
            "edge-1", central, heartbeat={"enabled": True, "interval_s": 0.3},
            broker={"host": mosquitto.host, "port": mosquitto.port},
            inference={"choice": {"enabled": False}, "shadow_sample": 1.0},
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
            await wait_for(lambda: edge.edge.repository.ready(), 60, "digits served")
            assert await _edge_artifact(client) == "fp32"
            await _infer(client, digits, 0)
            shadow = await _wait_shadow(client)
            assert shadow["artifact"] == "fp32" and shadow["candidate"] == candidate and shadow["samples"] > 0

            agreement = "/api/v1/models/digits/versions/1/agreement"
            seen: list[dict[str, Any]] = []  # the evidence as it accumulates, before promotion
            deadline = time.monotonic() + 30
            while not seen:  # the first request's 32 rows, heard before more are sent: too few to prove
                assert time.monotonic() < deadline, (await api.get(agreement)).json()
                evidence = (await api.get(agreement)).json()["pending"].get(candidate)
                if evidence is not None and evidence["per_node"].get("edge-1", {}).get("samples"):
                    seen.append(evidence)
                else:
                    await asyncio.sleep(0.1)
            sent, deadline = 1, time.monotonic() + 60
            while not await events_of(api, "int8_promoted"):  # the judge runs every 0.5 s, not per request
                assert time.monotonic() < deadline, (await api.get(agreement)).json()
                await _infer(client, digits, sent * ROWS)
                sent += 1
                evidence = (await api.get(agreement)).json()["pending"].get(candidate)
                if evidence is not None and evidence["status"] == "pending":
                    seen.append(evidence)
            counted = [e for e in seen if e["per_node"].get("edge-1", {}).get("samples")]
            assert counted and not counted[0]["proven"] and "does not yet reach" in counted[0]["reason"]
            assert counted[0]["per_node"]["edge-1"]["candidate"] == candidate

            [event] = await events_of(api, "int8_promoted")
            assert event["detail"]["artifact"] == candidate and event["detail"]["proven"] is True, event
            reissued = await _manifest(api)
            assert reissued["artifact"] == candidate and reissued["pending"] == []
            assert [a["artifact"] for a in reissued["alternatives"]] == ["fp32"]
            assert reissued["quantization"]["int8"]["status"] == "promoted"
            assert reissued["signature"] and reissued["signature"] != manifest["signature"]
            report = (await api.get(agreement)).json()["pending"][candidate]
            assert report["status"] == "promoted" and report["measures"]["top1"]["lower_bound"] >= 0.97

            shown = await run_cli(tmp_path, central, "models", "agreement", "digits", "1")
            assert f"pending {candidate} (promoted, 1 node(s))" in shown and "reaches threshold 0.97" in shown
            await _poll(lambda: _edge_artifact(client), candidate, 60, "the edge serves the promoted INT8")
            await _infer(client, digits, 0)
            listed = (await api.get("/api/v1/models/digits/versions")).json()
            assert listed[0]["artifact"] == candidate and listed[0]["served_reason"] is None


async def _poll(read: Callable[[], Awaitable[Any]], wanted: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while (got := await read()) != wanted:
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what} (last: {got!r})"
        await asyncio.sleep(0.1)


async def _wait_shadow(client: httpx.AsyncClient) -> dict[str, Any]:
    async def sampled() -> bool:
        shadow = (await client.get("/api/v1/status")).json()["shadow"].get("digits:1")
        return bool(shadow and shadow["samples"] > 0)

    await _poll(sampled, True, 30, "the pending candidate sampled")
    return dict((await client.get("/api/v1/status")).json()["shadow"]["digits:1"])


async def _edge_status(client: httpx.AsyncClient) -> dict[str, Any]:
    return dict((await client.get("/api/v1/status")).json())
