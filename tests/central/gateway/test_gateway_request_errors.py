"""No request can take a model down through the gateway: a request the model refuses is
the client's 400, passed through from one node and counted against none; a node that is
gone is skipped (the request goes to another), a 400 is not sent twice; a batch that
takes seconds is answered; a request that outlives its read timeout is a 504 that leaves
a live node's breaker alone. Real central, real edges, real uvicorn."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest

from central.gateway import (
    AFFINITY_HEADER,
    NODE_HEADER,
    GatewayProxy,
    StaticNodeSource,
    create_gateway,
)
from central.server import CentralServer
from central.settings import GatewaySettings
from edge_node.server import EdgeServer
from support.fleet import EdgeFactory, push
from support.gateway_harness import candidate, serve_gateway
from support.request_models import (
    BAD_TOKEN_REQUESTS,
    VOCAB,
    build_fill_model,
    build_matmul_chain,
    build_token_model,
    token_request,
)
from support.wait import wait_for

TINY_REQUEST = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.25] * 32}]}
GOOD_TOKENS = token_request([[3, 1, VOCAB - 1]], [[1, 1, 0]])


async def _fleet(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, models: dict[str, Path], n: int = 2
) -> list[EdgeServer]:
    edges = list(await asyncio.gather(*(make_edge(f"edge-{i}", central) for i in range(n))))
    for name, path in models.items():
        assert (await push(api, name, path)).status_code == 201
    await wait_for(
        lambda: all(len([m for m in e.edge.repository.models() if m.state == "ready"]) == len(models) for e in edges),
        60,
        "every edge serving every model",
    )
    return edges


def _gateway(edges: list[EdgeServer], **settings: Any) -> GatewayProxy:
    return create_gateway(StaticNodeSource([candidate(e) for e in edges]), GatewaySettings(**settings))


def _key_owned_by(proxy: GatewayProxy, model: str, node_id: str) -> str:
    return next(k for k in (f"key-{i}" for i in range(1000)) if proxy.router.owner(model, None, k) == node_id)


async def test_bad_requests_are_the_clients_400_and_a_burst_of_them_takes_no_model_down(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path, tmp_path: Path
) -> None:
    models = {"tokens": build_token_model(tmp_path / "tokens.onnx"), "tiny": small_model_file}
    edges = await _fleet(central, api, make_edge, models)
    proxy = _gateway(edges)
    async with serve_gateway(proxy) as gw, httpx.AsyncClient(trust_env=False, timeout=30) as direct:
        for case, (body, words) in BAD_TOKEN_REQUESTS.items():
            attempts = proxy.stats.attempts
            r = await gw.post("/v2/models/tokens/infer", json=body)
            assert r.status_code == 400, (case, r.status_code, r.text)
            assert all(w in r.json()["error"] for w in words), (case, r.json())
            node = next(e for e in edges if e.node_id == r.headers[NODE_HEADER])
            want = await direct.post(f"http://127.0.0.1:{node.http_port}/v2/models/tokens/infer", json=body)
            assert (want.status_code, want.content) == (400, r.content)  # the node's answer, as it gave it
            assert proxy.stats.attempts == attempts + 1, case  # never sent to a second node

        bodies = [b for b, _ in BAD_TOKEN_REQUESTS.values()]
        burst = await asyncio.gather(
            *(gw.post("/v2/models/tokens/infer", json=bodies[i % len(bodies)]) for i in range(20))
        )
        assert [r.status_code for r in burst] == [400] * 20

        for model, body in (("tokens", GOOD_TOKENS), ("tiny", TINY_REQUEST)):  # right after: every model served
            served = await asyncio.gather(*(gw.post(f"/v2/models/{model}/infer", json=body) for _ in range(8)))
            assert [r.status_code for r in served] == [200] * 8, [r.text for r in served if r.status_code != 200]
        status = (await gw.get("/api/v1/gateway")).json()
    breakers = {n["node_id"]: n["breaker"] for n in status["nodes"]}
    assert {b["state"] for b in breakers.values()} == {"closed"}, breakers
    failures = {n: (b["times_opened"], b["last_failure"]) for n, b in breakers.items()}
    assert all(opened == 0 and why is None for opened, why in failures.values()), failures
    assert (
        status["stats"]["node_failures"] == 0
        and status["stats"]["retries"] == 0
        and status["stats"]["unavailable"] == 0
    )


async def test_a_node_that_is_gone_is_skipped_but_a_400_is_never_sent_twice(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edges = await _fleet(central, api, make_edge, {"tokens": build_token_model(tmp_path / "tokens.onnx")})
    proxy = _gateway(edges, failure_threshold=100)
    gone = _key_owned_by(proxy, "tokens", "edge-0")
    async with serve_gateway(proxy) as gw:
        r = await gw.post("/v2/models/tokens/infer", json=GOOD_TOKENS, headers={AFFINITY_HEADER: gone})
        assert r.status_code == 200 and r.headers[NODE_HEADER] == "edge-0"
        await edges[0].stop()  # its port refuses connections from now on

        r = await gw.post("/v2/models/tokens/infer", json=GOOD_TOKENS, headers={AFFINITY_HEADER: gone})
        assert r.status_code == 200 and r.headers[NODE_HEADER] == "edge-1", r.text
        assert proxy.stats.retries == 1 and proxy.stats.attempts == 3
        assert "cannot connect" in (proxy.router.breaker("edge-0").last_failure or "")

        bad, _ = BAD_TOKEN_REQUESTS["id past the vocabulary"]
        owned = _key_owned_by(proxy, "tokens", "edge-1")
        r = await gw.post("/v2/models/tokens/infer", json=bad, headers={AFFINITY_HEADER: owned})
        assert r.status_code == 400 and r.headers[NODE_HEADER] == "edge-1"
        assert proxy.stats.retries == 1 and proxy.stats.attempts == 4  # one more attempt, no retry
        assert proxy.router.breaker("edge-1").consecutive_failures == 0


async def test_a_nodes_own_failure_is_its_500_passed_through_and_not_resent(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    """Out of memory (a 4 EiB fill): the node failed a request it ran. The client gets the
    node's 500; the node's breaker counts it; no other node runs it again."""
    edges = await _fleet(central, api, make_edge, {"fill": build_fill_model(tmp_path / "fill.onnx")})
    proxy = _gateway(edges)
    huge = {"inputs": [{"name": "shape", "datatype": "INT64", "shape": [2], "data": [2**30, 2**30]}]}
    small = {"inputs": [{"name": "shape", "datatype": "INT64", "shape": [2], "data": [2, 3]}]}
    async with serve_gateway(proxy) as gw:
        r = await gw.post("/v2/models/fill/infer", json=huge)
        assert r.status_code == 500 and "Failed to allocate memory" in r.json()["error"], r.text
        assert proxy.stats.attempts == 1 and proxy.stats.node_failures == 1
        assert proxy.router.breaker(r.headers[NODE_HEADER]).consecutive_failures == 1
        r = await gw.post("/v2/models/fill/infer", json=small)
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [2, 3]


def _binary_request(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    )
    headers = {"content-type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return header + x.tobytes(), headers


async def _rows_taking(edge: EdgeServer, seconds: float) -> int:
    """How many rows the chain model takes about ``seconds`` to run on ``edge``, measured
    there (machines differ by 10×; the edge's optimized session differs from a plain one)."""
    x = np.ones((512, 64), dtype=np.float32)
    body, headers = _binary_request(x)
    best = float("inf")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=60) as direct:
        for _ in range(2):
            started = time.perf_counter()
            assert (await direct.post("/v2/models/chain/infer", content=body, headers=headers)).status_code == 200
            best = min(best, time.perf_counter() - started)
    return max(512, min(200_000, int(seconds * 512 / best)))


