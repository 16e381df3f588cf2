"""The serve cap on a real edge's Peer service, and the busy cap that takes its place
while inference requests are in flight there (fed by the edge's own LoadTracker, the one
its OIP routes feed)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from edge_node.transfer.rate_limiter import BURST_S
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from support.fleet import EdgeFactory, push, version_state
from support.wait import wait_for

SERVE, BUSY = 2_000_000, 800_000
#: More than the serve cap's burst.
WARM_UP_BYTES = 2 * SERVE * BURST_S


async def pull(edge: EdgeServer, chunks: list[dict[str, Any]], streams: int = 4) -> float:
    """Fetch ``chunks`` from the edge's Peer service: first, one at a time, enough to use
    up the bucket's burst (the bucket is then empty), then the rest, ``streams`` at once;
    the bytes/s of the rest."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        slots = asyncio.Semaphore(streams)

        async def one(chunk: dict[str, Any]) -> None:
            async with slots:
                request = peer_pb2.PeerFetchRequest(digest=chunk["digest"], requester="test")
                assert sum([len(p.data) async for p in stub.FetchChunk(request)]) == chunk["size"]

        warm_up = 0
        while warm_up <= WARM_UP_BYTES:
            await one(chunks[0])
            warm_up += chunks[0]["size"]
            chunks = chunks[1:]
        start = time.monotonic()
        await asyncio.gather(*(one(c) for c in chunks))
        elapsed = time.monotonic() - start
    return sum(c["size"] for c in chunks) / elapsed


async def rolled_out(central: CentralServer, api: httpx.AsyncClient, edge: EdgeServer, model: Path) -> list[Any]:
    chunks: list[Any] = (await push(api, "mlp", model)).json()["manifest"]["chunks"]
    await wait_for(lambda: version_state(edge, "mlp", "1") == "complete", what="rollout")
    return chunks


async def test_chunks_are_served_at_the_serve_cap(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path
) -> None:
    edge = await make_edge("edge-0", central, transfer={"serve_bytes_per_s": SERVE})
    chunks = await rolled_out(central, api, edge, model_file)
    rate = await pull(edge, chunks)
    print(f"serve: {rate:.0f} B/s for a cap of {SERVE}")
    assert rate == pytest.approx(SERVE, rel=0.10)
    assert edge.edge.transfer.served.total == sum(c["size"] for c in chunks)


async def test_serving_drops_to_the_busy_cap_while_inference_is_in_flight(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path
) -> None:
    edge = await make_edge("edge-0", central, transfer={"serve_bytes_per_s": SERVE, "busy_serve_bytes_per_s": BUSY})
    chunks = await rolled_out(central, api, edge, model_file)
    load = edge.edge.load
    started = load.begin()  # an inference request in flight
    try:
        busy_rate = await pull(edge, chunks)
        assert edge.edge.transfer.serving_busy
    finally:
        load.end(started)
    idle_rate = await pull(edge, chunks)
    print(f"busy: {busy_rate:.0f} B/s for a cap of {BUSY}; then {idle_rate:.0f} B/s for {SERVE}")
    assert busy_rate == pytest.approx(BUSY, rel=0.10)
    assert idle_rate == pytest.approx(SERVE, rel=0.10)
    assert not edge.edge.transfer.serving_busy
