"""Triton's own clients against an edge and against central's gateway. Over HTTP
(``tritonclient.http``): health, model readiness, metadata, configuration, and binary-data
inference with FP32 and INT64 inputs, the outputs checked against ONNX Runtime on the same
files; a request the model refuses reaches the client as Triton's exception with status 400.
Over KServe v2 gRPC (``tritonclient.grpc``, in a process of its own): the same calls on the
inference gRPC ports, refusals arriving with the right gRPC status.

The client is synchronous (gevent), and the servers run on the test's event loop, so every
call runs in a worker thread."""

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
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.request_models import VOCAB, build_token_model
from support.wait import wait_for

#: Triton's gRPC client registers the same protobuf message names as ``fleetwire.kserve``
#: (imported here by the servers), so it runs in a process of its own.
GRPC_CLIENT = Path(__file__).with_name("triton_grpc_client.py")


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
    tracker = mqtt_central.central.liveness
    await wait_for(lambda: all(tracker.ready_endpoints(m) for m in files), 30, "both models ready in heartbeats")
    return mqtt_central, edge, files


def _reference(path: Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _input(name: str, array: np.ndarray, datatype: str) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=True)
    return tensor


def _session(url: str, files: dict[str, Path]) -> dict[str, Any]:
    """Everything a Triton user would try, with Triton's client; returns what it saw."""
    client = triton.InferenceServerClient(url=url, connection_timeout=30.0, network_timeout=30.0)
    try:
        seen: dict[str, Any] = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "model_ready": client.is_model_ready("tiny") and client.is_model_ready("tokens", "1"),
            "ghost_ready": client.is_model_ready("ghost"),
            "metadata": client.get_model_metadata("tokens"),
            "config": client.get_model_config("tiny", "1"),
        }
        x = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
        out = triton.InferRequestedOutput("logits", binary_data=True)
        result = client.infer("tiny", [_input("input", x, "FP32")], outputs=[out])
        seen["tiny"] = (result.as_numpy("logits"), _reference(files["tiny"], {"input": x}))

        ids = np.array([[1, 5, VOCAB - 1, 0], [7, 7, 2, 3]], dtype=np.int64)
        mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64)
        inputs = [_input("input_ids", ids, "INT64"), _input("attention_mask", mask, "INT64")]
        result = client.infer("tokens", inputs, model_version="1", outputs=[out])
        seen["tokens"] = (
            result.as_numpy("logits"),
            _reference(files["tokens"], {"input_ids": ids, "attention_mask": mask}),
        )

        bad = ids.copy()
        bad[1, 2] = VOCAB + 1
        try:
            client.infer("tokens", [_input("input_ids", bad, "INT64"), _input("attention_mask", mask, "INT64")])
        except InferenceServerException as exc:
            seen["bad"] = (exc.status(), exc.message())
        return seen
    finally:
        client.close()


def _check(seen: dict[str, Any]) -> None:
    assert seen["live"] and seen["ready"] and seen["model_ready"]
    assert not seen["ghost_ready"]
    meta = seen["metadata"]
    assert meta["name"] == "tokens" and meta["platform"] == "onnxruntime_onnx"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("input_ids", "INT64", [-1, -1]),
        ("attention_mask", "INT64", [-1, -1]),
    ]
    config = seen["config"]
    assert config["name"] == "tiny" and config["backend"] == "onnxruntime" and config["max_batch_size"] > 0
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [32]}]
    for model in ("tiny", "tokens"):
        got, want = seen[model]
        assert got.dtype == np.float32 and got.shape == want.shape, model
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    status, message = seen["bad"]
    assert str(status) == "400" and "input_ids" in message and str(VOCAB + 1) in message, seen["bad"]


@pytest.mark.timeout(180)
async def test_tritons_client_against_an_edge_and_the_gateway(
    fleet: tuple[CentralServer, EdgeServer, dict[str, Path]],
) -> None:
    central, edge, files = fleet
    _check(await asyncio.to_thread(_session, f"127.0.0.1:{edge.http_port}", files))
    _check(await asyncio.to_thread(_session, central.http_url.removeprefix("http://"), files))
    stats = central.central.gateway.stats
    assert stats.node_failures == 0 and stats.retries == 0


async def _triton_grpc_session(url: str, feed: dict[str, Any]) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(GRPC_CLIENT),
        json.dumps({"url": url, **feed}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, err.decode()
    seen: dict[str, Any] = json.loads(out)
    return seen


def _check_grpc(seen: dict[str, Any], files: dict[str, Path], feed: dict[str, Any], server: str, ghost: str) -> None:
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
    seen = await _triton_grpc_session(edge.infer_grpc_address, feed)
    _check_grpc(seen, files, feed, "modelfleet-edge", ghost="StatusCode.NOT_FOUND")
    seen = await _triton_grpc_session(central.infer_grpc_address, feed)
    # the registry has never heard of "ghost": 404 over REST, NOT_FOUND here (as the edge)
    _check_grpc(seen, files, feed, "modelfleet-gateway", ghost="StatusCode.NOT_FOUND")
    stats = central.central.gateway.stats
    assert stats.node_failures == 0 and stats.retries == 0 and stats.requests >= 4
