"""Central's body caps: a REST JSON body over ``max_json_body_bytes`` is a 413 with a
JSON error (declared or chunked) while model uploads keep their own, larger limit; and
an MQTT message over ``mqtt.max_payload_bytes`` is counted and dropped unread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson

from central.membership.tracker import MembershipTracker
from central.mqtt.consumer import MembershipConsumer
from central.server import CentralServer
from central.settings import MqttSettings
from fleetwire.mqtt.payloads import Heartbeat
from fleetwire.mqtt.topics import Topics
from support.fleet import central_settings, push


async def _pieces(count: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b" " * size


async def test_json_bodies_over_the_cap_get_413_while_uploads_pass(tmp_path: Path, small_model_file: Path) -> None:
    server = CentralServer(central_settings(tmp_path / "central", max_json_body_bytes=2048))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as api:
            assert (await push(api, "tiny", small_model_file)).status_code == 201  # far over 2 KiB: exempt
            body = orjson.dumps({"version": "1", "note": "x" * 4096})
            declared = await api.post("/api/v1/models/tiny/rollouts", content=body)
            assert declared.status_code == 413 and "2048 bytes" in declared.json()["error"]
            chunked = await api.post("/api/v1/models/tiny/rollouts", content=_pieces(4, 1024))
            assert chunked.status_code == 413 and "2048 bytes" in chunked.json()["error"]
            small = await api.post("/api/v1/models/tiny/rollouts", json={"version": "1", "stages": "bad"})
            assert small.status_code == 422  # read and validated as usual
    finally:
        await server.stop()


async def test_mqtt_messages_over_the_configured_size_are_dropped() -> None:
    tracker = MembershipTracker(suspect_after=2, dead_after=3, default_interval_s=60)
    consumer = MembershipConsumer(MqttSettings(max_payload_bytes=2048), tracker, asyncio.get_running_loop())
    topic = Topics().node_heartbeat("a")
    beat = Heartbeat(node_id="a", bdseq=1, seq=0, ts=int(time.time() * 1000), interval_s=60)
    padded = beat.model_dump_json().encode() + b" " * 4096  # valid JSON, over 2 KiB
    consumer.handle_message(topic, padded)
    await asyncio.sleep(0)
    assert tracker.counters.oversized_dropped == 1 and tracker.get("a") is None
    consumer.handle_message(topic, beat.model_dump_json().encode())
    for _ in range(3):
        await asyncio.sleep(0)
    assert tracker.counters.heartbeats_processed == 1 and tracker.get("a") is not None
    tracker.close()
