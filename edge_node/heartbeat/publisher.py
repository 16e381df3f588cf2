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
* Partitions (a replicated central): the Register reply may name a heartbeat partition
  after MQTT is already up (the edge announces itself before central answers, and must
  while central is away). ``use_partition`` then moves both topics to
  ``<prefix>/p/<n>/nodes/{id}/…``: a clean DISCONNECT (the broker discards the will on
  the old topic), a new will on the new topic with the next ``bdseq``, a reconnect to the
  same broker, and on every connect from then on an empty retained message on each old
  status topic (clearing the birth left there) before the birth on the new one. Without
  a partition nothing of this runs: the single-central topics and packets are unchanged.
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
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edge_node.heartbeat.bdseq import BdseqStore
from edge_node.heartbeat.body import HeartbeatBody
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.payloads import MAX_PAYLOAD_BYTES, CentralStatus, Heartbeat, NodeStatus
from fleetwire.mqtt.rotation import BrokerRotation
from fleetwire.mqtt.topics import Topics

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

log = logging.getLogger(__name__)


def first_reconnect_delay_s(broker: BrokerSettings) -> float:
    """paho's first wait after a lost connection, drawn anew each time in
    ``[reconnect_min_s / 2, reconnect_min_s]``; paho doubles it per failed attempt up to
    ``reconnect_max_s``. paho itself never jitters, so without this every edge that lost a
    restarted broker would reconnect at the same instants (the equal jitter of
    ``fleetwire.backoff``, which central's own reconnects use)."""
    return random.uniform(broker.reconnect_min_s / 2, broker.reconnect_min_s)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _status(state: Literal["online", "offline"], bdseq: int) -> bytes:
    return NodeStatus(state=state, bdseq=bdseq, ts=_now_ms()).model_dump_json().encode()


def _close_wakeup_pair(client: mqtt.Client) -> None:
    """Close the socket pair ``loop_start`` made (paho closes it only on GC, and makes a new
    one on every ``loop_start``)."""
    for name in ("_sockpairR", "_sockpairW"):
        pair = getattr(client, name, None)
        if pair is not None:
            with contextlib.suppress(OSError):
                pair.close()
            setattr(client, name, None)


