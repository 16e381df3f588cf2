"""The edge's MQTT presence: retained birth/death on ``…/nodes/{id}/status`` (with a
Last Will) and a QoS 0 heartbeat on ``…/nodes/{id}/heartbeat`` every ``interval_s``.

:class:`HeartbeatPublisher` composes three parts, each with one job: the paho session
(``session.py``: the client, its jittered reconnects), the presence state machine
(``presence.py``: how ``bdseq`` and the Last Will line up across reconnects, births and
deaths) and the ticker (``ticker.py``: the heartbeats). It wires paho's callbacks to them,
moves through the configured brokers (``BrokerRotation``) and owns start, stop and
partition switches.

* ``stop()`` publishes ``offline`` with the current ``bdseq`` (qos 1, retain) and waits
  for its PUBACK (bounded); only then does it DISCONNECT, which discards the will. If the
  PUBACK doesn't come in time, it drops the TCP connection without DISCONNECT so that the
  broker publishes the will instead, which carries the same ``bdseq``.
* Partitions (a replicated central): the Register reply may name a heartbeat partition
  after MQTT is already up (the edge announces itself before central answers, and must
  while central is away). ``use_partition`` then moves both topics to
  ``<prefix>/p/<n>/nodes/{id}/…``: a clean DISCONNECT (the broker discards the will on
  the old topic), a new will on the new topic with the next ``bdseq``, a reconnect to the
  same broker, and on every connect from then on an empty retained message on each old
  status topic (clearing the birth left there) before the birth on the new one. Without
  a partition nothing of this runs: the single-central topics and packets are unchanged.
* Threads: paho callbacks run on paho's thread; the ticker runs on the event loop and is
  woken with ``call_soon_threadsafe`` (see ``presence.py`` for the lock between them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_node.heartbeat.bdseq import BdseqStore
from edge_node.heartbeat.body import HeartbeatBody
from edge_node.heartbeat.presence import Presence
from edge_node.heartbeat.session import (
    close_wakeup_pair,
    first_reconnect_delay_s,
    jitter_reconnect,
    leave_without_disconnect,
    new_client,
    stop_loop,
)
from edge_node.heartbeat.ticker import HeartbeatTicker
from edge_node.settings import HeartbeatSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.payloads import CentralStatus
from fleetwire.mqtt.rotation import BrokerRotation
from fleetwire.mqtt.topics import Topics

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = ["HeartbeatPublisher", "first_reconnect_delay_s"]

log = logging.getLogger(__name__)


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
        self.rotation = BrokerRotation(broker)
        """Which of ``broker.hosts`` the edge is on; it moves on after a failure or a loss."""
        self._store = BdseqStore.in_dir(data_dir)
        self._presence = Presence(node_id, Topics(broker.topic_prefix), self._store)
        self._client: mqtt.Client | None = None
        self._ticker = HeartbeatTicker(node_id, settings.interval_s, snapshot, self._presence, lambda: self._client)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._switch_task: asyncio.Task[None] | None = None
        self.connect_failures = 0
        """CONNECTs that failed or were refused."""

    # -- state -------------------------------------------------------------------------

    @property
    def topics(self) -> Topics:
        """The topics in use: unpartitioned until ``use_partition`` names a partition."""
        return self._presence.topics

    @property
    def status_topic(self) -> str:
        """Where this node's birth and death are retained."""
        return self._presence.status_topic

    @property
    def heartbeat_topic(self) -> str:
        """Where this node's heartbeats go."""
        return self._presence.heartbeat_topic

    @property
    def connected(self) -> bool:
        """A connection is up and its birth was published."""
        return self._presence.connected

    @property
    def bdseq(self) -> int:
        """The ``bdseq`` of the current (or latest) connection; 0 before the first."""
        return self._presence.bdseq

    @property
    def seq(self) -> int:
        """The ``seq`` the next heartbeat of this connection carries."""
        return self._presence.seq

    @property
    def connects(self) -> int:
        """Connections whose birth went out."""
        return self._presence.connects

    @property
    def disconnects(self) -> int:
        """Live connections lost."""
        return self._presence.disconnects

    @property
    def heartbeats_sent(self) -> int:
        """Heartbeats handed to paho."""
        return self._ticker.sent

    @property
    def heartbeats_dropped(self) -> int:
        """Heartbeats not sent (no connection, paho refused, snapshot error, too large)."""
        return self._ticker.dropped

    @property
    def snapshot_errors(self) -> int:
        """Heartbeat snapshots that raised."""
        return self._ticker.snapshot_errors

    @property
    def running(self) -> bool:
        """Started and not stopped."""
        return self._client is not None and not self._presence.stopping

    async def wait_connected(self, timeout: float) -> bool:
        """Wait until ``connected`` (polling); False on timeout."""
        deadline = time.monotonic() + timeout
        while not self.connected:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    def beat(self) -> bool:
        """Publish one heartbeat now if connected; True when it went out."""
        return self._ticker.beat()

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Connect in the background (the broker may be away) and start heartbeating."""
        if not self.settings.enabled:
            log.info("heartbeat disabled for %s", self.node_id)
            return
        if self._client is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._presence.stopping = False
        client = new_client(self.node_id, self.settings, self.broker)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        client.message_callback_add(self.topics.central_status, self._on_central_status)
        await self._presence.arm(client)
        self.rotation.connect_async(client, self.broker.effective_keepalive_s(self.settings.default_keepalive_s))
        log.info(
            "heartbeat for %s: %s %s every %.3gs (next bdseq %d)",
            self.node_id,
            self.broker.url,
            self.heartbeat_topic,
            self.settings.interval_s,
            self._presence.next_bdseq,
        )
        self._client = client
        self._ticker.start()  # runs from the next await; its wake-up exists before paho's thread
        client.loop_start()

    async def stop(self) -> None:
        """Publish ``offline`` (bounded wait), disconnect and stop paho's thread (idempotent)."""
        client = self._client
        if client is None or self._presence.stopping:
            return
        self._presence.begin_stop()  # from here on no birth goes out
        if self._switch_task is not None:  # bounded: a disconnect and paho's thread ending
            await asyncio.gather(self._switch_task, return_exceptions=True)
            self._switch_task = None
        await self._ticker.stop()
        bdseq = self._presence.end_live()
        if bdseq is not None and not await self._presence.publish_death(client, bdseq, self.settings.stop_timeout_s):
            # no PUBACK in time: leave without DISCONNECT so the broker publishes the will
            # (the same offline/bdseq) rather than keeping "online" retained
            leave_without_disconnect(client)
        client.disconnect()
        await stop_loop(client, self.settings.stop_timeout_s + 5.0, self.node_id)
        self._client = None
        log.info("heartbeat for %s stopped (bdseq %d)", self.node_id, self.bdseq)

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
        self._presence.move_to(self.topics.in_partition(partition))
        log.info("heartbeat for %s moves to %s", self.node_id, self.heartbeat_topic)
        if self._client is None or self._presence.stopping:
            return  # not connected yet: start() sets the will on the new topic
        previous = self._switch_task
        self._switch_task = asyncio.create_task(self._switch(previous), name=f"heartbeat-switch-{self.node_id}")

    async def _switch(self, previous: asyncio.Task[None] | None) -> None:
        """Reconnect so that the broker holds the will of the new status topic."""
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        client = self._client
        if client is None or self._presence.stopping:
            return
        self._presence.begin_switch(client)
        client.disconnect()  # DISCONNECT: the broker discards the will, which names the old topic
        await asyncio.to_thread(client.loop_stop)
        close_wakeup_pair(client)
        # paho's thread has ended: the will state is this task's until loop_start below
        await self._presence.arm(client, fresh=False)
        if not self._presence.end_switch():  # stop() waits for this task, then disconnects what is left
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
            bdseq = self._presence.born(client)
            if bdseq is None:
                return
            if self._on_central_online is not None:
                client.subscribe(self.topics.central_status, qos=1)
            log.info("%s connected to %s, bdseq %d", self.node_id, self.rotation.url, bdseq)
            self._call_in_loop(self._ticker.wake_up)
        except Exception:
            log.exception("heartbeat on_connect failed")

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        try:
            was_live = self._presence.lost()
            if was_live is not None:
                log.warning("%s lost mqtt connection (bdseq %d): %s", self.node_id, was_live, reason_code)
                jitter_reconnect(client, self.broker)  # paho waits after this callback returns
            if self._presence.stopping or self._presence.switching:
                return
            self.rotation.move(client)  # paho's next reconnect dials the next broker, if any
            self._presence.rearm_after_loss(client)  # before paho reconnects
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
        if not self._presence.stopping:
            self.rotation.move(client)

    def _call_in_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn)
