"""Edges that lose central together do not reconnect in lockstep: each waits its own
jittered time, growing per failure and never above ``reconnect_backoff_max_s``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edge_node.server import EdgeServer
from support.brokers import free_port
from support.fleet import edge_settings
from support.wait import wait_for

CAP_S = 0.4
RETRIES = 3


async def reconnect_waits(edge: EdgeServer, caplog: pytest.LogCaptureFixture) -> list[float]:
    """The first waits ``edge`` logs before reconnecting ("central link lost (...); retrying in %.1fs")."""

    def waits() -> list[float]:
        lost = (r for r in caplog.records if r.name == "edge_node.sync.follower" and "link lost" in r.msg)
        return [float(r.args[1]) for r in lost]  # type: ignore[index,arg-type]

    caplog.clear()
    await edge.start()
    try:
        await wait_for(lambda: len(waits()) >= RETRIES, 30, f"{RETRIES} reconnects")
    finally:
        await edge.stop(unregister=False)
    return waits()[:RETRIES]


async def test_edges_whose_central_is_down_reconnect_after_waits_of_their_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="edge_node.sync.follower")
    central = f"127.0.0.1:{free_port()}"  # nothing listens there
    first, second = [
        await reconnect_waits(
            EdgeServer(edge_settings(name, central, tmp_path / name, reconnect_backoff_max_s=CAP_S)), caplog
        )
        for name in ("edge-a", "edge-b")
    ]
    assert first != second  # without jitter both are 0.2, 0.4, 0.4
    for wait in first + second:
        assert 0 < wait <= CAP_S
