"""A private Mosquitto broker per test, and a small synchronous subscriber.

``MosquittoBroker`` writes its own config into a temp dir (loopback listener on a free
port, anonymous, no persistence, log in the temp dir) and runs ``mosquitto -c``. It never
touches a system broker on 1883. No pytest here: the fixture lives in ``conftest.py``.

Options: ``users`` (name → password) turns anonymous access off and writes a Mosquitto
password file (hashed with ``modelfleet up --secure``'s ``mosquitto_password_hash``, so the
binary is not needed); ``acl`` adds an ACL file (text, or the path of one such as the
shipped ``deploy/mosquitto/acl``); ``tls`` adds a second, TLS-only listener on ``tls_port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from modelfleet.up.secure import mosquitto_password_hash

FALLBACK_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/usr/bin/mosquitto")


class MosquittoNotFound(RuntimeError):
    """No mosquitto binary on this machine."""


class BrokerStartError(RuntimeError):
    """The broker did not come up (the message carries its log tail)."""


def find_mosquitto() -> str:
    """The mosquitto binary: ``$MOSQUITTO``, then PATH, then the usual sbin paths."""
    env = os.environ.get("MOSQUITTO")
    if env and os.access(env, os.X_OK):
        return env
    found = shutil.which("mosquitto")
    if found:
        return found
    for path in FALLBACK_PATHS:
        if os.access(path, os.X_OK):
            return path
    raise MosquittoNotFound(
        "mosquitto not found (PATH, /usr/sbin): install it with `apt-get install mosquitto`"
        " or run scripts/ensure_mosquitto.sh"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class BrokerTls:
    """The broker's certificate for its TLS listener; ``require_certificate``: clients
    must show one signed by ``ca_file`` too."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    require_certificate: bool = False


