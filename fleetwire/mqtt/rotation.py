"""Which broker of ``broker.hosts`` a client uses, and moving it to the next one.

paho knows one address: whatever ``connect_async`` stored last, which its ``reconnect()``
(central's driver, or paho's own thread on an edge) dials again. To fail over, the owner
calls ``move`` when a connect failed or a connection was lost, before the next attempt:
it stores the next address with ``connect_async`` (which only records it). The wait before
that attempt stays the caller's jittered backoff. The Last Will set with ``will_set`` goes
into every CONNECT, so it is registered with whichever broker accepts the client; the
birth is published from ``on_connect``, so it lands there too."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from fleetwire.mqtt.broker import BrokerSettings

if TYPE_CHECKING:  # the owner imports paho when it connects (an edge only after it serves)
    import paho.mqtt.client as mqtt

__all__ = ["BrokerRotation"]


class BrokerRotation:
    """The broker addresses in order and the one in use (thread-safe: paho's callbacks and
    the event loop both ask)."""

    def __init__(self, broker: BrokerSettings) -> None:
        self._broker = broker
        self._addresses = broker.addresses()
        self._index = 0
        self._lock = threading.Lock()
        self.moves = 0
        """How many times the client was sent to another address."""

    @property
    def current(self) -> tuple[str, int]:
        """``(host, port)`` of the broker in use (or being tried)."""
        with self._lock:
            return self._addresses[self._index]

    @property
    def url(self) -> str:
        """``mqtt(s)://host:port`` of the broker in use, for logs."""
        return self._broker.url_of(*self.current)

    def connect_async(self, client: mqtt.Client, keepalive: int) -> None:
        """Store the current address in ``client`` (nothing is dialled yet)."""
        host, port = self.current
        client.connect_async(host, port, keepalive=keepalive)

    def move(self, client: mqtt.Client) -> bool:
        """Point ``client`` at the next address, for its next (re)connect; False (and the client
        left alone) when there is only one. Call only while it has no connection."""
        with self._lock:
            if len(self._addresses) == 1:
                return False
            self._index = (self._index + 1) % len(self._addresses)
            host, port = self._addresses[self._index]
            self.moves += 1
        client.connect_async(host, port, keepalive=client.keepalive)
        return True
