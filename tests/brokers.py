"""A private Mosquitto broker per test, and a small synchronous subscriber.

``MosquittoBroker`` is ``modelfleet up``'s (``modelfleet.up.mosquitto``): its own config in
a temp dir (loopback listener on a free port, anonymous unless given ``users``, an ACL, a
second TLS listener; no persistence; everything logged in the temp dir). It never touches a
system broker on 1883. No pytest here: the fixture lives in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from modelfleet.up.mosquitto import BrokerTls, MosquittoBroker
from modelfleet.up.ports import free_port


def close_wakeup_pair(client: mqtt.Client) -> None:
    """Close the socket pair paho opens in ``loop_start`` (it closes it only on the next
    one, or on GC): call after ``loop_stop`` so a test leaves no open sockets behind."""
    for name in ("_sockpairR", "_sockpairW"):
        sock = getattr(client, name, None)
        if sock is not None:
            sock.close()
            setattr(client, name, None)


@dataclass(frozen=True)
class Message:
    """One received message."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    at: float  # time.monotonic() on arrival

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)


class Subscriber:
    """A paho client that subscribes to ``topics`` and records every message.

    Returns from ``__enter__``/``start()`` only once the broker acknowledged the
    subscription, so nothing published afterwards is missed (retained ones included)."""

    def __init__(
        self,
        broker: MosquittoBroker,
        topics: str | Iterable[str],
        qos: int = 1,
        *,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.broker = broker
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.qos = qos
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-sub-{uuid.uuid4().hex[:8]}")
        if username is not None:
            self._client.username_pw_set(username, password)
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        self._subscribed = threading.Event()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._messages: list[Message] = []
        self._started = False

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._messages.append(Message(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain), time.monotonic()))
            self._cond.notify_all()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, reason_codes: Any, properties: Any) -> None:
        self._subscribed.set()

    def start(self, timeout: float = 5.0) -> Subscriber:
        """Connect, subscribe and wait for the SUBACK."""
        self._client.connect(self.broker.host, self.broker.port, keepalive=10)
        self._client.loop_start()
        self._started = True
        self._client.subscribe([(topic, self.qos) for topic in self.topics])
        if not self._subscribed.wait(timeout):
            self.close()
            raise TimeoutError(f"no SUBACK from {self.broker} for {self.topics}")
        return self

    def close(self) -> None:
        """Disconnect and stop the network thread (idempotent)."""
        if self._started:
            self._started = False
            self._client.disconnect()
            self._client.loop_stop()
        close_wakeup_pair(self._client)

    def __enter__(self) -> Subscriber:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def messages(self) -> list[Message]:
        """Everything received so far, in order."""
        with self._lock:
            return list(self._messages)

    def on(self, topic: str) -> list[Message]:
        """Messages received on exactly ``topic``."""
        return [m for m in self.messages if m.topic == topic]

    def wait_for(
        self, predicate: Callable[[Message], bool], timeout: float = 5.0, count: int = 1, start: int = 0
    ) -> list[Message]:
        """Wait until ``count`` messages from index ``start`` on satisfy ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                hits = [m for m in self._messages[start:] if predicate(m)]
                if len(hits) >= count:
                    return hits[:count]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"{len(hits)}/{count} matching messages within {timeout}s; got "
                        f"{[(m.topic, m.payload[:120]) for m in self._messages[-10:]]}"
                    )
                self._cond.wait(remaining)

    def wait_topic(self, topic: str, timeout: float = 5.0, count: int = 1, start: int = 0) -> list[Message]:
        """Wait for ``count`` messages on exactly ``topic``."""
        return self.wait_for(lambda m: m.topic == topic, timeout, count, start)

    async def async_wait_for(
        self, predicate: Callable[[Message], bool], timeout: float = 5.0, count: int = 1, start: int = 0
    ) -> list[Message]:
        """``wait_for`` without blocking the event loop (for async tests)."""
        return await asyncio.to_thread(self.wait_for, predicate, timeout, count, start)

    async def async_wait_topic(self, topic: str, timeout: float = 5.0, count: int = 1, start: int = 0) -> list[Message]:
        """``wait_topic`` without blocking the event loop."""
        return await self.async_wait_for(lambda m: m.topic == topic, timeout, count, start)


def collect(broker: MosquittoBroker, topic: str, n: int, timeout: float = 5.0) -> list[Message]:
    """Subscribe to ``topic`` (a filter) and return the first ``n`` messages."""
    with Subscriber(broker, topic) as sub:
        return sub.wait_for(lambda m: True, timeout, n)


def retained(broker: MosquittoBroker, topic: str, timeout: float = 2.0) -> Message | None:
    """The retained message on ``topic``, or None when there is none."""
    with Subscriber(broker, topic) as sub:
        try:
            return sub.wait_for(lambda m: m.retain and m.topic == topic, timeout)[0]
        except TimeoutError:
            return None


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> None:
    """Poll ``condition`` (synchronously) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


__all__ = [
    "BrokerTls",
    "Message",
    "MosquittoBroker",
    "Subscriber",
    "close_wakeup_pair",
    "collect",
    "free_port",
    "retained",
    "wait_until",
]
