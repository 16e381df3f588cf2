"""A private Mosquitto broker per test, and a small synchronous subscriber.

``MosquittoBroker`` is ``modelfleet up``'s (``modelfleet.up.mosquitto``): its own config in
a temp dir (loopback listener on a free port, anonymous unless given ``users``, an ACL, a
second TLS listener; no persistence; everything logged in the temp dir). It never touches a
system broker on 1883. No pytest here: the fixture lives in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

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
        port: int | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        """``port`` and ``context``: another listener of the broker (its TLS one)."""
        super().__init__(
            broker.host,
            broker.port if port is None else port,
            topics,
            qos,
            username=username,
            password=password,
            client_id="test-sub",
            context=context,
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


@dataclass(frozen=True)
class Login:
    """How one client connects: user name and password (None: anonymous), and a TLS
    context for a TLS listener (None: plain TCP)."""

    username: str | None = None
    password: str | None = None
    context: ssl.SSLContext | None = None


def _session(host: str, port: int, client_id: str, login: Login) -> tuple[mqtt.Client, threading.Event, list[Any]]:
    """A connected client (loop running), the event its disconnect sets, and its CONNACK
    reason code (in the list once it came)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.reconnect_delay_set(30, 60)  # not back before the test looked
    if login.username is not None:
        client.username_pw_set(login.username, login.password)
    if login.context is not None:
        client.tls_set_context(login.context)
    closed, answered, connack = threading.Event(), threading.Event(), []

    def on_connect(_c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        connack.append(reason)
        answered.set()

    client.on_connect = on_connect
    client.on_disconnect = lambda *_: closed.set()
    client.connect(host, port, keepalive=10)
    client.loop_start()
    if not answered.wait(5):
        raise TimeoutError(f"no CONNACK for {client_id!r} from {host}:{port}")
    return client, closed, connack


def connect_once(host: str, port: int, client_id: str, login: Login) -> bool:
    """Connect as ``client_id`` with ``login``, wait for the CONNACK and leave; True when
    the broker accepted the connection."""
    client, _, connack = _session(host, port, client_id, login)
    client.disconnect()
    client.loop_stop()
    close_wakeup_pair(client)
    return not connack[0].is_failure


def takeover_closes_session(host: str, port: int, client_id: str, owner: Login, intruder: Login) -> bool:
    """Connect ``client_id`` with the ``owner``'s login, then connect under the same client
    id with the ``intruder``'s; True when the broker closed the owner's connection for it
    (MQTT's session takeover, which also publishes the owner's Last Will).

    The broker closes the old connection before it answers the new CONNECT, so once the
    intruder has its CONNACK and the owner has had a QoS 1 round trip afterwards, an
    owner's disconnect would have been seen: no sleeping on a guess."""
    owner_client, owner_closed, owner_connack = _session(host, port, client_id, owner)
    intruder_client: mqtt.Client | None = None
    try:
        if owner_connack[0].is_failure:
            raise AssertionError(f"the owner's login was refused: {owner_connack[0]}")
        intruder_client, _, _ = _session(host, port, client_id, intruder)
        info = owner_client.publish(f"takeover-check/{uuid.uuid4().hex}", b"", qos=1)
        with contextlib.suppress(RuntimeError, ValueError):
            info.wait_for_publish(3)
        return owner_closed.is_set()
    finally:
        for client in (owner_client, intruder_client):
            if client is not None:
                client.disconnect()
                client.loop_stop()
                close_wakeup_pair(client)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> None:
    """Poll ``condition`` (synchronously) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


__all__ = [
    "BrokerTls",
    "Login",
    "Message",
    "MosquittoBroker",
    "Subscriber",
    "close_wakeup_pair",
    "collect",
    "connect_once",
    "free_port",
    "retained",
    "takeover_closes_session",
    "wait_until",
]
