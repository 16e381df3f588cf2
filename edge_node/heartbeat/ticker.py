"""The heartbeat ticker: a QoS 0 ``Heartbeat`` on ``…/nodes/{id}/heartbeat`` every
``interval_s``, on the event loop.

QoS 0 heartbeats are never queued: they are published only while a connection is live
(paho returns ``MQTT_ERR_NO_CONN`` without a socket; that also counts as dropped), and paho
discards QoS 0 packets still unsent when it reconnects. ``seq`` restarts at 0 with every
connection (Sparkplug style); the first heartbeat of a connection goes out right after its
birth (``wake_up``), and the cadence restarts from it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_node.heartbeat.body import HeartbeatBody
from edge_node.heartbeat.presence import Presence
from fleetwire.mqtt.payloads import MAX_PAYLOAD_BYTES, Heartbeat

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = ["HeartbeatTicker", "heartbeat_payload"]

log = logging.getLogger(__name__)


def heartbeat_payload(node_id: str, interval_s: float, body: HeartbeatBody, bdseq: int, seq: int) -> bytes | None:
    """The JSON ``Heartbeat`` of ``body``; None (logged) when it is over ``MAX_PAYLOAD_BYTES``."""
    heartbeat = Heartbeat(
        node_id=node_id,
        bdseq=bdseq,
        seq=seq,
        ts=int(time.time() * 1000),
        interval_s=interval_s,
        state=body.state,
        load=body.load,
        models=list(body.models),
        cache=body.cache,
        grpc_address=body.grpc_address,
        http_address=body.http_address,
        hardware_class=body.hardware_class,
        site=body.site,
        mode="synced" if body.autonomous_since is None else "autonomous",
        autonomous_since=None if body.autonomous_since is None else int(body.autonomous_since * 1000),
        clock_offset_ms=body.clock_offset_ms,
        clock_error_ms=body.clock_error_ms,
    )
    payload = heartbeat.model_dump_json().encode()
    if len(payload) > MAX_PAYLOAD_BYTES:
        log.warning("heartbeat of %s is %d bytes (> %d): dropped", node_id, len(payload), MAX_PAYLOAD_BYTES)
        return None
    return payload


class HeartbeatTicker:
    """Publishes ``snapshot()`` every ``interval_s`` on the live connection of ``presence``
    through ``client()`` (None: not started); counts what went out and what did not."""

    def __init__(
        self,
        node_id: str,
        interval_s: float,
        snapshot: Callable[[], HeartbeatBody],
        presence: Presence,
        client: Callable[[], mqtt.Client | None],
    ) -> None:
        self.node_id = node_id
        self.interval_s = interval_s
        self._snapshot = snapshot
        self._presence = presence
        self._client = client
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0
        self.snapshot_errors = 0

    def start(self) -> None:
        """Tick on the running loop (the first tick after ``interval_s`` or a ``wake_up``)."""
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"heartbeat-{self.node_id}")

    async def stop(self) -> None:
        """Stop ticking (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def wake_up(self) -> None:
        """Beat now and restart the cadence (a new connection's birth went out); loop only."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        interval = self.interval_s
        next_at = loop.time() + interval
        while True:
            woke = False
            timeout = next_at - loop.time()
            if timeout > 0:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that
                # lands as the event fires (a reconnect wakes this loop just as stop()
                # cancels it), and stop() then waits for this task forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
                    woke = True
            self._wake.clear()
            self.beat()
            now = loop.time()
            # a new connection beats at once and restarts the cadence; a late loop skips, never bursts
            next_at = now + interval if woke or next_at + interval <= now else next_at + interval

    def beat(self) -> bool:
        """Publish one heartbeat now if connected; True when it went out."""
        client = self._client()
        if client is None or not self._presence.connected:
            self.dropped += 1
            return False
        try:
            body = self._snapshot()
        except Exception:
            self.snapshot_errors += 1
            self.dropped += 1
            log.exception("heartbeat snapshot of %s failed", self.node_id)
            return False
        if self._presence.publish_beat(lambda topic, bdseq, seq: self._publish(client, topic, body, bdseq, seq)):
            self.sent += 1
            return True
        self.dropped += 1
        return False

    def _publish(self, client: mqtt.Client, topic: str, body: HeartbeatBody, bdseq: int, seq: int) -> bool:
        from paho.mqtt.enums import MQTTErrorCode  # loaded by the session, which made the client

        payload = heartbeat_payload(self.node_id, self.interval_s, body, bdseq, seq)
        if payload is None:
            return False
        info = client.publish(topic, payload, qos=0, retain=False)
        return info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS
