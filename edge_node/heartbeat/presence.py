"""The Sparkplug-style presence of one node: retained birth/death on ``…/nodes/{id}/status``
with a Last Will, numbered by ``bdseq``.

How ``bdseq`` and the Last Will line up across reconnects
---------------------------------------------------------
MQTT sends the will *inside* CONNECT, so the will of a connection must be chosen before
that connection exists; paho keeps whatever ``will_set`` last stored and puts it in
every CONNECT it sends, including its own automatic reconnects. So:

1. ``arm()`` (at start) reserves the next ``bdseq`` N (persisted first, see ``bdseq.py``)
   and calls ``will_set(status, offline/N, qos 1, retain)``; only then does paho connect.
2. ``born()`` (a successful CONNACK): the CONNECT that was just accepted carried the will
   with N, so the birth ``online/N`` (qos 1, retain) goes out, and N is marked *used*.
3. ``rearm_after_loss()`` (paho's thread, in its disconnect callback, always before it
   tries to reconnect, and the only place the will is changed while paho runs): when N
   was used, reserve N+1 and ``will_set`` it, so the next CONNECT carries N+1 and its birth
   will too. A CONNECT that never got a successful CONNACK (broker down, refused) does not
   use a number: paho resends the same will, and the birth that follows carries it.

``will_set`` only writes fields that paho reads when it builds a CONNECT, and both the
callbacks and ``reconnect()`` run on paho's network thread, so the will can't change
under a CONNECT being built. Consequence for consumers: a death whose ``bdseq`` is lower
than the latest birth's belongs to an old connection and is stale.

A birth or death still unacknowledged when a connection broke is removed from paho's queue
at the next connect (paho would otherwise resend it after the new birth, making a stale
``bdseq`` the retained status). After a move to a partition's topics (``move_to``) every
connect first publishes an empty retained message on each old status topic, clearing the
birth left there.

Threads: paho's thread owns the will state; ``lock`` guards what the event loop reads too
(the live connection's ``bdseq`` and ``seq``, the topics, ``stopping``/``switching``), so no
heartbeat of a new connection precedes its birth or carries the previous one's ``bdseq``."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal

from edge_node.heartbeat.bdseq import BdseqStore
from edge_node.heartbeat.session import drop_stale_status
from fleetwire.mqtt.payloads import NodeStatus
from fleetwire.mqtt.topics import Topics

if TYPE_CHECKING:
    import paho.mqtt.client as mqtt

__all__ = ["Presence", "status_payload"]

log = logging.getLogger(__name__)


def status_payload(state: Literal["online", "offline"], bdseq: int) -> bytes:
    """A ``NodeStatus`` message: a birth (online) or a death (offline) numbered ``bdseq``."""
    return NodeStatus(state=state, bdseq=bdseq, ts=int(time.time() * 1000)).model_dump_json().encode()


class Presence:
    """Births, deaths and the will of one node's connections; see the module docstring."""

    def __init__(self, node_id: str, topics: Topics, store: BdseqStore) -> None:
        self.node_id = node_id
        self.store = store
        self.lock = threading.Lock()
        """Guards the live connection's numbers, the topics and the two flags below."""
        self.stopping = False
        """Set (under ``lock``) by the publisher's stop: no birth goes out from then on."""
        self.switching = False
        """A partition switch is disconnecting: no broker move, no new ``bdseq``."""
        self.topics = topics
        self.status_topic = topics.node_status(node_id)
        self.heartbeat_topic = topics.node_heartbeat(node_id)
        self._old_status_topics: set[str] = set()
        self._will_bdseq = 0  # in the will paho sends with its next CONNECT (paho's thread)
        self._will_used = False  # a successful CONNACK accepted the CONNECT carrying it
        self._live_bdseq: int | None = None  # the current connection's, once its birth is queued
        self._bdseq = 0  # of the current or latest connection
        self._seq = 0
        self.connects = 0
        self.disconnects = 0

    @property
    def connected(self) -> bool:
        """A connection is up and its birth was published."""
        with self.lock:
            return self._live_bdseq is not None

    @property
    def bdseq(self) -> int:
        """The ``bdseq`` of the current (or latest) connection; 0 before the first."""
        with self.lock:
            return self._bdseq

    @property
    def seq(self) -> int:
        """The ``seq`` the next heartbeat of this connection carries."""
        with self.lock:
            return self._seq

    @property
    def next_bdseq(self) -> int:
        """The ``bdseq`` of the will paho sends with its next CONNECT."""
        return self._will_bdseq

    # -- the will ----------------------------------------------------------------------

    def _set_will(self, client: mqtt.Client) -> None:
        client.will_set(self.status_topic, status_payload("offline", self._will_bdseq), qos=1, retain=True)

    async def arm(self, client: mqtt.Client, *, fresh: bool = True) -> None:
        """Set the will of the next CONNECT (paho's thread not running): a newly reserved
        ``bdseq`` when ``fresh`` (a start) or the current one was used (a partition switch)."""
        if fresh or self._will_used:
            self._will_bdseq = await asyncio.to_thread(self.store.reserve)
            self._will_used = False
        self._set_will(client)

    def rearm_after_loss(self, client: mqtt.Client) -> None:
        """(paho's thread, before it reconnects) the next CONNECT must carry a new number
        when the current one was used."""
        if not self._will_used:
            return
        self._will_bdseq = self.store.reserve()
        self._will_used = False
        self._set_will(client)

    # -- connections -------------------------------------------------------------------

    def born(self, client: mqtt.Client) -> int | None:
        """(paho's thread, a successful CONNACK) clear old status topics and publish the
        birth; the connection's ``bdseq``, or None while stopping or switching."""
        bdseq = self._will_bdseq
        if self._will_used:  # paho reconnected without telling us it lost the connection
            log.warning("bdseq %d of %s used by two connections", bdseq, self.node_id)
        self._will_used = True
        drop_stale_status(client, {self.status_topic, *self._old_status_topics})
        with self.lock:
            if self.stopping or self.switching:  # under the lock: stop() then sees no live connection
                return None
            _clear(client, self._old_status_topics)
            client.publish(self.status_topic, status_payload("online", bdseq), qos=1, retain=True)
            self._live_bdseq = self._bdseq = bdseq
            self._seq = 0
            self.connects += 1
        return bdseq

    def lost(self) -> int | None:
        """The connection ended: its ``bdseq`` if it was live (counted as a disconnect)."""
        with self.lock:
            was_live, self._live_bdseq = self._live_bdseq, None
        if was_live is not None:
            self.disconnects += 1
        return was_live

    def begin_stop(self) -> None:
        """No birth goes out from now on."""
        with self.lock:
            self.stopping = True

    def end_live(self) -> int | None:
        """Forget the live connection (a stop): its ``bdseq``, for the death, or None."""
        with self.lock:
            bdseq, self._live_bdseq = self._live_bdseq, None
        return bdseq

    async def publish_death(self, client: mqtt.Client, bdseq: int, timeout_s: float) -> bool:
        """Publish ``offline/bdseq`` (a stop) and wait up to ``timeout_s`` for its PUBACK;
        False when it was not acknowledged (the caller then leaves so the will goes out). A
        stop that came between a partition move and the switch's reconnect finds this
        connection's birth on an old status topic: those are cleared first."""
        try:
            with self.lock:
                old_topics = set(self._old_status_topics)
            _clear(client, old_topics)
            info = client.publish(self.status_topic, status_payload("offline", bdseq), qos=1, retain=True)
            await asyncio.to_thread(info.wait_for_publish, timeout_s)
        except (ValueError, RuntimeError) as exc:
            log.warning("offline status of %s not published: %s", self.node_id, exc)
            return False
        if not info.is_published():
            log.warning("offline status of %s unacknowledged after %.1fs", self.node_id, timeout_s)
            return False
        return True

    def begin_switch(self, client: mqtt.Client) -> None:
        """A partition switch disconnects: no heartbeat on the old connection from here on.
        The old status topics are cleared on it first: its DISCONNECT discards the will, so a
        stop arriving before the new connection's birth would leave "online" retained there."""
        with self.lock:
            self.switching = True
            if self._live_bdseq is not None:
                _clear(client, self._old_status_topics)
            self._live_bdseq = None

    def end_switch(self) -> bool:
        """The switch's will is set: True when it may reconnect (no stop came meanwhile)."""
        with self.lock:
            self.switching = False
            return not self.stopping

    def move_to(self, topics: Topics) -> None:
        """Use ``topics`` from now on; the old status topic is cleared on every connect."""
        old = self.status_topic
        with self.lock:
            self.topics = topics
            self.status_topic = topics.node_status(self.node_id)
            self.heartbeat_topic = topics.node_heartbeat(self.node_id)
            self._old_status_topics.add(old)
            self._old_status_topics.discard(self.status_topic)

    def publish_beat(self, publish: Callable[[str, int, int], bool]) -> bool:
        """``publish(heartbeat_topic, bdseq, seq)`` on the live connection, under ``lock``;
        ``seq`` advances when it went out. False when no connection is live or it failed."""
        with self.lock:
            if self._live_bdseq is None:
                return False
            if not publish(self.heartbeat_topic, self._live_bdseq, self._seq):
                return False
            self._seq += 1
            return True


def _clear(client: mqtt.Client, topics: Iterable[str]) -> None:
    """Publish an empty retained message on each status topic: the broker forgets it."""
    for topic in sorted(topics):
        client.publish(topic, b"", qos=1, retain=True)
