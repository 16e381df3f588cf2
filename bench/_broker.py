"""A private Mosquitto for the benchmarks, and a small MQTT recorder.

``Broker`` writes its own config into a temp dir (loopback listener on a free port,
anonymous, no persistence, log in the temp dir) and runs ``mosquitto -c``; it never
touches a system broker on 1883. ``Recorder`` subscribes to topic filters and keeps
every message with its arrival time (``time.monotonic()``), so a benchmark can time
an event by when it reached a subscriber rather than by polling.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

_FALLBACK_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/usr/bin/mosquitto")


class BrokerError(RuntimeError):
    """No mosquitto binary, or it did not come up (the message carries its log tail)."""


def find_mosquitto() -> str:
    """The mosquitto binary: ``$MOSQUITTO``, then PATH, then the usual sbin paths."""
    env = os.environ.get("MOSQUITTO")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("mosquitto")
    if found:
        return found
    for path in _FALLBACK_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise BrokerError("mosquitto not found (PATH, /usr/sbin): `apt-get install mosquitto`")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class Broker:
    """One mosquitto process on ``host:port`` (a free port unless given); ``restart`` keeps it."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self.binary = find_mosquitto()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-mosquitto-"))
        self.log_path = self.dir / "mosquitto.log"
        self._out_path = self.dir / "mosquitto.out"
        self._proc: subprocess.Popen[bytes] | None = None
        conf = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            "persistence false",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "connection_messages true",
            "log_timestamp true",
            f"user {getpass.getuser()}",  # as root it would otherwise drop to user "mosquitto"
        ]
        self.conf_path = self.dir / "mosquitto.conf"
        self.conf_path.write_text("\n".join(conf) + "\n")

    @property
    def running(self) -> bool:
        """The process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log and output."""
        parts = []
        for path in (self.log_path, self._out_path):
            if path.is_file():
                parts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(p for p in parts if p) or "(no broker output)"

    def start(self, timeout: float = 10.0) -> Broker:
        """Spawn the broker and wait until its port accepts TCP."""
        if self.running:
            return self
        with self._out_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [self.binary, "-c", str(self.conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                rc, self._proc = self._proc.returncode, None
                raise BrokerError(f"mosquitto exited with {rc} on {self.host}:{self.port}\n{self.log_tail()}")
            if _port_open(self.host, self.port):
                return self
            time.sleep(0.02)
        self.kill()
        raise BrokerError(f"mosquitto not listening on {self.host}:{self.port} after {timeout}s\n{self.log_tail()}")

    def _signal(self, sig: signal.Signals, wait: float = 5.0) -> bool:
        proc = self._proc
        if proc is None:
            return True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
                if sig != signal.SIGKILL:
                    proc.send_signal(signal.SIGCONT)
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return False
        self._proc = None
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL (idempotent)."""
        if not self._signal(signal.SIGTERM, timeout):
            self._signal(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL: gone without a goodbye."""
        self._signal(signal.SIGKILL)

    def restart(self, timeout: float = 10.0) -> Broker:
        """Stop if running, start again on the same port."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop and remove the temp dir."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


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
            raise BrokerError(f"no SUBACK from {self.host}:{self.port} for {self.topics}")
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
