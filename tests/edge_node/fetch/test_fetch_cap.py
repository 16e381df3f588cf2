"""The fetch cap on a real fetch path: a ChunkFetcher pulling a model's chunks from a
real central's origin, many at once, paced by ``TransferGovernor`` as bytes arrive."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from central.server import CentralServer
from edge_node.cache import ChunkStore
from edge_node.fetch import ChunkFetcher, PlacementView
from edge_node.fetch.sources import ChannelPool, OriginClient, PeerClient
from edge_node.settings import FetchSettings
from edge_node.transfer import TransferGovernor
from edge_node.transfer.rate_limiter import BURST_S
from fleetwire.transfer import TransferCaps
from support.fleet import push

CAP = 1_000_000


async def test_chunks_from_the_origin_arrive_at_the_fetch_cap(
    central: CentralServer, api: httpx.AsyncClient, model_file: Path, tmp_path: Path
) -> None:
    chunks = (await push(api, "mlp", model_file)).json()["manifest"]["chunks"]
    total = sum(c["size"] for c in chunks)
    governor = TransferGovernor(TransferCaps(fetch_bytes_per_s=CAP))
    store = ChunkStore(tmp_path / "cache", size_limit=1 << 30, holder="edge-a")
    pool = ChannelPool()
    origin = OriginClient(pool, central.grpc_address, "edge-a", pacer=governor)
    fetcher = ChunkFetcher(
        "edge-a", store, PlacementView(), PeerClient(pool, "edge-a", governor), origin, FetchSettings()
    )
    try:
        start = time.monotonic()
        await asyncio.gather(*(fetcher.ensure(c["digest"], c["size"]) for c in chunks))
        elapsed = time.monotonic() - start
    finally:
        await fetcher.close()
        await pool.close()
        store.close()
    assert fetcher.stats.bytes_from_origin == total == governor.fetched.total
    rate = (total - CAP * BURST_S) / elapsed  # the first burst goes at once
    print(f"fetch: {total} B in {elapsed:.3f} s: {rate:.0f} B/s for a cap of {CAP}")
    # The cap must hold (never 10 % over it); below it, a loaded machine may simply not keep up,
    # so only a gross over-throttling (under half the cap) fails here: bench.distribution times it.
    assert 0.5 * CAP <= rate <= 1.10 * CAP, f"{rate:.0f} B/s for a cap of {CAP}"
