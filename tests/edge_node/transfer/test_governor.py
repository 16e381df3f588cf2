"""The caps in force on one edge: live changes from central's merged caps, and the busy
serve cap while inference requests are in flight (on the virtual-time loop)."""

from __future__ import annotations

import asyncio

import pytest

from edge_node.transfer import TransferGovernor
from fleetwire.transfer import TransferCaps

pytestmark = pytest.mark.virtual_time

SERVE, BUSY = 4_000_000, 1_000_000
PIECE = 100_000


async def serve_for(governor: TransferGovernor, seconds: float) -> int:
    """Bytes served in ``seconds`` of loop time, piece by piece."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    sent = 0
    while loop.time() < end:
        await governor.pace_serve(PIECE)
        sent += PIECE
    return sent


async def test_serving_uses_the_busy_cap_while_inference_is_in_flight() -> None:
    inflight = 0
    governor = TransferGovernor(TransferCaps(SERVE, 0, BUSY), busy=lambda: inflight > 0)
    await serve_for(governor, 0.5)  # past the burst
    assert await serve_for(governor, 2.0) / 2.0 == pytest.approx(SERVE, rel=0.10)
    inflight = 1
    assert await serve_for(governor, 2.0) / 2.0 == pytest.approx(BUSY, rel=0.10)
    assert governor.serving_busy and governor.serve_cap_now() == BUSY
    inflight = 0
    assert await serve_for(governor, 2.0) / 2.0 == pytest.approx(SERVE, rel=0.10)
    assert governor.busy_switches == 2


async def test_a_piece_waiting_at_the_busy_cap_speeds_up_when_inference_ends() -> None:
    inflight = 1
    governor = TransferGovernor(TransferCaps(0, 0, BUSY), busy=lambda: inflight > 0)
    loop = asyncio.get_running_loop()
    await governor.pace_serve(BUSY)  # the bucket is in debt: the next piece waits ~1 s
    start = loop.time()
    waiting = asyncio.create_task(governor.pace_serve(BUSY))
    await asyncio.sleep(0.2)
    inflight = 0  # serving goes back to no cap within a recheck
    await waiting
    assert loop.time() - start == pytest.approx(0.2, abs=0.06)


async def test_without_a_busy_cap_the_serve_cap_stays() -> None:
    governor = TransferGovernor(TransferCaps(SERVE, 0, 0), busy=lambda: True)
    await serve_for(governor, 0.5)
    assert await serve_for(governor, 2.0) / 2.0 == pytest.approx(SERVE, rel=0.10)


async def test_central_caps_override_the_settings_and_unset_ones_fall_back() -> None:
    settings = TransferCaps(SERVE, 2_000_000, BUSY)
    governor = TransferGovernor(settings)
    governor.apply(TransferCaps(fetch_bytes_per_s=500_000).merged_over(settings))
    assert governor.caps == TransferCaps(SERVE, 500_000, BUSY)
    loop = asyncio.get_running_loop()
    await governor.pace_fetch(200_000)  # past the burst
    start = loop.time()
    for _ in range(10):
        await governor.pace_fetch(100_000)
    assert loop.time() - start == pytest.approx(2.0, rel=0.10)
    governor.apply(TransferCaps(fetch_bytes_per_s=0).merged_over(settings))  # 0: no cap
    start = loop.time()
    await governor.pace_fetch(10**9)
    assert loop.time() == start
    assert governor.as_dict()["caps"] == {
        "serve_bytes_per_s": SERVE,
        "fetch_bytes_per_s": 0,
        "busy_serve_bytes_per_s": BUSY,
    }
