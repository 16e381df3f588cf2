"""A small MQTT recorder for the benchmarks (and, as ``tests/support/brokers.Subscriber``, the
tests), which start their private Mosquitto with ``modelfleet.up.mosquitto.MosquittoBroker``.

``RecordingClient`` subscribes to topic filters and keeps every message with its arrival
time (``time.monotonic()``), so a benchmark can time an event by when it reached a
subscriber rather than by polling. ``Recorder`` adds the benchmarks' wait.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion


def close_wakeup_pair(client: mqtt.Client) -> None:
    """Close the socket pair paho opens in ``loop_start`` (it closes it only on the next
    one, or on GC): call after ``loop_stop`` so a bench or test leaves no open sockets behind."""
    for name in ("_sockpairR", "_sockpairW"):
        sock = getattr(client, name, None)
        if sock is not None:
            sock.close()
            setattr(client, name, None)


@dataclass(frozen=True)
class Received:
    """One message and when it arrived."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    at: float  # time.monotonic()
    wall: float  # time.time()

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)


class RecordingClient:
    """A paho client that subscribes to ``topics`` and records every message.

    Returns from ``__enter__``/``start()`` only once the broker acknowledged the
    subscription, so nothing published afterwards is missed (retained ones included).
    ``resubscribe``: subscribe again on every reconnect, so that it survives a broker
    restart; else once, on ``start``."""

    def __init__(
        self,
        host: str,
        port: int,
        topics: str | Iterable[str],
        qos: int = 1,
        *,
        username: str | None = None,
        password: str | None = None,
        resubscribe: bool = False,
        client_id: str = "recorder",
        context: ssl.SSLContext | None = None,
    ) -> None:
        """``context``: connect with TLS (to the broker's TLS listener on ``port``)."""
        self.host, self.port = host, port
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.qos = qos
        self.resubscribe = resubscribe
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{client_id}-{uuid.uuid4().hex[:8]}")
        if username is not None:
            self._client.username_pw_set(username, password)
        if context is not None:
            self._client.tls_set_context(context)
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        if resubscribe:
            self._client.on_connect = self._on_connect
            self._client.reconnect_delay_set(1, 2)
        self._subscribed = threading.Event()
        self._cond = threading.Condition()
        self._messages: list[Received] = []
        self._started = False

    def _subscribe(self) -> None:
        self._client.subscribe([(topic, self.qos) for topic in self.topics])

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        self._subscribe()

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, properties: Any) -> None:
        self._subscribed.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        arrived = Received(msg.topic, bytes(msg.payload), msg.qos, bool(msg.retain), time.monotonic(), time.time())
        with self._cond:
            self._messages.append(arrived)
            self._cond.notify_all()

    def start(self, timeout: float = 5.0) -> Self:
        """Connect, subscribe and wait for the SUBACK."""
        self._client.connect(self.host, self.port, keepalive=10)
        self._client.loop_start()
        self._started = True
        if not self.resubscribe:
            self._subscribe()
        if not self._subscribed.wait(timeout):
            self.close()
            raise TimeoutError(f"no SUBACK from {self.host}:{self.port} for {self.topics}")
        return self

    def close(self) -> None:
        """Disconnect and stop paho's thread (idempotent)."""
        if self._started:
            self._started = False
            self._client.disconnect()
            self._client.loop_stop()
        close_wakeup_pair(self._client)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def messages(self) -> list[Received]:
        """Everything received so far, in order."""
        with self._cond:
            return list(self._messages)


class Recorder(RecordingClient):
    """A ``RecordingClient`` that survives a broker restart, for the benchmarks."""

    def __init__(self, host: str, port: int, topics: str | Iterable[str], qos: int = 1) -> None:
        super().__init__(host, port, topics, qos, resubscribe=True, client_id="bench-rec")

    def wait_for(self, predicate: Callable[[Received], bool], timeout: float, start: int = 0) -> Received | None:
        """The first message from index ``start`` on satisfying ``predicate``; None after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for m in self._messages[start:]:
                    if predicate(m):
                        return m
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
