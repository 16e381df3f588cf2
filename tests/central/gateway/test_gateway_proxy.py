"""The gateway in front of real edges: a central, edges started in-process, the tiny
model pushed through the REST API, and the gateway's routes served by a real uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from central.gateway import (
    AFFINITY_HEADER,
    NODE_HEADER,
    Candidate,
    GatewayProxy,
    StaticNodeSource,
    create_gateway,
)
from central.server import CentralServer
from central.settings import GatewaySettings
from edge_node.server import EdgeServer
from modelfleet.up.ports import free_port
from support.fleet import EdgeFactory, push
from support.gateway_harness import candidate, serve_gateway
from support.wait import wait_for

MODEL = "tiny"


def _json_request(rows: int = 1, width: int = 32) -> dict[str, Any]:
    data = np.linspace(-1, 1, rows * width, dtype=np.float32).tolist()
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [rows, width], "data": data}]}


def _binary_request(rows: int = 4) -> tuple[bytes, dict[str, str]]:
    x = np.arange(rows * 32, dtype=np.float32).reshape(rows, 32) / 100
    header = orjson.dumps(
        {
            "id": "bin-1",
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [rows, 32], "parameters": {"binary_data_size": x.nbytes}}
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    )
    headers = {"content-type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return header + x.tobytes(), headers


async def _fleet(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model: Path, n: int, **overrides: Any
) -> list[EdgeServer]:
    edges = list(await asyncio.gather(*(make_edge(f"edge-{i}", central, **overrides) for i in range(n))))
    assert (await push(api, MODEL, model)).status_code == 201
    await wait_for(lambda: all(e.edge.repository.ready() for e in edges), 30, "every edge serving the model")
    return edges


def _gateway(nodes: list[Candidate], **settings: Any) -> tuple[GatewayProxy, StaticNodeSource]:
    source = StaticNodeSource(nodes)
    return create_gateway(source, GatewaySettings(**settings)), source


async def test_requests_spread_over_edges_and_affinity_pins_keys(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edges = await _fleet(central, api, make_edge, small_model_file, 3)
    proxy, _ = _gateway([candidate(e) for e in edges])
    async with serve_gateway(proxy) as gw:
        served: Counter[str] = Counter()

        async def client() -> None:
            for _ in range(15):
                r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request())
                assert r.status_code == 200, r.text
                assert r.json()["model_name"] == MODEL and len(r.json()["outputs"][0]["data"]) == 10
                served[r.headers[NODE_HEADER]] += 1

        await asyncio.gather(*(client() for _ in range(6)))
        assert sum(served.values()) == 90
        assert set(served) == {"edge-0", "edge-1", "edge-2"} and min(served.values()) >= 15, served

        owners: dict[str, str] = {}
        for key in (f"session-{i}" for i in range(12)):
            seen = set()
            for _ in range(4):
                r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request(), headers={AFFINITY_HEADER: key})
                assert r.status_code == 200
                seen.add(r.headers[NODE_HEADER])
            assert len(seen) == 1, (key, seen)
            owners[key] = seen.pop()
            assert owners[key] == proxy.router.owner(MODEL, None, key)
        assert len(set(owners.values())) >= 2, owners  # keys spread, each pinned

        status = (await gw.get("/api/v1/gateway")).json()
        assert status["policy"] == "least_outstanding" and status["stats"]["retries"] == 0
        assert [(n["node_id"], n["outstanding"], n["breaker"]["state"]) for n in status["nodes"]] == [
            (f"edge-{i}", 0, "closed") for i in range(3)
        ]


async def test_a_stopped_edge_fails_no_client_request_and_opens_its_breaker(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edges = await _fleet(central, api, make_edge, small_model_file, 3)
    proxy, _ = _gateway([candidate(e) for e in edges], open_s=60.0)
    outcomes: Counter[int] = Counter()
    after_stop: Counter[str] = Counter()
    stopped = asyncio.Event()
    done = asyncio.Event()
    async with serve_gateway(proxy) as gw:

        async def client() -> None:
            while not done.is_set():
                r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request(2))
                outcomes[r.status_code] += 1
                if stopped.is_set():
                    after_stop[r.headers.get(NODE_HEADER, "")] += 1

        clients = [asyncio.create_task(client()) for _ in range(8)]
        try:
            await wait_for(lambda: outcomes[200] > 60, 10, "traffic on all edges")
            await edges[1].stop()
            stopped.set()
            await wait_for(lambda: sum(after_stop.values()) > 60, 10, "traffic after the stop")
        finally:
            done.set()
            await asyncio.gather(*clients)
    assert set(outcomes) == {200}, outcomes
    breaker = proxy.router.breaker("edge-1")
    assert breaker.state.value == "open" and breaker.times_opened == 1, breaker.snapshot()
    assert "edge-1" not in after_stop and set(after_stop) == {"edge-0", "edge-2"}, after_stop
    assert proxy.router.breaker("edge-0").state.value == "closed"
    assert proxy.stats.retries >= 1 and proxy.stats.unavailable == 0


async def test_a_503_is_retried_elsewhere_and_a_400_is_passed_through(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    """edge-0's queue admits one row and holds it 3 s, so while a direct request waits
    there it answers 503 (queue full, Retry-After)."""
    busy = await make_edge(
        "edge-busy", central, inference={"batching": {"max_queue_rows": 1, "max_queue_delay_ms": 3000}}
    )
    free = await make_edge("edge-free", central)
    assert (await push(api, MODEL, small_model_file)).status_code == 201
    await wait_for(lambda: busy.edge.repository.ready() and free.edge.repository.ready(), 30, "both edges serving")
    proxy, source = _gateway([candidate(busy), candidate(free)], failure_threshold=100)
    async with serve_gateway(proxy) as gw, httpx.AsyncClient(trust_env=False, timeout=30) as direct:
        holder = asyncio.create_task(
            direct.post(f"http://127.0.0.1:{busy.http_port}/v2/models/{MODEL}/infer", json=_json_request())
        )
        await wait_for(lambda: busy.edge.repository.get(MODEL).active_requests == 1, 5, "the busy edge's queue full")
        served: Counter[str] = Counter()
        for _ in range(6):
            r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request())
            assert r.status_code == 200, r.text
            served[r.headers[NODE_HEADER]] += 1
        assert served == {"edge-free": 6}
        assert proxy.stats.retries >= 2 and proxy.router.breaker("edge-busy").consecutive_failures >= 2
        assert "503" in (proxy.router.breaker("edge-busy").last_failure or "")

        source.set([candidate(busy)])  # only the busy node: the gateway's own 503, with its Retry-After
        r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request())
        assert r.status_code == 503 and "Retry-After" in r.headers
        error = r.json()["error"]
        assert error.startswith(f"no node can serve model '{MODEL}': node edge-busy answered 503"), error
        assert (await holder).status_code == 200

        source.set([candidate(free), candidate(busy)])
        attempts = proxy.stats.attempts
        bad = _json_request(width=31)
        r = await gw.post(f"/v2/models/{MODEL}/infer", json=bad)
        want = await direct.post(f"http://127.0.0.1:{free.http_port}/v2/models/{MODEL}/infer", json=bad)
        assert r.status_code == 400 == want.status_code
        assert r.content == want.content and "input" in r.json()["error"]
        assert proxy.stats.attempts == attempts + 1  # not retried


async def test_binary_responses_pass_through_byte_identical(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edges = await _fleet(central, api, make_edge, small_model_file, 2)
    proxy, _ = _gateway([candidate(e) for e in edges])
    body, headers = _binary_request()
    async with serve_gateway(proxy) as gw, httpx.AsyncClient(trust_env=False, timeout=30) as direct:
        for version_path in ("", "/versions/1"):
            r = await gw.post(f"/v2/models/{MODEL}{version_path}/infer", content=body, headers=headers)
            assert r.status_code == 200, r.text
            edge = next(e for e in edges if e.node_id == r.headers[NODE_HEADER])
            want = await direct.post(
                f"http://127.0.0.1:{edge.http_port}/v2/models/{MODEL}{version_path}/infer",
                content=body,
                headers=headers,
            )
            assert want.status_code == 200
            assert r.content == want.content
            for h in ("content-type", "inference-header-content-length"):
                assert r.headers[h] == want.headers[h]
            n = int(r.headers["inference-header-content-length"])
            assert orjson.loads(r.content[:n])["outputs"][0]["parameters"]["binary_data_size"] == 4 * 10 * 4

        r = await gw.post(f"/v2/models/{MODEL}/versions/9/infer", json=_json_request())
        assert r.status_code == 404 and "version '9'" in r.json()["error"]  # every node: no such version
        assert proxy.stats.attempts == 4 and proxy.stats.node_failures == 0


async def test_half_open_breaker_closes_once_the_node_answers_again(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    """edge-late is listed before it listens: its breaker opens; once a real edge starts
    on that port and serves the model, the half-open trial succeeds and it closes."""
    port = free_port()
    (first,) = await _fleet(central, api, make_edge, small_model_file, 1)
    late_candidate = Candidate("edge-late", f"127.0.0.1:{port}")
    proxy, _ = _gateway([candidate(first), late_candidate], failure_threshold=2, open_s=0.3)
    breaker = proxy.router.breaker("edge-late")
    async with serve_gateway(proxy) as gw:
        while breaker.times_opened == 0:
            r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request())
            assert r.status_code == 200 and r.headers[NODE_HEADER] == "edge-0"
        assert "cannot connect" in (breaker.last_failure or "")

        late = await make_edge("edge-late", central, http_port=port)
        await wait_for(lambda: late.edge.repository.ready(), 30, "edge-late serving")
        served: Counter[str] = Counter()
        for _ in range(200):
            r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request())
            assert r.status_code == 200
            served[r.headers[NODE_HEADER]] += 1
            if breaker.state.value == "closed" and served["edge-late"] >= 3:
                break
            await asyncio.sleep(0.02)
        assert breaker.state.value == "closed" and served["edge-late"] >= 3, (breaker.snapshot(), served)


async def test_no_node_can_serve_and_body_limit() -> None:
    proxy, source = _gateway([], max_body_bytes=1000, connect_timeout_s=0.5)
    async with serve_gateway(proxy) as gw:
        r = await gw.post("/v2/models/ghost/infer", json=_json_request(1, 4))
        assert r.status_code == 503
        assert r.json() == {"error": "no node can serve model 'ghost': no alive node reports it ready"}
        r = await gw.post("/v2/models/ghost/versions/7/infer", json=_json_request(1, 4))
        assert r.status_code == 503 and r.json()["error"].startswith("no node can serve model 'ghost' (version '7')")

        source.set([Candidate("down-0", f"127.0.0.1:{free_port()}"), Candidate("down-1", f"127.0.0.1:{free_port()}")])
        r = await gw.post("/v2/models/ghost/infer", json=_json_request(1, 4))
        assert r.status_code == 503 and "cannot connect" in r.json()["error"], r.text
        assert proxy.stats.attempts == 2
        for _ in range(3):
            await gw.post("/v2/models/ghost/infer", json=_json_request(1, 4))
        r = await gw.post("/v2/models/ghost/infer", json=_json_request(1, 4))
        assert "circuit breaker open: down-0, down-1" in r.json()["error"], r.text

        r = await gw.post("/v2/models/ghost/infer", content=b"x" * 1001)
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]
        status = (await gw.get("/api/v1/gateway")).json()
        assert status["stats"]["too_large"] == 1
        assert {n["node_id"]: n["breaker"]["state"] for n in status["nodes"]} == {"down-0": "open", "down-1": "open"}


@contextlib.asynccontextmanager
async def _silent_nodes(n: int) -> AsyncIterator[list[Candidate]]:
    """``n`` nodes that accept connections and never answer (as a frozen process does)."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)

    servers = [await asyncio.start_server(silent, "127.0.0.1", 0) for _ in range(n)]
    try:
        yield [Candidate(f"mute-{i}", f"127.0.0.1:{s.sockets[0].getsockname()[1]}") for i, s in enumerate(servers)]
    finally:
        for w in held:
            w.close()
        for s in servers:
            s.close()
            await s.wait_closed()


