"""The fleet's MQTT broker: Mosquitto when this machine has it, else the embedded
amqtt broker (``modelfleet.up.amqtt_broker``), each a child process of ``up``.

We always start a private broker with a config of our own rather than use one already
listening on 1883: the fleet publishes retained status topics, and a system broker is
nobody's scratch space."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from modelfleet.up.amqtt_broker import READY_LINE
from modelfleet.up.children import Child, ChildError, ChildGroup
from modelfleet.up.mosquitto import UP_LOG, MosquittoBroker, find_mosquitto
from modelfleet.up.ports import HOST, concrete
from modelfleet.up.secure import BrokerSecurity

__all__ = ["BrokerChoice", "RunningBroker", "find_mosquitto", "start_broker"]

BrokerChoice = Literal["auto", "mosquitto", "amqtt"]
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
            " does not offer: install it (apt-get install mosquitto, or scripts/ensure_apt.sh mosquitto)"
            + (" and drop --broker amqtt" if choice == "amqtt" else "")
        )
    if choice == "mosquitto" and binary is None:
        raise ChildError("--broker mosquitto, but no mosquitto binary on PATH or in /usr/sbin")
    port = concrete(port)
    if binary is not None:
        mosquitto = MosquittoBroker(port, HOST, binary, security=security, log=UP_LOG, directory=work_dir, group=group)
        child = mosquitto.start(timeout_s).child
        assert child is not None
    else:
        argv = [sys.executable, "-m", "modelfleet.up.amqtt_broker", "--host", HOST, "--port", str(port)]
        child = group.spawn("broker", argv)
        # its ready line, not a probe: amqtt logs an error for a connection without CONNECT
        child.wait_line(_AMQTT_READY, timeout_s)
    return RunningBroker("mosquitto" if binary is not None else "amqtt", HOST, port, child, security is not None)
