"""The edge's MQTT presence: retained birth/death on ``…/nodes/{id}/status`` (with a
Last Will) and a QoS 0 heartbeat on ``…/nodes/{id}/heartbeat`` every ``interval_s``.

How ``bdseq`` and the Last Will line up across reconnects
---------------------------------------------------------
MQTT sends the will *inside* CONNECT, so the will of a connection must be chosen before
that connection exists; paho keeps whatever ``will_set`` last stored and puts it in
every CONNECT it sends, including its own automatic reconnects. So:

1. ``start()`` reserves the next ``bdseq`` N (persisted first, see ``bdseq.py``), calls
   ``will_set(status, offline/N, qos 1, retain)`` and only then ``connect_async``.
2. ``on_connect`` (success): the CONNECT that was just accepted carried the will with N,
   so the birth ``online/N`` (qos 1, retain) goes out, and N is marked *used*.
3. ``on_disconnect`` (paho's thread, always before it tries to reconnect, and the only
   place the will is changed): when N was used, reserve N+1 and ``will_set`` it, so the
   next CONNECT carries N+1 and its birth will too. A CONNECT that never got a
   successful CONNACK (broker down, refused) does not use a number: paho resends the
   same will, and the birth that finally follows carries that same number.

``will_set`` only writes fields that paho reads when it builds a CONNECT, and both the
callbacks and ``reconnect()`` run on paho's network thread, so the will can't change
under a CONNECT being built. Consequence for consumers: a death whose ``bdseq`` is lower
than the latest birth's belongs to an old connection and is stale.

Other details
-------------
* QoS 0 heartbeats are never queued: they are published only while connected (paho
  returns ``MQTT_ERR_NO_CONN`` without a socket; that also counts as dropped), and paho
  discards QoS 0 packets still unsent when it reconnects. ``max_queued_messages_set``
  bounds what QoS 1 status messages paho may hold.
* A birth or death that was still unacknowledged when a connection broke is removed
  from paho's outgoing queue at the next connect (paho would otherwise resend it after
  the new birth, making a stale ``bdseq`` the retained status).
* ``stop()`` publishes ``offline`` with the current ``bdseq`` (qos 1, retain) and waits
  for its PUBACK (bounded); only then does it DISCONNECT, which discards the will. If the
  PUBACK doesn't come in time, it drops the TCP connection without DISCONNECT so that the
  broker publishes the will instead, which carries the same ``bdseq``.
* ``seq`` restarts at 0 with every connection (Sparkplug style); the first heartbeat of a
  connection goes out right after its birth.
* Threads: paho callbacks run on paho's thread; they own the will/bdseq state. The
  heartbeat task runs on the event loop and takes ``_state_lock`` to read the live
  connection's ``bdseq`` and publish, so no heartbeat of a new connection precedes its
  birth or carries the previous connection's ``bdseq``. The loop is woken with
  ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from pydantic import BaseModel, Field, SecretStr, model_validator

from edge_node.heartbeat.bdseq import BdseqStore
from edge_node.heartbeat.body import HeartbeatBody
from fleetwire.mqtt.payloads import MAX_PAYLOAD_BYTES, Heartbeat, NodeStatus
from fleetwire.mqtt.tls import MqttTlsSettings
from fleetwire.mqtt.topics import DEFAULT_PREFIX, Topics

log = logging.getLogger(__name__)


class HeartbeatSettings(BaseModel):
    """How the edge announces itself over MQTT (``MODELFLEET_HEARTBEAT__*`` when nested)."""

    broker_host: str = Field("127.0.0.1", description="MQTT broker host.")
    """MQTT broker host."""
    broker_port: int = Field(1883, ge=1, le=65535, description="MQTT broker port.")
    """MQTT broker port."""
    topic_prefix: str = Field(DEFAULT_PREFIX, min_length=1, description="Prefix of every fleet topic.")
    """Prefix of every fleet topic."""
    interval_s: float = Field(5.0, gt=0, le=3600, description="Seconds between heartbeats.")
    """Seconds between heartbeats."""
    keepalive_s: int | None = Field(
        None, ge=1, le=65535, description="MQTT keep-alive in whole seconds; default max(2, ceil(2 × interval_s))."
    )
    """MQTT keep-alive in whole seconds; default ``max(2, ceil(2 × interval_s))``. The
    broker publishes the will after 1.5 × this when the node goes silent."""
    enabled: bool = Field(True, description="Publish birth, death and heartbeats at all.")
    """Publish birth, death and heartbeats at all."""
    client_id: str | None = Field(
        None,
        description="MQTT client id of an anonymous connection; default edge-{node_id}. With a login: the user name.",
    )
    """MQTT client id of an anonymous connection; default ``edge-{node_id}``. With a
    ``username`` the client id is the user name, whatever this says: the shipped brokers
    (``use_username_as_clientid true``) bind client ids to logins, so that nobody can
    close another node's session (and have the broker publish its Last Will) by
    connecting under its client id."""
    reconnect_min_s: float = Field(0.5, gt=0, description="First wait before reconnecting; doubles per failure.")
    """First wait before reconnecting; doubles per failure."""
    reconnect_max_s: float = Field(10.0, gt=0, description="Longest wait between reconnect attempts.")
    """Longest wait between reconnect attempts."""
    username: str | None = Field(
        None, description="Broker user name (None: anonymous); with the shipped ACL it must be the node id."
    )
    """Broker user name (None: anonymous). With the shipped Mosquitto ACL it must be the
    node id: a node may publish only under ``…/nodes/{its user name}/``."""
    password: SecretStr | None = Field(None, description="Broker password.")
    """Broker password."""
    tls: MqttTlsSettings = Field(default_factory=MqttTlsSettings, description="MQTT over TLS (off by default).")
    """MQTT over TLS (off by default)."""
    max_queued_messages: int = Field(
        8, ge=1, le=1000, description="QoS 1 messages paho may hold unacknowledged; beyond that they are refused."
    )
    """QoS 1 messages paho may hold unacknowledged; beyond that they are refused (QoS 0
    heartbeats are never queued)."""
    stop_timeout_s: float = Field(2.0, gt=0, description="How long stop() waits for the broker to take the offline.")
    """How long ``stop()`` waits for the broker to acknowledge the offline status."""

    @model_validator(mode="after")
    def _check_backoff(self) -> HeartbeatSettings:
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s must be at least reconnect_min_s")
        return self

    @property
    def effective_keepalive_s(self) -> int:
        """The keep-alive sent in CONNECT."""
        if self.keepalive_s is not None:
            return self.keepalive_s
        return max(2, math.ceil(2 * self.interval_s))

    def effective_client_id(self, node_id: str) -> str:
        """The MQTT client id for ``node_id``: the user name when there is one (what a
        broker with ``use_username_as_clientid`` makes of it anyway), else ``client_id``,
        else ``edge-{node_id}``."""
        return self.username or self.client_id or f"edge-{node_id}"


def _now_ms() -> int:
    return int(time.time() * 1000)


def _status(state: Literal["online", "offline"], bdseq: int) -> bytes:
    return NodeStatus(state=state, bdseq=bdseq, ts=_now_ms()).model_dump_json().encode()


class HeartbeatPublisher:
    """Birth, death (Last Will) and heartbeats of one node; see the module docstring."""

    def __init__(
        self,
        node_id: str,
        settings: HeartbeatSettings,
        snapshot: Callable[[], HeartbeatBody],
        data_dir: Path,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.status_topic = self.topics.node_status(node_id)
        self.heartbeat_topic = self.topics.node_heartbeat(node_id)
        self._snapshot = snapshot
        self._store = BdseqStore.in_dir(data_dir)
        self._client: mqtt.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        # paho thread only (and start() before the thread exists)
        self._will_bdseq = 0  # in the will paho sends with its next CONNECT
        self._will_used = False  # a successful CONNACK accepted the CONNECT carrying it
        # shared, under _state_lock
        self._state_lock = threading.Lock()
        self._live_bdseq: int | None = None  # the current connection's, once its birth is queued
        self._bdseq = 0  # of the current or latest connection
        self._seq = 0
        #: Counters.
        self.connects = 0
        self.disconnects = 0
        self.connect_failures = 0
        self.heartbeats_sent = 0
        self.heartbeats_dropped = 0
        self.snapshot_errors = 0

    # -- state -------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """A connection is up and its birth was published."""
        with self._state_lock:
            return self._live_bdseq is not None

    @property
    def bdseq(self) -> int:
        """The ``bdseq`` of the current (or latest) connection; 0 before the first."""
        with self._state_lock:
            return self._bdseq

    @property
    def seq(self) -> int:
        """The ``seq`` the next heartbeat of this connection carries."""
        with self._state_lock:
            return self._seq

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._client is not None and not self._stopping

    async def wait_connected(self, timeout: float) -> bool:
        """Wait until ``connected`` (polling); False on timeout."""
        deadline = time.monotonic() + timeout
        while not self.connected:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background (the broker may be away) and start heartbeating."""
        if not self.settings.enabled:
            log.info("heartbeat disabled for %s", self.node_id)
            return
        if self._client is not None:
            return
        s = self.settings
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopping = False
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=s.effective_client_id(self.node_id),
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        if s.username is not None:
            client.username_pw_set(s.username, s.password.get_secret_value() if s.password else None)
        if s.tls.enabled:
            client.tls_set_context(s.tls.ssl_context())
        # paho sleeps these with time.sleep, so fractions of a second are fine
        client.reconnect_delay_set(s.reconnect_min_s, s.reconnect_max_s)  # type: ignore[arg-type]
        client.max_queued_messages_set(s.max_queued_messages)
        client.connect_timeout = min(5.0, max(1.0, float(s.effective_keepalive_s)))
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        self._will_bdseq = await asyncio.to_thread(self._store.reserve)
        self._will_used = False
        client.will_set(self.status_topic, _status("offline", self._will_bdseq), qos=1, retain=True)
        client.connect_async(s.broker_host, s.broker_port, keepalive=s.effective_keepalive_s)
        log.info(
            "heartbeat for %s: %s://%s:%d %s every %.3gs (next bdseq %d)",
            self.node_id,
            "mqtts" if s.tls.enabled else "mqtt",
            s.broker_host,
            s.broker_port,
            self.heartbeat_topic,
            s.interval_s,
            self._will_bdseq,
        )
        self._client = client
        client.loop_start()
        self._task = asyncio.create_task(self._run(), name=f"heartbeat-{self.node_id}")

    async def stop(self) -> None:
        """Publish ``offline`` (bounded wait), disconnect and stop paho's thread (idempotent)."""
        client = self._client
        if client is None or self._stopping:
            return
        with self._state_lock:  # from here on no birth goes out (see _on_connect)
            self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with self._state_lock:
            bdseq, self._live_bdseq = self._live_bdseq, None
        clean = True
        if bdseq is not None:
            clean = await self._publish_offline(client, bdseq)
        if not clean:
            # no PUBACK in time: leave without DISCONNECT so the broker publishes the will
            # (the same offline/bdseq) rather than keeping "online" retained
            sock = client.socket()
            if isinstance(sock, socket.socket):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        client.disconnect()
        try:
            await asyncio.wait_for(asyncio.to_thread(client.loop_stop), timeout=self.settings.stop_timeout_s + 5.0)
        except TimeoutError:
            log.warning("paho thread of %s did not stop in time", self.node_id)
        for name in ("_sockpairR", "_sockpairW"):  # paho closes its wake-up pair only on GC
            pair = getattr(client, name, None)
            if pair is not None:
                with contextlib.suppress(OSError):
                    pair.close()
                setattr(client, name, None)
        self._client = None
        log.info("heartbeat for %s stopped (bdseq %d)", self.node_id, self._bdseq)

    async def _publish_offline(self, client: mqtt.Client, bdseq: int) -> bool:
        try:
            info = client.publish(self.status_topic, _status("offline", bdseq), qos=1, retain=True)
            await asyncio.to_thread(info.wait_for_publish, self.settings.stop_timeout_s)
        except (ValueError, RuntimeError) as exc:
            log.warning("offline status of %s not published: %s", self.node_id, exc)
            return False
        if not info.is_published():
            log.warning("offline status of %s unacknowledged after %.1fs", self.node_id, self.settings.stop_timeout_s)
            return False
        return True

    # -- paho callbacks (paho's thread) ------------------------------------------------

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        try:
            if getattr(reason_code, "is_failure", False):
                self.connect_failures += 1
                log.warning("broker refused %s: %s", self.node_id, reason_code)
                return
            bdseq = self._will_bdseq
            if self._will_used:  # paho reconnected without telling us it lost the connection
                log.warning("bdseq %d of %s used by two connections", bdseq, self.node_id)
            self._will_used = True
            self._drop_stale_status(client)
            with self._state_lock:
                if self._stopping:  # checked under the lock: stop() then sees no live connection
                    return
                client.publish(self.status_topic, _status("online", bdseq), qos=1, retain=True)
                self._live_bdseq = bdseq
                self._bdseq = bdseq
                self._seq = 0
                self.connects += 1
            log.info("%s connected to mqtt://%s:%d, bdseq %d", self.node_id, *self._broker(), bdseq)
            self._call_in_loop(self._wake_up)
        except Exception:
            log.exception("heartbeat on_connect failed")

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        try:
            with self._state_lock:
                was_live, self._live_bdseq = self._live_bdseq, None
            if was_live is not None:
                self.disconnects += 1
                log.warning("%s lost mqtt connection (bdseq %d): %s", self.node_id, was_live, reason_code)
            if self._stopping or not self._will_used:
                return
            # the next CONNECT must carry a new number: set its will before paho reconnects
            self._will_bdseq = self._store.reserve()
            self._will_used = False
            client.will_set(self.status_topic, _status("offline", self._will_bdseq), qos=1, retain=True)
        except Exception:
            log.exception("heartbeat on_disconnect failed")

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self.connect_failures += 1
        log.debug("%s: no mqtt connection to %s:%d", self.node_id, *self._broker())

    def _broker(self) -> tuple[str, int]:
        return self.settings.broker_host, self.settings.broker_port

    def _drop_stale_status(self, client: mqtt.Client) -> None:
        """Forget unacknowledged status messages of earlier connections.

        paho resends queued QoS 1 messages after a reconnect even with a clean session,
        and it would do so after the new birth; paho has no public API for this."""
        out = getattr(client, "_out_messages", None)
        mutex = getattr(client, "_out_message_mutex", None)
        if out is None or mutex is None:
            return
        with mutex:
            for mid, message in list(out.items()):
                if message.topic == self.status_topic:
                    del out[mid]

    def _call_in_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn)

    # -- heartbeats (event loop) -------------------------------------------------------

    def _wake_up(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        interval = self.settings.interval_s
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
        client = self._client
        if client is None or not self.connected:
            self.heartbeats_dropped += 1
            return False
        try:
            body = self._snapshot()
        except Exception:
            self.snapshot_errors += 1
            self.heartbeats_dropped += 1
            log.exception("heartbeat snapshot of %s failed", self.node_id)
            return False
        with self._state_lock:
            bdseq = self._live_bdseq
            if bdseq is None:
                self.heartbeats_dropped += 1
                return False
            payload = self._payload(body, bdseq, self._seq)
            if payload is None:
                self.heartbeats_dropped += 1
                return False
            info = client.publish(self.heartbeat_topic, payload, qos=0, retain=False)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                self.heartbeats_dropped += 1
                return False
            self._seq += 1
            self.heartbeats_sent += 1
            return True

    def _payload(self, body: HeartbeatBody, bdseq: int, seq: int) -> bytes | None:
        heartbeat = Heartbeat(
            node_id=self.node_id,
            bdseq=bdseq,
            seq=seq,
            ts=_now_ms(),
            interval_s=self.settings.interval_s,
            state=body.state,
            load=body.load,
            models=list(body.models),
            cache=body.cache,
            grpc_address=body.grpc_address,
            http_address=body.http_address,
            hardware_class=body.hardware_class,
        )
        payload = heartbeat.model_dump_json().encode()
        if len(payload) > MAX_PAYLOAD_BYTES:
            log.warning("heartbeat of %s is %d bytes (> %d): dropped", self.node_id, len(payload), MAX_PAYLOAD_BYTES)
            return None
        return payload
