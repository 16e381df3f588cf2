"""One private Mosquitto process with a config of our own, for ``modelfleet up``, the
tests and the benchmarks: never a system broker on 1883, which is nobody's scratch space.

``MosquittoBroker`` writes ``mosquitto.conf`` (a loopback listener, no persistence, ``user``
set to ours so that as root it does not drop to a ``mosquitto`` user that may not exist)
into its directory (a temp dir unless given) and runs ``mosquitto -c`` as a ``Child``; it
waits until the listeners accept connections. Options:

- ``users`` (name → password) turns anonymous access off and writes a password file
  (hashed like ``mosquitto_passwd``, so that binary is not needed); ``acl`` adds an ACL file
  (text, or the path of one such as the shipped ``deploy/mosquitto/acl``); ``tls`` adds a
  second, TLS-only listener on ``tls_port``.
- ``security`` (``modelfleet up --secure``): the one listener is TLS-only, with its logins
  and ACL; readiness is a verified TLS handshake.
- ``log``: what it logs and where (``TEST_LOG``, ``BENCH_LOG``, ``UP_LOG``).
- ``group``: spawned into ``up``'s ``ChildGroup`` (log in its logs dir, stopped with it).

For fault tests: ``kill`` (SIGKILL), ``pause``/``resume`` (SIGSTOP/SIGCONT), ``restart``
(same port, empty: no persistence)."""

from __future__ import annotations

import contextlib
import functools
import getpass
import os
import shutil
import signal
import socket
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from modelfleet.up.children import Child, ChildError, ChildGroup
from modelfleet.up.ports import HOST, free_port
from modelfleet.up.secure import BrokerSecurity, mosquitto_password_hash

__all__ = [
    "BENCH_LOG",
    "TEST_LOG",
    "UP_LOG",
    "BrokerLog",
    "BrokerTls",
    "MosquittoBroker",
    "MosquittoNotFound",
    "find_mosquitto",
]

#: Where Debian and source installs put it, for a PATH without the sbin directories.
FALLBACK_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/usr/bin/mosquitto")
_POLL_S = 0.02


class MosquittoNotFound(ChildError):
    """No mosquitto binary on this machine."""


def find_mosquitto() -> str | None:
    """The mosquitto binary: ``$MOSQUITTO``, then PATH, then the usual sbin paths; else None."""
    env = os.environ.get("MOSQUITTO")
    if env and os.access(env, os.X_OK):
        return env
    return shutil.which("mosquitto") or next((p for p in FALLBACK_PATHS if os.access(p, os.X_OK)), None)


@dataclass(frozen=True)
class BrokerLog:
    """What Mosquitto logs, and where: its own ``mosquitto.log`` (``to_file``), or stdout,
    which is the process's output file."""

    types: tuple[str, ...] = ("all",)
    to_file: bool = True
    connection_messages: bool = True


#: Everything, in a file of its own: what a failing test shows.
TEST_LOG = BrokerLog()
#: Errors, warnings and notices (a benchmark connects thousands of clients).
BENCH_LOG = BrokerLog(("error", "warning", "notice"))
#: The same on stdout, into ``up``'s ``logs/broker.log``, without a line per connection.
UP_LOG = BrokerLog(("error", "warning", "notice"), to_file=False, connection_messages=False)