async def test_a_silent_node_with_no_time_left_is_a_504_and_its_probe_counts_against_it() -> None:
    """Before the model has any answer a request may wait its whole deadline; then 504,
    and no other node is tried. Whether the node is down or only busy a liveness probe
    tells, in the background: this one does not answer it either, so its breaker counts it."""
    async with _silent_nodes(2) as nodes:
        proxy, _ = _gateway(nodes, deadline_s=0.8, read_timeout_s=0.3)
        async with serve_gateway(proxy) as gw:
            loop = asyncio.get_running_loop()
            started = loop.time()
            r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request())
            elapsed = loop.time() - started
            assert r.status_code == 504 and "did not answer" in r.json()["error"], r.text
            assert elapsed > 0.7, elapsed  # it waited out its deadline (no upper bound: CI machines are slow)
            assert proxy.stats.attempts == 1 and proxy.stats.retries == 0 and proxy.stats.timeouts == 1
            breaker = proxy.router.breaker(r.headers[NODE_HEADER])
            await wait_for(lambda: breaker.consecutive_failures == 1, 5, "the probe's verdict")
            assert "/v2/health/live" in (breaker.last_failure or "")


async def test_a_frozen_node_is_skipped_once_its_liveness_probe_fails_too(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    """The request times out on a node that is down (it does not answer its liveness
    probe either): it cannot be running the request, so the next node gets it."""
    (edge,) = await _fleet(central, api, make_edge, small_model_file, 1)
    async with _silent_nodes(1) as (mute,):
        # 2 s: the live edge answers well within it even on a loaded CI machine; the mute node never does.
        proxy, _ = _gateway([mute, candidate(edge)], read_timeout_s=0.3, model_timeouts={MODEL: 2.0})
        key = next(k for k in (f"k{i}" for i in range(1000)) if proxy.router.owner(MODEL, None, k) == mute.node_id)
        async with serve_gateway(proxy) as gw:
            r = await gw.post(f"/v2/models/{MODEL}/infer", json=_json_request(), headers={AFFINITY_HEADER: key})
        assert r.status_code == 200 and r.headers[NODE_HEADER] == edge.node_id, r.text
        assert proxy.stats.retries == 1 and proxy.stats.timeouts == 0
        assert "/v2/health/live failed" in (proxy.router.breaker(mute.node_id).last_failure or "")
