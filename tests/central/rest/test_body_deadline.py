"""Central's body deadline on its REST API (``body_timeout_s``): a rollout's JSON body that
trickles in past it is a 408 that closes the connection, while a model push, which may take
minutes, only needs a piece within it each time. Real central, raw sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from central.server import CentralServer
from support.fleet import central_settings

BODY_TIMEOUT_S = 1.0


@pytest.fixture
async def central_1s(tmp_path: Path) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", body_timeout_s=BODY_TIMEOUT_S))
    await server.start()
    yield server
    await server.stop()


async def _trickle(central: CentralServer, path: str, body: bytes, pieces: int) -> bytes:
    """``body`` sent in ``pieces`` 0.4 body timeouts apart (none once central has answered);
    whatever central answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", central.http_port)
    answer = asyncio.create_task(reader.read())
    try:
        head = f"POST {path} HTTP/1.1\r\nhost: central\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode())
        step = -(-len(body) // pieces)
        for start in range(0, len(body), step):
            await asyncio.sleep(0.4 * BODY_TIMEOUT_S)
            if answer.done():
                break
            writer.write(body[start : start + step])
            await writer.drain()
        return await asyncio.wait_for(answer, 30)
    finally:
        writer.close()


async def test_a_json_body_past_the_deadline_is_408_but_a_slow_push_goes_through(
    central_1s: CentralServer, small_model_file: Path
) -> None:
    rollout = b'{"version": "1", "strategy": "canary", "canary_nodes": ["edge-0"]}'
    answer = await _trickle(central_1s, "/api/v1/models/tiny/rollouts", rollout, pieces=6)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"request body not received in time" in answer

    pushed = await _trickle(central_1s, "/api/v1/models/tiny/versions", small_model_file.read_bytes(), pieces=6)
    assert pushed.startswith(b"HTTP/1.1 201 "), pushed[:300]  # 2.4 s in all, never 1 s without a piece