@dataclass(frozen=True)
class BrokerTls:
    """The broker's certificate for its TLS listener; ``require_certificate``: clients
    must show one signed by ``ca_file`` too."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    require_certificate: bool = False


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _handshakes(host: str, port: int, security: BrokerSecurity) -> bool:
    """A TLS handshake with the broker's certificate verified, closed with close_notify (a
    TCP probe, or a TLS one that just hangs up, leaves an OpenSSL error in its log)."""
    context = ssl.create_default_context(cafile=str(security.tls.ca_file))
    context.load_cert_chain(security.tls.cert_file, security.tls.key_file)
    try:
        with (
            socket.create_connection((host, port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,  # its own socket object: close it too
        ):
            with contextlib.suppress(OSError):
                tls.unwrap()
            return True
    except OSError:
        return False


class MosquittoBroker:
    """One mosquitto process on ``host:port`` (a free port unless given); ``restart()`` keeps the port."""

    def __init__(
        self,
        port: int | None = None,
        host: str = HOST,
        binary: str | None = None,
        *,
        users: Mapping[str, str] | None = None,
        acl: str | Path | None = None,
        tls: BrokerTls | None = None,
        security: BrokerSecurity | None = None,
        log: BrokerLog = TEST_LOG,
        directory: Path | None = None,
        group: ChildGroup | None = None,
    ) -> None:
        found = binary or find_mosquitto()
        if found is None:
            raise MosquittoNotFound(
                "mosquitto not found ($MOSQUITTO, PATH, /usr/sbin): install it with `apt-get install mosquitto`"
                " or run scripts/ensure_apt.sh mosquitto"
            )
        self.binary = found
        self.host = host
        self.port = port or free_port(host)
        self.users = dict(users) if users is not None else None
        self.acl = acl
        self.tls = tls
        self.tls_port = free_port(host) if tls is not None else None
        self.security = security
        self.log = log
        self.group = group
        self._own_dir = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix="mosquitto-")) if directory is None else directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf_path = self.dir / "mosquitto.conf"
        self.log_path = self.dir / "mosquitto.log"
        self.output_path = self.dir / "mosquitto.out"
        self.child: Child | None = None
        self._closed = False
        self._write_config()

    # -- config ------------------------------------------------------------------

    def _write_config(self) -> None:
        before: list[str] = []
        if self.security is None:
            listener = [*self._auth_lines(), *self._tls_lines()]
        else:  # TLS only, logins and the ACL; listener options follow their listener line
            before, listener = self.security.config_lines()
        lines = [*before, f"listener {self.port} {self.host}", *listener, "persistence false"]
        lines.append(f"log_dest file {self.log_path}" if self.log.to_file else "log_dest stdout")
        lines += [f"log_type {kind}" for kind in self.log.types]
        if self.log.connection_messages:
            lines.append("connection_messages true")
        lines += [
            "log_timestamp true",
            # as root mosquitto drops to user "mosquitto", which may not exist or may
            # not write our directory; naming ourselves keeps the current user
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
        if tls is None or self.users is None or self.acl is None:
            raise ValueError("localized needs a broker with users, an ACL and TLS")
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
            if old not in conf:
                raise ValueError(f"{old!r} not in the config")
            conf = conf.replace(old, new)
        active = [line for line in conf.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if [line for line in active if " /mosquitto/" in line]:
            raise ValueError(f"a container path is left: {active}")
        return conf

    # -- state -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``mqtt://host:port``, or ``mqtts://`` when the listener is TLS-only (``security``)."""
        return f"{'mqtts' if self.security is not None else 'mqtt'}://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """The process is alive."""
        return self.child is not None and self.child.alive()

    @property
    def pid(self) -> int | None:
        """The broker's pid while it runs."""
        return self.child.pid if self.child is not None and self.child.alive() else None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's log and of its stdout/stderr."""
        parts = []
        for path in (self.log_path, self.child.log_path if self.child is not None else self.output_path):
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []
            if text:
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no broker output)"

    # -- process -----------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> MosquittoBroker:
        """Spawn the broker and wait until its listeners accept connections."""
        if self._closed:
            raise ChildError("broker already closed")
        if self.running:
            return self
        argv = [self.binary, "-c", str(self.conf_path)]
        if self.group is not None:
            self.child = self.group.spawn("broker", argv)
        else:
            self.child = Child("broker", argv, self.output_path)
        try:
            self._wait_listening(self.child, timeout)
        except ChildError as exc:
            if self.group is not None:  # the group stops it, and counts it
                raise
            self.kill()
            raise ChildError(f"{exc}\n{self.log_tail()}", exc.child) from None
        return self

    def _probes(self) -> list[Callable[[], bool]]:
        security = self.security
        if security is not None:
            return [functools.partial(_handshakes, self.host, self.port, security)]
        ports = [self.port] if self.tls_port is None else [self.port, self.tls_port]
        return [functools.partial(_accepts, self.host, port) for port in ports]

    def _wait_listening(self, child: Child, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        probes = self._probes()
        while not all(probe() for probe in probes):
            if not child.alive():
                raise child.died(f"before listening on {self.host}:{self.port}")
            if time.monotonic() > deadline:
                raise ChildError(
                    f"broker not listening on {self.host}:{self.port} after {timeout:.0f} s (log: {child.log_path})",
                    child,
                )
            time.sleep(_POLL_S)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` (idempotent)."""
        if self.child is not None:
            self.child.stop(timeout)

    def kill(self) -> None:
        """SIGKILL: the broker vanishes without a goodbye (for fault tests)."""
        if self.child is not None:
            self.child.kill()

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets open but answers nothing (a hung broker)."""
        if self.child is not None:
            self.child.send(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        if self.child is not None:
            self.child.send(signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> MosquittoBroker:
        """Stop (if running) and start again on the same port."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop the broker and remove its temp dir (not a directory it was given)."""
        if self._closed:
            return
        self.stop()
        self._closed = True
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MosquittoBroker({self.host}:{self.port}, running={self.running})"
