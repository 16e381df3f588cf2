"""Request limits on a real edge: an oversized inference body (declared or chunked) and
a tensor with too many elements are refused with 413 and a JSON error, and the edge
goes on serving the next normal request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson

from central.server import CentralServer
from support.fleet import EdgeFactory, push
from support.wait import wait_for

LIMITS = {"max_infer_body_bytes": 4096, "max_tensor_elements": 1000}


def _request(shape: list[int], data: list[float]) -> dict[str, object]:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": shape, "data": data}]}


async def _pieces(count: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b" " * size


async def test_oversized_bodies_and_tensors_get_413_and_the_edge_keeps_serving(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge("edge-0", central, limits=LIMITS)
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny ready on the edge")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
        declared = await oip.post("/v2/models/tiny/infer", content=orjson.dumps(_request([1, 32], [0.5] * 2000)))
        assert declared.status_code == 413
        assert "4096 bytes" in declared.json()["error"]

        chunked = await oip.post("/v2/models/tiny/infer", content=_pieces(8, 1024))  # no Content-Length
        assert chunked.status_code == 413 and "4096 bytes" in chunked.json()["error"]

        for shape in ([40, 32], [10**12, 32], [0, 10**12]):  # over the limit: nothing is allocated for it
            big = await oip.post("/v2/models/tiny/infer", json=_request(shape, [0.0]))
            assert big.status_code == 413
            assert "'input'" in big.json()["error"] and "1000 elements" in big.json()["error"]

        ok = await oip.post("/v2/models/tiny/infer", json=_request([2, 32], [0.0] * 64))
        assert ok.status_code == 200 and ok.json()["outputs"][0]["shape"] == [2, 10]
