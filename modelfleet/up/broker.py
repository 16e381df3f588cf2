"""The fleet's MQTT broker: Mosquitto when this machine has it, else the embedded
amqtt broker (``modelfleet.up.amqtt_broker``), each a child process of ``up``.

We always start a private broker with a config of our own rather than use one already
listening on 1883: the fleet publishes retained status topics, and a system broker is
nobody's scratch space."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shutil
import socket
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from modelfleet.up.amqtt_broker import READY_LINE
from modelfleet.up.children import Child, ChildError, ChildGroup
from modelfleet.up.ports import HOST, concrete
from modelfleet.up.secure import BrokerSecurity

__all__ = ["BrokerChoice", "RunningBroker", "find_mosquitto", "start_broker"]

BrokerChoice = Literal["auto", "mosquitto", "amqtt"]
_SBIN_PATHS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")
_POLL_S = 0.05
_AMQTT_READY = re.compile(rf"^{READY_LINE} ", re.M)


@dataclass(frozen=True)
class RunningBroker:
    """A started broker: which one, where, and its process."""

    kind: Literal["mosquitto", "amqtt"]
    host: str
    port: int
    child: Child
    tls: bool = False

    @property
    def address(self) -> str:
        """``host:port``, as the ``--broker`` options of central and edge take it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``mqtt://host:port``, or ``mqtts://`` for a TLS listener."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.address}"


def find_mosquitto() -> str | None:
    """The mosquitto binary on PATH or in the usual sbin directories, else None."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return next((p for p in _SBIN_PATHS if os.access(p, os.X_OK)), None)


def _mosquitto_config(path: Path, port: int, security: BrokerSecurity | None) -> Path:
    if security is None:
        lines = [f"listener {port} {HOST}", "allow_anonymous true"]
    else:  # TLS only, logins and the ACL; listener options follow their listener line
        global_lines, listener_lines = security.config_lines()
        lines = [*global_lines, f"listener {port} {HOST}", *listener_lines]
    lines += [
        "persistence false",
        "log_dest stdout",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "log_timestamp true",
        # as root mosquitto would drop to a "mosquitto" user that may not exist
        f"user {getpass.getuser()}",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


def _handshakes(port: int, security: BrokerSecurity) -> bool:
    """A TLS handshake with the broker's certificate verified, closed with close_notify (a
    TCP probe, or a TLS one that just hangs up, leaves an OpenSSL error in its log)."""
    context = ssl.create_default_context(cafile=str(security.tls.ca_file))
    context.load_cert_chain(security.tls.cert_file, security.tls.key_file)
    try:
        with (
            socket.create_connection((HOST, port), timeout=0.5) as raw,
            context.wrap_socket(raw, server_hostname=HOST) as tls,  # its own socket object: close it too
        ):
            with contextlib.suppress(OSError):
                tls.unwrap()
            return True
    except OSError:
        return False


def _wait_listening(child: Child, port: int, timeout_s: float, security: BrokerSecurity | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not (_accepts(port) if security is None else _handshakes(port, security)):
        if not child.alive():
            raise child.died(f"before listening on {HOST}:{port}")
        if time.monotonic() > deadline:
            raise ChildError(f"broker not listening on {HOST}:{port} after {timeout_s:.0f} s (log: {child.log_path})")
        time.sleep(_POLL_S)


def start_broker(
    group: ChildGroup,
    choice: BrokerChoice,
    port: int,
    work_dir: Path,
    timeout_s: float = 20.0,
    security: BrokerSecurity | None = None,
) -> RunningBroker:
    """Start the chosen broker on ``port`` (a free one if taken) and wait until it accepts
    TCP; with ``security``, Mosquitto with a TLS-only listener, logins and the ACL."""
    binary = find_mosquitto() if choice != "amqtt" else None
    if security is not None and binary is None:
        raise ChildError(
            "--secure needs Mosquitto (TLS listener, password file, ACL), which the embedded amqtt broker"
            " does not offer: install it (apt-get install mosquitto, or scripts/ensure_mosquitto.sh)"
            + (" and drop --broker amqtt" if choice == "amqtt" else "")
        )
    if choice == "mosquitto" and binary is None:
        raise ChildError("--broker mosquitto, but no mosquitto binary on PATH or in /usr/sbin")
    port = concrete(port)
    if binary is not None:
        conf = _mosquitto_config(work_dir / "mosquitto.conf", port, security)
        child = group.spawn("broker", [binary, "-c", str(conf)])
        _wait_listening(child, port, timeout_s, security)
    else:
        argv = [sys.executable, "-m", "modelfleet.up.amqtt_broker", "--host", HOST, "--port", str(port)]
        child = group.spawn("broker", argv)
        # its ready line, not a probe: amqtt logs an error for a connection without CONNECT
        child.wait_line(_AMQTT_READY, timeout_s)
    return RunningBroker("mosquitto" if binary is not None else "amqtt", HOST, port, child, security is not None)
