"""Runs a paho-mqtt client on the asyncio loop instead of on a thread of its own.

Why: central's consumer receives one heartbeat per node per interval (10,000 a second
for a 10k fleet). With ``loop_start`` paho's thread does a ``select`` and four ``recv``
calls per message (command byte, length bytes, body), dropping the GIL at each one, and
every burst is handed to the loop thread: the two threads then spend more time trading
the GIL than parsing. Here the socket is watched by the loop (``add_reader``), reads go
through ``BufferedSocket`` (one ``recv`` serves hundreds of messages) and every callback
runs on the loop thread, so the tracker is called directly.

TLS: paho wraps the TCP socket in an ``ssl.SSLSocket`` before this module sees it, and
the buffer wraps that. OpenSSL may hold decrypted bytes that the kernel no longer
signals as readable, so ``pending()`` counts them and a wake-up that ends with bytes
still pending schedules another read itself instead of waiting on ``add_reader``.

This is paho's documented "external event loop" mode (``loop_read`` / ``loop_write`` /
``loop_misc`` with the ``on_socket_*`` callbacks). What ``loop_forever`` would otherwise
do — reconnecting with exponential backoff, here jittered (``fleetwire.backoff``) — is
``MqttLoopDriver._maintain``. The TCP connect runs in a worker thread (a broker that is
down must not stall the loop), so the socket callbacks may arrive from that thread; they
are marshalled onto the loop in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from tenacity import RetryCallState, retry_if_result

from fleetwire.backoff import retrying
from fleetwire.mqtt.rotation import BrokerRotation

log = logging.getLogger(__name__)

__all__ = ["BufferedClient", "BufferedSocket", "MqttLoopDriver"]

#: Bytes asked of the kernel per ``recv``: a few hundred heartbeats.
_READ_SIZE = 256 * 1024
#: Kernel reads per readiness callback (about 500 heartbeats each) before the loop gets
#: a turn for its other work (HTTP, gRPC, timers): paho's ``loop_read`` keeps reading as
#: long as bytes arrive, which under a steady 10k messages/s would be forever.
_READS_PER_WAKE = 4
#: Packets read per wake-up from a transport that is not a ``BufferedSocket`` (websockets).
_PACKETS_PER_WAKE = 64
#: How often keep-alive pings and ping timeouts are checked (``loop_misc``).
_MISC_EVERY_S = 1.0


def _log_reconnect(state: RetryCallState) -> None:
    log.debug("MQTT: connecting again in %.3fs", state.upcoming_sleep)


class BufferedSocket:
    """A connected socket whose ``recv`` serves paho's small reads from one large read.

    paho reads a packet as ``recv(1)`` for the command, ``recv(1)`` per length byte and
    ``recv(n)`` for the body. ``pending()`` is paho's own duck-typed hook (used for TLS)
    that tells it bytes are already buffered, so nothing waits in ``select`` on them.
    ``sock`` may be an ``ssl.SSLSocket`` (MQTT over TLS): then "no bytes yet" arrives as
    ``SSLWantReadError`` and OpenSSL's own decrypted buffer counts as pending too."""

    __slots__ = ("_area", "_buf", "_drained", "_end", "_pos", "_sock", "reads_left")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        # One preallocated area, refilled with recv_into: a fresh 256 KiB bytes object per
        # recv would be an mmap/munmap pair each time (above malloc's mmap threshold).
        self._area = bytearray(_READ_SIZE)
        self._buf = memoryview(self._area)
        self._pos = 0
        self._end = 0
        self._drained = False
        self.reads_left = 1 << 62
        """Kernel reads allowed until the next ``allow``; then reads say "would block"."""

    def allow(self, reads: int) -> None:
        """Start a new read budget (one readiness callback's worth)."""
        self.reads_left = reads
        self._drained = False

    def exhausted(self) -> bool:
        """Nothing buffered, and the kernel is either empty or off-limits until ``allow``."""
        return self._pos >= self._end and (self._drained or self.reads_left <= 0)

    def recv(self, bufsize: int) -> bytes:
        """Up to ``bufsize`` bytes; ``BlockingIOError`` when none are ready (or the read
        budget is spent: paho keeps a partial packet and resumes), ``b""`` at EOF."""
        if self._pos >= self._end:
            if self.reads_left <= 0:
                raise BlockingIOError
            self.reads_left -= 1
            try:
                got = self._sock.recv_into(self._buf)
            except BlockingIOError:
                self._drained = True
                raise
            except ssl.SSLWantReadError:  # TLS: no complete record yet
                self._drained = True
                raise BlockingIOError from None
            if not got:
                return b""
            self._pos, self._end = 0, got
        start = self._pos
        self._pos = min(start + bufsize, self._end)
        return bytes(self._buf[start : self._pos])

    def pending(self) -> int:
        """Bytes read that paho has not consumed yet: ours, plus (TLS) the decrypted
        bytes OpenSSL holds, which ``select``/``add_reader`` cannot see."""
        tls = self._sock.pending() if isinstance(self._sock, ssl.SSLSocket) else 0
        return self._end - self._pos + tls

    def send(self, data: bytes | bytearray) -> int:
        """Send straight through (writes are few: subscriptions, acks, events)."""
        return self._sock.send(data)

    def setblocking(self, flag: bool) -> None:
        """As ``socket.setblocking``."""
        self._sock.setblocking(flag)

    def fileno(self) -> int:
        """The socket's descriptor, for the loop's reader/writer registration."""
        return self._sock.fileno()

    def close(self) -> None:
        """Close the socket and drop what was buffered."""
        self._pos = self._end = 0
        self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class BufferedClient(mqtt.Client):
    """A paho client whose plain TCP sockets are ``BufferedSocket``s."""

    def _create_socket(self) -> Any:  # paho's transport hook (it wraps websockets the same way)
        sock = super()._create_socket()
        return BufferedSocket(sock) if isinstance(sock, socket.socket) else sock