def close_wakeup_pair(client: mqtt.Client) -> None:
    """Close the socket pair paho opens in ``loop_start`` (it closes it only on the next
    one, or on GC): call after ``loop_stop`` so a test leaves no open sockets behind."""
    for name in ("_sockpairR", "_sockpairW"):
        sock = getattr(client, name, None)
        if sock is not None:
            sock.close()
            setattr(client, name, None)


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class MosquittoBroker:
    """One mosquitto process on ``host:port``; ``restart()`` keeps the port."""

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        *,
        users: Mapping[str, str] | None = None,
        acl: str | Path | None = None,
        tls: BrokerTls | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.binary = binary or find_mosquitto()
        self.users = dict(users) if users is not None else None
        self.acl = acl
        self.tls = tls
        self.tls_port = free_port(host) if tls is not None else None
        self._tmp = tempfile.TemporaryDirectory(prefix="mosquitto-")
        self.dir = Path(self._tmp.name)
        self.conf_path = self.dir / "mosquitto.conf"
        self.log_path = self.dir / "mosquitto.log"
        self.output_path = self.dir / "mosquitto.out"
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        self._write_config()

    def _write_config(self) -> None:
        lines = [f"listener {self.port} {self.host}", *self._auth_lines(), *self._tls_lines()]
        lines += [
            "persistence false",
            f"log_dest file {self.log_path}",
            "log_type all",
            "connection_messages true",
            "log_timestamp true",
            # as root mosquitto drops to user "mosquitto", which may not exist or may
            # not write the temp dir; naming ourselves keeps the current user
            f"user {getpass.getuser()}",
        ]
        self.conf_path.write_text("\n".join(lines) + "\n")

    def _auth_lines(self) -> list[str]:
        lines = []
        if self.users is None:
            lines.append("allow_anonymous true")
        else:
            passwd = self.dir / "passwd"
            passwd.write_text("".join(f"{u}:{mosquitto_password_hash(p)}\n" for u, p in self.users.items()))
            passwd.chmod(0o600)
            lines += ["allow_anonymous false", f"password_file {passwd}"]
        if self.acl is not None:
            acl = self.dir / "acl"
            acl.write_text(self.acl.read_text() if isinstance(self.acl, Path) else self.acl)
            lines.append(f"acl_file {acl}")
        return lines

    def _tls_lines(self) -> list[str]:
        tls = self.tls
        if tls is None:
            return []
        return [  # listener options follow their listener line
            f"listener {self.tls_port} {self.host}",
            f"cafile {tls.ca_file}",
            f"certfile {tls.cert_file}",
            f"keyfile {tls.key_file}",
            f"require_certificate {'true' if tls.require_certificate else 'false'}",
        ]

    def use_config(self, text: str) -> MosquittoBroker:
        """Restart with ``text`` as the whole configuration (plus the ``user`` line that
        keeps the current user), e.g. a shipped file made local by ``localized``."""
        self.stop()
        self.conf_path.write_text(text + f"\nuser {getpass.getuser()}\n")
        return self.start()

    def localized(self, conf: str) -> str:
        """A deployment's broker config (``deploy/mosquitto/mosquitto.conf``, the Kubernetes
        ConfigMap) as this broker can run it: its fleet listener on ``tls_port`` with this
        broker's certificate, its loopback one on ``port``, this broker's password file and
        ACL. Nothing else changes; a container path left over fails."""
        tls = self.tls
        assert tls is not None and self.users is not None and self.acl is not None, "needs users, an ACL and TLS"
        swaps = {
            "listener 8883 0.0.0.0": f"listener {self.tls_port} {self.host}",
            "listener 1883 127.0.0.1": f"listener {self.port} {self.host}",
            "/mosquitto/auth/passwd": str(self.dir / "passwd"),
            "/mosquitto/config/acl": str(self.dir / "acl"),
            "/mosquitto/certs/ca.pem": str(tls.ca_file),
            "/mosquitto/certs/cert.pem": str(tls.cert_file),
            "/mosquitto/certs/key.pem": str(tls.key_file),
        }
        for old, new in swaps.items():
            assert old in conf, f"{old!r} not in the config"
            conf = conf.replace(old, new)
        active = [line for line in conf.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        assert not [line for line in active if " /mosquitto/" in line], f"a container path is left: {active}"
        return conf

    @property
    def url(self) -> str:
        """``mqtt://host:port``."""
        return f"mqtt://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """The process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker's pid while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log and stdout/stderr."""
        parts = []
        for path in (self.log_path, self.output_path):
            if path.is_file():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                if text:
                    parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no broker output)"

    def start(self, timeout: float = 10.0) -> MosquittoBroker:
        """Spawn the broker and wait until the port accepts TCP."""
        if self._closed:
            raise BrokerStartError("broker already closed")
        if self.running:
            return self
        with self.output_path.open("ab") as out:
            self._proc = subprocess.Popen(
                [self.binary, "-c", str(self.conf_path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a ^C in the test run does not hit it first
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                self._proc = None
                raise BrokerStartError(
                    f"mosquitto exited with {rc} during start-up on {self.host}:{self.port}\n{self.log_tail()}"
                )
            if _port_open(self.host, self.port) and (self.tls_port is None or _port_open(self.host, self.tls_port)):
                return self
            time.sleep(0.02)
        self._signal(signal.SIGKILL)
        raise BrokerStartError(
            f"mosquitto did not accept TCP on {self.host}:{self.port} within {timeout:.1f}s\n{self.log_tail()}"
        )

    def _signal(self, sig: signal.Signals, wait: float = 5.0) -> bool:
        proc = self._proc
        if proc is None:
            return True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
                if sig != signal.SIGKILL:
                    proc.send_signal(signal.SIGCONT)  # a paused broker must see the SIGTERM
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return False
        self._proc = None
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (idempotent)."""
        if not self._signal(signal.SIGTERM, timeout):
            self._signal(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL: the broker vanishes without a goodbye (for fault tests)."""
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets open but answers nothing (a hung broker)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> MosquittoBroker:
        """Stop (if running) and start again on the same port."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop the broker and remove its temp dir."""
        if self._closed:
            return
        self.stop()
        self._closed = True
        self._tmp.cleanup()

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MosquittoBroker({self.host}:{self.port}, running={self.running})"


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
        port: int | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        """``port`` and ``context``: another listener of the broker (its TLS one)."""
        self.broker = broker
        self.topics = [topics] if isinstance(topics, str) else list(topics)
        self.qos = qos
        self.port = broker.port if port is None else port
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-sub-{uuid.uuid4().hex[:8]}")
        if username is not None:
            self._client.username_pw_set(username, password)
        if context is not None:
            self._client.tls_set_context(context)
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
        self._client.connect(self.broker.host, self.port, keepalive=10)
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
    "BrokerStartError",
    "BrokerTls",
    "Login",
    "Message",
    "MosquittoBroker",
    "MosquittoNotFound",
    "Subscriber",
    "close_wakeup_pair",
    "collect",
    "connect_once",
    "find_mosquitto",
    "free_port",
    "mosquitto_password_hash",
    "retained",
    "takeover_closes_session",
    "wait_until",
]