class HeartbeatPublisher:
    """Birth, death (Last Will) and heartbeats of one node; see the module docstring."""

    def __init__(
        self,
        node_id: str,
        settings: HeartbeatSettings,
        snapshot: Callable[[], HeartbeatBody],
        data_dir: Path,
        *,
        broker: BrokerSettings | None = None,
        on_central_online: Callable[[], None] | None = None,
    ) -> None:
        """``broker``: where to connect (default: ``BrokerSettings()``, 127.0.0.1:1883).
        ``on_central_online``: called on the event loop whenever a central announces itself
        online on the broker (its retained status, a new start each time)."""
        self._on_central_online = on_central_online
        self._central_online_ts: int | None = None  # paho thread only
        self.node_id = node_id
        self.settings = settings
        self.broker = broker = broker or BrokerSettings()
        self.topics = Topics(broker.topic_prefix)
        """The topics in use: unpartitioned until ``use_partition`` names a partition."""
        self.rotation = BrokerRotation(broker)
        """Which of ``broker.hosts`` the edge is on; it moves on after a failure or a loss."""
        self.status_topic = self.topics.node_status(node_id)
        self.heartbeat_topic = self.topics.node_heartbeat(node_id)
        self._snapshot = snapshot
        self._store = BdseqStore.in_dir(data_dir)
        self._client: mqtt.Client | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._switch_task: asyncio.Task[None] | None = None
        self._switching = False  # a partition switch is disconnecting: no broker move, no new bdseq
        #: Status topics this node used before a partition switch; cleared on every connect.
        self._old_status_topics: set[str] = set()
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
        # paho is imported here, after the edge serves: a restarted edge answers local
        # inference before it heartbeats, and paho is a noticeable share of its imports.
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        s, b = self.settings, self.broker
        keepalive_s = b.effective_keepalive_s(s.default_keepalive_s)
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._stopping = False
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=b.effective_client_id(f"edge-{self.node_id}"),
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        if b.username is not None:
            client.username_pw_set(b.username, b.password.get_secret_value() if b.password else None)
        if b.tls.enabled:
            client.tls_set_context(b.tls.ssl_context())
        self._jitter_reconnect(client)
        client.max_queued_messages_set(s.max_queued_messages)
        client.connect_timeout = min(5.0, max(1.0, float(keepalive_s)))
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.message_callback_add(self.topics.central_status, self._on_central_status)
        self._will_bdseq = await asyncio.to_thread(self._store.reserve)
        self._will_used = False
        client.will_set(self.status_topic, _status("offline", self._will_bdseq), qos=1, retain=True)
        self.rotation.connect_async(client, keepalive_s)
        log.info(
            "heartbeat for %s: %s %s every %.3gs (next bdseq %d)",
            self.node_id,
            b.url,
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
        if self._switch_task is not None:  # bounded: a disconnect and paho's thread ending
            await asyncio.gather(self._switch_task, return_exceptions=True)
            self._switch_task = None
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
        _close_wakeup_pair(client)
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

    # -- partitions --------------------------------------------------------------------

    @property
    def partition(self) -> int | None:
        """The heartbeat partition of the topics in use (None: unpartitioned)."""
        return self.topics.partition

    def use_partition(self, partition: int | None) -> None:
        """Publish on ``partition``'s topics from now on (None: the unpartitioned ones); call
        on the event loop. The same partition again does nothing. Once started, the switch
        (a reconnect carrying the new will, see the module docstring) runs in the background;
        ``stop()`` waits for it."""
        if partition == self.topics.partition:
            return
        old = self.status_topic
        topics = self.topics.in_partition(partition)
        with self._state_lock:
            self.topics = topics
            self.status_topic = topics.node_status(self.node_id)
            self.heartbeat_topic = topics.node_heartbeat(self.node_id)
            self._old_status_topics.add(old)
            self._old_status_topics.discard(self.status_topic)
        log.info("heartbeat for %s moves to %s", self.node_id, self.heartbeat_topic)
        if self._client is None or self._stopping:
            return  # not connected yet: start() sets the will on the new topic
        previous = self._switch_task
        self._switch_task = asyncio.create_task(self._switch(previous), name=f"heartbeat-switch-{self.node_id}")

    async def _switch(self, previous: asyncio.Task[None] | None) -> None:
        """Reconnect so that the broker holds the will of the new status topic."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        client = self._client
        if client is None or self._stopping:
            return
        with self._state_lock:
            self._switching = True
            self._live_bdseq = None  # no heartbeat on the old connection from here on
        client.disconnect()  # DISCONNECT: the broker discards the will, which names the old topic
        await asyncio.to_thread(client.loop_stop)
        _close_wakeup_pair(client)
        # paho's thread has ended: the will state is this task's until loop_start below
        if self._will_used:
            self._will_bdseq = await asyncio.to_thread(self._store.reserve)
            self._will_used = False
        client.will_set(self.status_topic, _status("offline", self._will_bdseq), qos=1, retain=True)
        with self._state_lock:
            self._switching = False
            if self._stopping:  # stop() waits for this task, then disconnects what is left
                return
        self.rotation.connect_async(client, client.keepalive)
        client.loop_start()

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
                if self._stopping or self._switching:  # under the lock: stop() then sees no live connection
                    return
                for old in sorted(self._old_status_topics):  # empty + retained: the broker forgets it
                    client.publish(old, b"", qos=1, retain=True)
                client.publish(self.status_topic, _status("online", bdseq), qos=1, retain=True)
                self._live_bdseq = bdseq
                self._bdseq = bdseq
                self._seq = 0
                self.connects += 1
            if self._on_central_online is not None:
                client.subscribe(self.topics.central_status, qos=1)
            log.info("%s connected to %s, bdseq %d", self.node_id, self.rotation.url, bdseq)
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
                self._jitter_reconnect(client)  # paho waits after this callback returns
            if self._stopping or self._switching:
                return
            self.rotation.move(client)  # paho's next reconnect dials the next broker, if any
            if not self._will_used:
                return
            # the next CONNECT must carry a new number: set its will before paho reconnects
            self._will_bdseq = self._store.reserve()
            self._will_used = False
            client.will_set(self.status_topic, _status("offline", self._will_bdseq), qos=1, retain=True)
        except Exception:
            log.exception("heartbeat on_disconnect failed")

    def _on_central_status(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        """A central's retained status: each new ``online`` (a start, or a reconnect to the
        broker) calls ``on_central_online``; anything unreadable is ignored."""
        try:
            status = CentralStatus.model_validate_json(message.payload)
        except ValueError:
            return
        if status.state != "online" or status.ts == self._central_online_ts:
            return
        self._central_online_ts = status.ts
        if self._on_central_online is not None:
            self._call_in_loop(self._on_central_online)

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self.connect_failures += 1
        log.debug("%s: no mqtt connection to %s", self.node_id, self.rotation.url)
        if not self._stopping:
            self.rotation.move(client)

    def _jitter_reconnect(self, client: mqtt.Client) -> None:
        """A new random first reconnect wait (``first_reconnect_delay_s``); paho starts
        its doubling from it. paho sleeps with time.sleep, so fractions of a second work."""
        first = first_reconnect_delay_s(self.broker)
        client.reconnect_delay_set(first, self.broker.reconnect_max_s)  # type: ignore[arg-type]

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
                if message.topic == self.status_topic or message.topic in self._old_status_topics:
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
        from paho.mqtt.enums import MQTTErrorCode  # loaded by start(), which made the client

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
            site=body.site,
            mode="synced" if body.autonomous_since is None else "autonomous",
            autonomous_since=None if body.autonomous_since is None else int(body.autonomous_since * 1000),
            clock_offset_ms=body.clock_offset_ms,
            clock_error_ms=body.clock_error_ms,
        )
        payload = heartbeat.model_dump_json().encode()
        if len(payload) > MAX_PAYLOAD_BYTES:
            log.warning("heartbeat of %s is %d bytes (> %d): dropped", self.node_id, len(payload), MAX_PAYLOAD_BYTES)
            return None
        return payload