class MqttLoopDriver:
    """Connects ``client`` and keeps it connected, driving all its I/O from ``loop``.

    ``connect_async`` must have been called on the client (it only stores the address);
    the first attempt happens in ``start``. The client's own ``reconnect_delay_set``
    values are not used; ``min_delay_s``/``max_delay_s`` are."""

    def __init__(
        self,
        client: mqtt.Client,
        loop: asyncio.AbstractEventLoop,
        *,
        min_delay_s: float,
        max_delay_s: float,
        on_connect_failed: Callable[[BaseException], None] | None = None,
        rotation: BrokerRotation | None = None,
    ) -> None:
        """``rotation``: several brokers; every attempt after a failed connect or a lost
        connection goes to the next one (after the same backoff wait)."""
        self._client = client
        self._rotation = rotation
        self._attempted = False
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._min_delay = min_delay_s
        self._max_delay = max_delay_s
        self._on_connect_failed = on_connect_failed
        self._fd: int | None = None
        self._lost = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._misc: asyncio.TimerHandle | None = None
        self.connack_seen = False
        """Set by the owner on a successful CONNACK: resets the backoff."""
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write

    def start(self) -> None:
        """Begin connecting (in the background); call on the loop's thread."""
        self._loop_thread = threading.get_ident()
        self._task = self._loop.create_task(self._maintain())

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Disconnect cleanly (queued packets are written first) and stop reconnecting."""
        self._stopping = True
        if self._fd is not None:
            self._client.disconnect()  # writes DISCONNECT, then paho closes the socket
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._lost.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._detach()
        sock = self._client.socket()
        if sock is not None:  # DISCONNECT could not be written in time (broker gone)
            sock.close()

    async def wait_published(self, info: mqtt.MQTTMessageInfo, timeout_s: float) -> bool:
        """Wait (without blocking the loop) until a QoS 1 publish is acknowledged; False when it
        was not (in time, or at all: paho's queue was full and it never left)."""
        if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:  # is_published() would raise ValueError
            return False
        deadline = self._loop.time() + timeout_s
        while not info.is_published():
            if self._loop.time() >= deadline or self._fd is None:
                return False
            await asyncio.sleep(0.01)
        return True

    # ----------------------------------------------------------------- connecting

    async def _maintain(self) -> None:
        """Connect, and connect again whenever the connection is lost, until stopped. The
        waits grow while no attempt gets a CONNACK; after a session that got one they start over."""
        again = retry_if_result(lambda _: not self._stopping)
        sessions = retrying(
            self._min_delay, self._max_delay, retry=again, after=self._restart_backoff, before_sleep=_log_reconnect
        )
        await sessions(self._session)

    async def _session(self) -> None:
        """One connection: connect, then wait until it is lost."""
        self._lost.clear()
        self.connack_seen = False
        if self._attempted and self._rotation is not None:
            self._rotation.move(self._client)  # the last one failed or was lost: try the next broker
        self._attempted = True
        try:
            await self._loop.run_in_executor(None, self._client.reconnect)
        except (OSError, ValueError) as exc:  # refused, unreachable, timed out, bad host
            if self._on_connect_failed is not None:
                self._on_connect_failed(exc)
        else:
            await self._lost.wait()

    def _restart_backoff(self, state: RetryCallState) -> None:
        """Runs before tenacity picks the wait: a session that got a CONNACK counts as the
        run's first attempt, so the wait after it is the shortest and the next ones grow again."""
        if self.connack_seen:
            state.attempt_number = 1

    # ----------------------------------------------------------------- socket callbacks

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` now when on the loop's thread, else queue it there (in order)."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._loop.call_soon_threadsafe(fn, *args)

    def _on_socket_open(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._on_loop(self._attach, sock.fileno())

    def _on_socket_close(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._on_loop(self._closed, sock.fileno())

    def _on_register_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._on_loop(self._want_write, sock.fileno())

    def _on_unregister_write(self, client: mqtt.Client, userdata: Any, sock: Any) -> None:
        self._on_loop(self._no_write, sock.fileno())

    def _attach(self, fd: int) -> None:
        self._fd = fd
        self._loop.add_reader(fd, self._readable)
        self._schedule_misc()

    def _closed(self, fd: int) -> None:
        if fd == self._fd:
            self._detach()
            self._lost.set()

    def _detach(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
        if self._misc is not None:
            self._misc.cancel()
            self._misc = None

    def _want_write(self, fd: int) -> None:
        if fd == self._fd:
            self._loop.add_writer(fd, self._writable)

    def _no_write(self, fd: int) -> None:
        if fd == self._fd:
            self._loop.remove_writer(fd)

    # ----------------------------------------------------------------- I/O

    def _readable(self) -> None:
        if self._fd is None:  # a read scheduled below, after the connection closed
            return
        client = self._client
        sock = client.socket()
        if not isinstance(sock, BufferedSocket):
            self._read_unbuffered(sock)
            return
        buffered: BufferedSocket = sock
        buffered.allow(_READS_PER_WAKE)
        while client.loop_read() == mqtt.MQTT_ERR_SUCCESS and client.socket() is buffered:
            if buffered.exhausted():
                # The loop calls again while the kernel holds more (level-triggered), but
                # not for bytes OpenSSL already decrypted: those need a read of our own.
                if buffered.pending():
                    self._loop.call_soon(self._readable)
                return

    def _read_unbuffered(self, sock: Any) -> None:
        """Another transport (websockets): packet by packet while it says more is pending."""
        client = self._client
        for _ in range(_PACKETS_PER_WAKE):
            if client.loop_read() != mqtt.MQTT_ERR_SUCCESS or client.socket() is not sock:
                return
            pending = getattr(sock, "pending", None)
            if pending is None or not pending():
                return
        self._loop.call_soon(self._readable)

    def _writable(self) -> None:
        self._client.loop_write()

    def _schedule_misc(self) -> None:
        self._misc = self._loop.call_later(_MISC_EVERY_S, self._tick)

    def _tick(self) -> None:
        self._misc = None
        if self._fd is not None and self._client.loop_misc() == mqtt.MQTT_ERR_SUCCESS and self._fd is not None:
            self._schedule_misc()
