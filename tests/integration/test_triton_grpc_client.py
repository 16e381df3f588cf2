"""Triton's own gRPC client (``tritonclient.grpc``) against an edge's and central's gateway's
KServe v2 gRPC ports: health, server and model metadata, model readiness, inference with
FP32 and INT64 inputs (outputs checked against ONNX Runtime on the same files), and refusals
that reach the client as Triton's exception with the right gRPC status.

Triton's client registers the same protobuf message names as ``fleetwire.kserve`` (imported
here by the servers), so it runs in a process of its own (``triton_grpc_client.py``)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from brokers import MosquittoBroker
from central.server import CentralServer
from conftest import EdgeFactory, central_settings, push, wait_for
from edge_node.server import EdgeServer
from request_models import VOCAB, build_token_model

CLIENT = Path(__file__).with_name("triton_grpc_client.py")


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    """A central that learns from heartbeats which edges serve what (its gateway routes by it)."""
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker))
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def fleet(
    mqtt_central: CentralServer,
    mosquitto: MosquittoBroker,
    make_edge: EdgeFactory,
    small_model_file: Path,
    tmp_path: Path,
) -> tuple[CentralServer, EdgeServer, dict[str, Path]]:
    """A central and one edge serving "tiny" (FP32) and "tokens" (INT64), both known to the gateway."""
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    edge = await make_edge("edge-0", mqtt_central, heartbeat=heartbeat, broker=broker)
    files = {"tiny": small_model_file, "tokens": build_token_model(tmp_path / "tokens.onnx")}
    async with httpx.AsyncClient(base_url=mqtt_central.http_url, timeout=30) as api:
        for name, path in files.items():
            assert (await push(api, name, path)).status_code == 201
    tracker = mqtt_central.central.membership
    await wait_for(lambda: all(tracker.ready_endpoints(m) for m in files), 30, "both models ready in heartbeats")
    return mqtt_central, edge, files


async def _triton_session(url: str, feed: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CLIENT),
        json.dumps({"url": url, **feed}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    seen: dict[str, Any] = json.loads(out)
    return seen


def _reference(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _check(seen: dict[str, Any], files: dict[str, Path], feed: dict[str, Any], server: str, ghost: str) -> None:
    assert seen["live"] and seen["ready"] and seen["model_ready"]
    assert not seen["ghost_ready"]
    assert seen["server"]["name"] == server
    meta = seen["metadata"]
    assert meta["name"] == "tokens" and meta["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("input_ids", "INT64", ["-1", "-1"]),  # int64 fields as JSON strings: protobuf's JSON mapping
        ("attention_mask", "INT64", ["-1", "-1"]),
    ]
    x = np.array(feed["x"], dtype=np.float32)
    ids, mask = np.array(feed["ids"], dtype=np.int64), np.array(feed["mask"], dtype=np.int64)
    want = _reference(files["tiny"], {"input": x})
    np.testing.assert_allclose(np.array(seen["tiny"], dtype=np.float32), want, rtol=1e-5, atol=1e-5)
    assert seen["tiny_id"] == "r-1"
    want = _reference(files["tokens"], {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(np.array(seen["tokens"], dtype=np.float32), want, rtol=1e-5, atol=1e-5)
    status, message = seen["bad"]
    assert status == "StatusCode.INVALID_ARGUMENT" and "input_ids" in message and str(VOCAB + 1) in message, seen
    assert seen["ghost"][0] == ghost and "ghost" in seen["ghost"][1], seen["ghost"]


@pytest.mark.timeout(180)
async def test_tritons_grpc_client_against_an_edge_and_the_gateway(
    fleet: tuple[CentralServer, EdgeServer, dict[str, Path]],
) -> None:
    central, edge, files = fleet
    rng = np.random.default_rng(1)
    feed = {
        "x": rng.standard_normal((3, 32)).astype(np.float32).tolist(),
        "ids": [[1, 5, VOCAB - 1, 0], [7, 7, 2, 3]],
        "mask": [[1, 1, 1, 0], [1, 1, 1, 1]],
        "bad_id": VOCAB + 1,
    }
    assert edge.infer_grpc_address is not None and central.infer_grpc_address is not None
    seen = await _triton_session(edge.infer_grpc_address, feed)
    _check(seen, files, feed, "modelfleet-edge", ghost="StatusCode.NOT_FOUND")
    seen = await _triton_session(central.infer_grpc_address, feed)
    # the gateway knows no node that serves "ghost": 503 over REST, UNAVAILABLE here
    _check(seen, files, feed, "modelfleet-gateway", ghost="StatusCode.UNAVAILABLE")
    stats = central.central.gateway.stats
    assert stats.node_failures == 0 and stats.retries == 0 and stats.requests >= 4