def _output(response: httpx.Response) -> np.ndarray:
    n = int(response.headers["inference-header-content-length"])
    (meta,) = orjson.loads(response.content[:n])["outputs"]
    return np.frombuffer(response.content[n:], dtype=np.float32).reshape(meta["shape"])


@pytest.fixture
async def chain_fleet(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> tuple[list[EdgeServer], Path]:
    path = build_matmul_chain(tmp_path / "chain.onnx")
    return await _fleet(central, api, make_edge, {"chain": path}), path


@pytest.mark.timeout(180)
async def test_a_batch_that_takes_seconds_is_answered(chain_fleet: tuple[list[EdgeServer], Path]) -> None:
    """Longer than the gateway's old fixed 2 s read timeout: the learned timeout scales with
    the request's rows, so the node gets the time it needs, and nothing is retried."""
    edges, path = chain_fleet
    proxy = _gateway(edges)
    rows = await _rows_taking(edges[0], 3.0)
    x = np.random.default_rng(0).standard_normal((rows, 64)).astype(np.float32)
    async with serve_gateway(proxy) as gw:
        for _ in range(4):  # the model's usual requests: a few rows, milliseconds
            body, headers = _binary_request(x[:2])
            assert (await gw.post("/v2/models/chain/infer", content=body, headers=headers)).status_code == 200
        body, headers = _binary_request(x)
        started = time.perf_counter()
        r = await gw.post("/v2/models/chain/infer", content=body, headers=headers)
        took = time.perf_counter() - started
    assert r.status_code == 200, (r.status_code, r.text[:300], rows, took)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    np.testing.assert_allclose(_output(r), want, rtol=1e-4, atol=1e-5)
    assert proxy.stats.retries == 0 and proxy.stats.timeouts == 0 and proxy.stats.node_failures == 0
    assert took > 2.0, f"{rows} rows took only {took:.2f}s: the test did not exercise a long batch"


async def test_a_request_past_its_read_timeout_is_a_504_and_a_live_node_keeps_its_breaker(
    chain_fleet: tuple[list[EdgeServer], Path],
) -> None:
    """A per-model timeout (gateway.model_timeouts) far below what the batch needs: 504
    from the first node, no second attempt, and the node, which answers its liveness
    probe, is not counted as failed."""
    edges, _ = chain_fleet
    proxy = _gateway(edges, model_timeouts={"chain": 0.3})
    x = np.ones((await _rows_taking(edges[0], 2.0), 64), dtype=np.float32)
    body, headers = _binary_request(x)
    async with serve_gateway(proxy) as gw:
        r = await gw.post("/v2/models/chain/infer", content=body, headers=headers)
        assert r.status_code == 504, r.text
        assert "within 0.3s" in r.json()["error"] and "gateway.model_timeouts" in r.json()["error"]
        assert proxy.stats.attempts == 1 and proxy.stats.retries == 0
        breaker = proxy.router.breaker(r.headers[NODE_HEADER])
        assert breaker.state.value == "closed" and breaker.consecutive_failures == 0, breaker.snapshot()
        small, small_headers = _binary_request(x[:1])
        assert (await gw.post("/v2/models/chain/infer", content=small, headers=small_headers)).status_code == 200
