"""Central's MQTT client: node births, deaths and heartbeats in; central's own status and
fleet events out.

paho's I/O runs on the asyncio loop itself (``MqttLoopDriver``: the socket is watched by
the loop, reads are buffered, reconnects back off exponentially), so every message is
size-checked, parsed and handed to the tracker on the loop thread, with no thread hop
and no GIL traffic per message. Nothing raised by a message ever leaves the paho callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from central.events import EventLog
from central.membership.lag_probe import LagProbe
from central.membership.tracker import MembershipTracker
from central.mqtt.driver import BufferedClient, MqttLoopDriver
from central.settings import CENTRAL_KEEPALIVE_S, MqttSettings
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.fast import DecodeError, decode_heartbeat, decode_status
from fleetwire.mqtt.payloads import CentralStatus, Event
from fleetwire.mqtt.rotation import BrokerRotation
from fleetwire.mqtt.topics import Topics, partition_of

log = logging.getLogger(__name__)

__all__ = ["MembershipConsumer", "make_tracker"]

#: Events queued in paho (in flight, or while the broker is unreachable); beyond it new
#: ones are dropped. Sized for a start-up burst of one node_alive per node of a 10k fleet
#: (~200 bytes each, so a few MB at most).
_MAX_QUEUED = 20_000
#: QoS 1 events awaiting the broker's ack at once; paho's default of 20 drains a burst slowly.
_MAX_INFLIGHT = 200


def make_tracker(
    settings: MqttSettings, loop: asyncio.AbstractEventLoop | None = None, events: EventLog | None = None
) -> MembershipTracker:
    """A tracker with the thresholds of ``settings``, keeping its events in ``events`` when given."""
    return MembershipTracker(
        suspect_after=settings.suspect_after,
        dead_after=settings.dead_after,
        default_interval_s=settings.default_interval_s,
        loop=loop,
        events=events,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class MembershipConsumer:
    """Feeds a ``MembershipTracker`` from the broker and publishes central's status/events."""

    def __init__(
        self,
        settings: MqttSettings,
        tracker: MembershipTracker,
        loop: asyncio.AbstractEventLoop | None = None,
        *,
        broker: BrokerSettings | None = None,
        central_id: str = "",
        publish_events: bool = True,
    ) -> None:
        """``loop`` defaults to the running loop at ``start``; ``broker``: where to connect
        (default: ``BrokerSettings()``, 127.0.0.1:1883). With ``publish_events`` the
        tracker's events go to ``topics.events`` while the consumer runs."""
        self.settings = settings
        self.broker = broker = broker or BrokerSettings()
        self.rotation = BrokerRotation(broker)
        """Which of ``broker.hosts`` central is on; it moves on after a failure or a loss."""
        self.tracker = tracker
        self.topics = Topics(broker.topic_prefix)
        self.central_id = central_id or f"central-{os.getpid()}"
        self.client_id = broker.effective_client_id(f"modelfleet-central-{uuid.uuid4().hex[:12]}")
        self._loop = loop
        self._publish_events = publish_events
        self._client: mqtt.Client | None = None
        self._driver: MqttLoopDriver | None = None
        self._loop_thread = threading.get_ident()
        self._connected = threading.Event()
        self._stopping = False
        self.connects = 0
        self.connect_failures = 0
        self._probe_topic = self.topics.central_probe(self.client_id)
        self.probe = LagProbe(self._publish_probe)
        self.events_published = 0
        self.events_dropped = 0
        #: The heartbeat partitions this replica owns (a replicated central); None: every node
        #: on the plain topics (a single central).
        self._partitions: set[int] | None = None
        self._partitions_total = 0

    @property
    def connected(self) -> bool:
        """Whether the broker session is up right now."""
        return self._connected.is_set()

    async def start(self) -> None:
        """Connect in the background; returns at once (the broker may come up later).
        Does nothing when ``settings.enabled`` is off."""
        if self._client is not None or not self.settings.enabled:
            return
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        b = self.broker
        client = BufferedClient(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        if b.username is not None:
            client.username_pw_set(b.username, b.password.get_secret_value() if b.password else None)
        if b.tls.enabled:
            client.tls_set_context(b.tls.ssl_context())
        client.max_queued_messages_set(_MAX_QUEUED)
        client.max_inflight_messages_set(_MAX_INFLIGHT)
        client.will_set(self.topics.central_status, self._central_status("offline"), qos=1, retain=True)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        self._client = client
        self._loop_thread = threading.get_ident()
        self.tracker.link_down()  # until the first CONNACK: nobody can be heard yet
        self.rotation.connect_async(client, b.effective_keepalive_s(CENTRAL_KEEPALIVE_S))
        self._driver = MqttLoopDriver(
            client,
            self._loop,
            min_delay_s=b.reconnect_min_s,
            max_delay_s=b.reconnect_max_s,
            on_connect_failed=self._connect_failed,
            rotation=self.rotation,
        )
        self._driver.start()
        self.tracker.set_lag_source(self.probe.lag)
        if self._publish_events:
            self.tracker.set_publisher(self.publish_event)
        log.info("MQTT consumer connecting to %s as %s", b.url, self.client_id)

    @property
    def partitions(self) -> set[int] | None:
        """The partitions subscribed to (None: unpartitioned)."""
        return None if self._partitions is None else set(self._partitions)

    def set_partitions(self, partitions: set[int], total: int | None = None) -> None:
        """Follow exactly these heartbeat partitions from now (a replicated central): subscribe
        to the new ones (their retained births arrive at once) and leave the others. Messages
        of a partition no longer held are dropped even if already in flight."""
        old = self._partitions or set()
        self._partitions = set(partitions)
        if total is not None:
            self._partitions_total = total
        client = self._client
        if client is None or not self._connected.is_set():
            return  # _on_connect subscribes to the current set
        removed, added = old - partitions, partitions - old
        if removed:
            client.unsubscribe([f for k in sorted(removed) for f in self._filters(k)])
        if added:
            client.subscribe([(f, q) for k in sorted(added) for f, q in zip(self._filters(k), (1, 0), strict=True)])

    def _filters(self, partition: int | None) -> tuple[str, str]:
        topics = self.topics.in_partition(partition)
        return topics.all_status, topics.all_heartbeats

    def _subscriptions(self) -> list[tuple[str, int]]:
        parts: list[int | None] = [None] if self._partitions is None else [*sorted(self._partitions)]
        subs = [(f, q) for k in parts for f, q in zip(self._filters(k), (1, 0), strict=True)]
        return [*subs, (self._probe_topic, 0)]

    async def wait_connected(self, timeout: float) -> bool:
        """Wait until the first (or next) successful connect; False on timeout."""
        return await asyncio.to_thread(self._connected.wait, timeout)

    async def stop(self) -> None:
        """Publish central offline (retained), then disconnect cleanly."""
        client, self._client = self._client, None
        driver, self._driver = self._driver, None
        if client is None or driver is None:
            return
        self._stopping = True
        self.probe.disconnected()
        if self._publish_events:
            self.tracker.set_publisher(None)
        if self._connected.is_set():
            info = client.publish(self.topics.central_status, self._central_status("offline"), qos=1, retain=True)
            if not await driver.wait_published(info, timeout_s=2.0):
                log.warning("central offline was not acknowledged by the broker")
        await driver.stop()
        self._connected.clear()
        self.tracker.link_down()

    def _connect_failed(self, exc: BaseException) -> None:
        self.connect_failures += 1
        log.debug("MQTT connect to %s failed: %s", self.rotation.url, exc)

    # ----------------------------------------------------------------- events out

    def publish_event(self, event: Event) -> None:
        """Publish one tracker event on ``topics.events`` (QoS 1, not retained).

        Called on the loop thread (paho's publish does not block); while disconnected paho
        queues up to ``_MAX_QUEUED`` and the rest are counted as dropped."""
        client = self._client
        if client is None:
            self.events_dropped += 1
            return
        info = client.publish(self.topics.events, event.model_dump_json(), qos=1, retain=False)
        if info.rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
            self.events_published += 1
        else:
            self.events_dropped += 1

    def _publish_probe(self, payload: bytes) -> bool:
        client = self._client
        return client is not None and client.publish(self._probe_topic, payload, qos=0).rc == mqtt.MQTT_ERR_SUCCESS

    def _central_status(self, state: Literal["online", "offline"]) -> str:
        return CentralStatus(state=state, ts=_now_ms(), central_id=self.central_id).model_dump_json()

    # ----------------------------------------------------------------- paho callbacks (loop thread)

    def _on_connect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.ConnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        if reason_code.is_failure:  # e.g. bad credentials: the broker closes, the driver backs off
            self.connect_failures += 1
            log.warning("MQTT connect refused: %s", reason_code)
            return
        self.connects += 1
        if self._driver is not None:
            self._driver.connack_seen = True
        # Before the subscription, so that retained births count from this link-up.
        self._deliver(self.tracker.link_up)
        client.subscribe(self._subscriptions())
        client.publish(self.topics.central_status, self._central_status("online"), qos=1, retain=True)
        self._connected.set()
        if self._loop is not None:
            self.probe.connected(self._loop)
        log.info("MQTT connected to %s (connect #%d)", self.rotation.url, self.connects)

    def _on_disconnect(
        self,
        client: mqtt.Client,
        userdata: Any,
        flags: mqtt.DisconnectFlags,
        reason_code: ReasonCode,
        properties: Properties | None,
    ) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        self.probe.disconnected()
        if was and not self._stopping:
            self._deliver(self.tracker.link_down)
            log.warning("MQTT disconnected: %s; reconnecting", reason_code)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self.handle_message(msg.topic, msg.payload, bool(msg.retain))
        except Exception:  # never let anything unwind into paho's loop
            log.exception("dropping MQTT message on %r", getattr(msg, "topic", "?"))

    def handle_message(self, topic: str, payload: bytes | bytearray, retained: bool = False) -> None:
        """Check, parse and hand one message to the tracker (public for tests)."""
        if topic == self._probe_topic:
            self.probe.handle(payload)
            return
        if len(payload) > self.settings.max_payload_bytes:
            self.tracker.count_oversized()
            return
        parsed = self.topics.parse_node_topic(topic)
        if parsed is None:
            self.tracker.count_malformed()
            return
        partitions = self._partitions
        if (parsed.partition is None) != (partitions is None):
            self.tracker.count_malformed()  # plain topics to a replica, or partitioned to a single central
            return
        if partitions is not None and parsed.partition not in partitions:
            return  # in flight from a partition just handed over: its new owner reads it
        node_id = parsed.node_id
        total = self._partitions_total
        if total and parsed.partition != partition_of(node_id, total):
            self.tracker.count_malformed()  # not its partition: its owner would never release it
            return
        try:
            if parsed.kind == "heartbeat":
                hb = decode_heartbeat(payload)
                if hb.node_id != node_id:
                    self.tracker.count_malformed()
                    return
                self._deliver(self.tracker.on_heartbeat, node_id, hb)
            elif parsed.kind == "status":
                if not payload:
                    return  # a retained status being cleared: nothing to learn
                status = decode_status(payload)
                self._deliver(self.tracker.on_status, node_id, status, retained)
            else:
                self.tracker.count_malformed()
        except (DecodeError, ValueError):
            self.tracker.count_malformed()

    def _deliver(self, fn: Callable[..., None], *args: Any) -> None:
        """Call the tracker now (the loop thread), or queue the call there from any other."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: central is shutting down
            loop.call_soon_threadsafe(fn, *args)
