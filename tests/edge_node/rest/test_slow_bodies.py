"""Slow bodies on a real edge (issue 24, hole 2): clients announcing a body and sending
it a few bytes at a time hold no ``limits.max_inflight_infer_requests`` place, so a normal
request is served meanwhile; each slow one gets 408 and its connection closed once
``limits.body_timeout_s`` has passed. The hostile clients are raw sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson

from central.server import CentralServer
from support.fleet import EdgeFactory, push
from support.wait import wait_for

REQUEST = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.5] * 32}]})
BODY_TIMEOUT_S = 1.0


async def _slow_body(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request announcing 100,000 bytes of body and sending 4 of them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "POST /v2/models/tiny/infer HTTP/1.1\r\nhost: edge\r\ncontent-length: 100000\r\n\r\n"
    writer.write(head.encode() + b'{"in')
    await writer.drain()
    return reader, writer


async def test_slow_bodies_hold_no_inflight_place_and_get_408_and_closed(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    limits = {"max_inflight_infer_requests": 8, "body_timeout_s": BODY_TIMEOUT_S}
    edge = await make_edge("edge-0", central, limits=limits)
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny ready on the edge")
    slow = [await _slow_body(edge.http_port) for _ in range(20)]
    try:
        await asyncio.sleep(0.2)  # every slow request is in, its body awaited
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
            ok = await oip.post("/v2/models/tiny/infer", content=REQUEST)
            assert ok.status_code == 200, ok.text  # before: 503, every place held by a slow body
        answers = await asyncio.gather(*(asyncio.wait_for(r.read(), 10 * BODY_TIMEOUT_S) for r, _ in slow))
    finally:
        for _, writer in slow:
            writer.close()
    for answer in answers:  # each got its 408 and then the end of the connection
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"connection: close" in answer.lower()
        assert b"request body not received in time" in answer
