"""Queue limits on a real edge: a model's batch queue beyond ``max_queue_rows`` and the
requests in progress beyond ``limits.max_inflight_infer_requests`` are refused at once
with 503, a ``Retry-After`` and a JSON error, and once the burst is over the same edge
serves normal requests again (no slot or queued row leaks)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson

from central.server import CentralServer
from support.fleet import EdgeFactory, push
from support.wait import wait_for

#: Two queued rows fill the queue; a request waits 1.5 s there for others to join.
BATCHING = {"max_queue_rows": 2, "max_queue_delay_ms": 1500, "max_batch_size": 8}
REQUEST = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.25] * 32}]}
TWO_ROWS = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 32], "data": [0.25] * 64}]}


async def _held_body(release: asyncio.Event) -> AsyncIterator[bytes]:
    """A valid request body whose second half is sent only once ``release`` is set."""
    body = orjson.dumps(REQUEST)
    yield body[:20]
    await release.wait()
    yield body[20:]


def _assert_refused(response: httpx.Response, words: str) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    assert words in response.json()["error"]


async def test_a_full_queue_and_too_many_requests_get_503_with_retry_after(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge(
        "edge-0", central, inference={"batching": BATCHING}, limits={"max_inflight_infer_requests": 2}
    )
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny ready on the edge")
    model = edge.edge.repository.get("tiny")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
        # The batch queue: two rows wait, the next request finds the queue full.
        queued = asyncio.create_task(oip.post("/v2/models/tiny/infer", json=TWO_ROWS))
        await wait_for(lambda: model.active_requests == 1, 5, "one request queued")
        _assert_refused(await oip.post("/v2/models/tiny/infer", json=REQUEST), "(limit 2)")
        assert (await queued).status_code == 200

        # Requests in progress: a body still arriving holds no place; two queued hold both,
        # and a third is refused before its body is read.
        release = asyncio.Event()
        slow = asyncio.create_task(oip.post("/v2/models/tiny/infer", content=_held_body(release)))
        await asyncio.sleep(0.2)
        assert edge.edge.load.inflight == 0
        queued_two = [asyncio.create_task(oip.post("/v2/models/tiny/infer", json=REQUEST)) for _ in (1, 2)]
        await wait_for(lambda: edge.edge.load.inflight == 2, 5, "two requests queued")
        _assert_refused(await oip.post("/v2/models/tiny/infer", json=REQUEST), "limits.max_inflight_infer_requests")
        assert [(await q).status_code for q in queued_two] == [200, 200]
        release.set()
        assert (await slow).status_code == 200

        await wait_for(lambda: edge.edge.load.inflight == 0 and model.active_requests == 0, 5, "everything done")
        for _ in range(3):  # after the burst: nothing leaked
            ok = await oip.post("/v2/models/tiny/infer", json=REQUEST)
            assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [1, 10]
