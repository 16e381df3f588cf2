"""A private Mosquitto broker per test, and a small synchronous subscriber.

``MosquittoBroker`` is ``modelfleet up``'s (``modelfleet.up.mosquitto``): its own config in
a temp dir (loopback listener on a free port, anonymous unless given ``users``, an ACL, a
second TLS listener; no persistence; everything logged in the temp dir). It never touches a
system broker on 1883. No pytest here: the fixture lives in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from bench._broker import Received, RecordingClient, close_wakeup_pair
from modelfleet.up.mosquitto import BrokerTls, MosquittoBroker
from modelfleet.up.ports import free_port

#: One received message (topic, payload, qos, retain, arrival times).
Message = Received


class Subscriber(RecordingClient):
    """A paho client that subscribes to ``topics`` on ``broker`` and records every message.

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
        super().__init__(
            broker.host, broker.port, topics, qos, username=username, password=password, client_id="test-sub"
        )
        self.broker = broker

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
