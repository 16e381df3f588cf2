"""A small MQTT recorder for the benchmarks, which start their private Mosquitto with
``modelfleet.up.mosquitto.MosquittoBroker(log=BENCH_LOG)``.

``Recorder`` subscribes to topic filters and keeps every message with its arrival time
(``time.monotonic()``), so a benchmark can time an event by when it reached a subscriber
rather than by polling.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Received:
    """One message and when it arrived."""

    topic: str
    payload: bytes
    at: float  # time.monotonic()
    wall: float  # time.time()

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)


class Recorder:
    """A paho subscriber recording every message on ``topics``; ``start`` returns after the SUBACK."""

    def __init__(self, host: str, port: int, topics: str | Iterable[str], qos: int = 1) -> None:
        self.host, self.port = host, port
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.qos = qos
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-rec-{uuid.uuid4().hex[:8]}")
        self._client.on_message = self._on_message
        self._client.on_connect = self._on_connect
        self._client.on_subscribe = self._on_subscribe
        self._client.reconnect_delay_set(1, 2)
        self._subscribed = threading.Event()
        self._cond = threading.Condition()
        self._messages: list[Received] = []
        self._started = False

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        # (re)subscribe on every connect: the recorder survives a broker restart
        client.subscribe([(t, self.qos) for t in self.topics])

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, codes: Any, properties: Any) -> None:
        self._subscribed.set()

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._cond:
            self._messages.append(Received(msg.topic, bytes(msg.payload), time.monotonic(), time.time()))
            self._cond.notify_all()

    def start(self, timeout: float = 5.0) -> Recorder:
        """Connect and subscribe; waits for the SUBACK."""
        self._client.connect(self.host, self.port, keepalive=10)
        self._client.loop_start()
        self._started = True
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
        for name in ("_sockpairR", "_sockpairW"):  # paho closes its wake-up pair only on GC
            sock = getattr(self._client, name, None)
            if sock is not None:
                sock.close()
                setattr(self._client, name, None)

    def __enter__(self) -> Recorder:
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
