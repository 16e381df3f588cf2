"""The processes ``modelfleet up``, the benches and the tests share: children that stop on
SIGTERM even when frozen, ready lines waited for together, and the one Mosquitto starter."""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import pytest

from modelfleet.up.broker import start_broker
from modelfleet.up.children import Child, ChildError, ChildGroup, wait_ready
from modelfleet.up.mosquitto import find_mosquitto

pytestmark = pytest.mark.fleet  # `modelfleet up`'s child processes

_READY = re.compile(r"^ready$", re.M)
#: Prints "ready", exits 3 on SIGTERM (as central and edges exit cleanly on it).
_SERVER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_a_frozen_child_is_thawed_so_that_it_stops_on_sigterm(tmp_path: Path) -> None:
    child = Child("server", [sys.executable, "-c", _SERVER], tmp_path / "server.log")
    child.wait_line(_READY, 30)
    child.popen.send_signal(signal.SIGSTOP)  # a frozen edge, as the failover bench leaves one

    child.stop(timeout_s=20)
    assert child.popen.returncode == 3  # its handler ran: not the SIGKILL after the timeout


def test_ready_lines_are_awaited_together_and_a_child_that_dies_is_named_with_its_last_words(
    tmp_path: Path,
) -> None:
    fine = Child("fine", [sys.executable, "-c", _SERVER], tmp_path / "fine.log")
    broken = Child(
        "broken",
        [sys.executable, "-c", "import sys; print('starting'); sys.exit('no such model dir')"],
        tmp_path / "broken.out",
        stderr_path=tmp_path / "broken.err",
    )
    with pytest.raises(ChildError, match=r"^broken exited with 1 before it was ready: no such model dir \(log: ") as e:
        wait_ready([fine, broken], _READY, 30)
    assert e.value.child is broken
    assert [m.group() for m in wait_ready([fine], _READY, 30)] == ["ready"]
    fine.stop(10)


def test_up_uses_the_mosquitto_that_MOSQUITTO_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_mosquitto()
    assert real is not None, "the tests need mosquitto: scripts/ensure_apt.sh mosquitto"
    marker = tmp_path / "wrapper-ran"
    wrapper = tmp_path / "my-mosquitto"
    wrapper.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("MOSQUITTO", str(wrapper))  # as scripts/ensure_apt.sh and the tests honour it

    group = ChildGroup(tmp_path / "logs")
    try:
        broker = start_broker(group, "mosquitto", 0, tmp_path / "broker")
        assert broker.kind == "mosquitto" and broker.child.alive()
        assert marker.exists()
    finally:
        group.stop()
