"""The fleet's processes: spawned with their output in a log file, tied to our life
(``PR_SET_PDEATHSIG`` on Linux, so even a SIGKILLed ``modelfleet up`` leaves nothing
behind), each in its own session (a Ctrl-C reaches ``up`` alone, which then stops them
in order), and stopped with SIGTERM, then SIGKILL."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from modelfleet.up.errors import UpError

__all__ = ["Child", "ChildError", "ChildGroup"]

_PR_SET_PDEATHSIG = 1
_POLL_S = 0.05
_TAIL_LINES = 15

# Loaded now, not in the child: between fork and exec nothing may import (another
# thread, such as rich's spinner, may hold a lock the child would wait on forever).
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover - a Linux without glibc
    _LIBC = None


class ChildError(UpError):
    """A child did not start, died, or did not get ready in time."""


def _tie_to_parent(parent_pid: int) -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGTERM the child when we die."""
    libc = _LIBC
    if libc is None:
        return None

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # we died before prctl took effect
            os._exit(1)

    return preexec


class Child:
    """One running process; ``log_path`` holds its stdout and stderr."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                preexec_fn=_tie_to_parent(os.getpid()),
            )

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def log_text(self) -> str:
        """Everything it wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def last_line(self) -> str:
        """Its last non-empty output line, for a one-line error."""
        lines = [line.strip() for line in self.log_text().splitlines()[-_TAIL_LINES:] if line.strip()]
        return lines[-1] if lines else "(no output)"

    def died(self, when: str = "") -> ChildError:
        """The error for this child having exited (``when``: "before it was ready", …): how, and its last words."""
        rc = self.popen.returncode
        when = f" {when}" if when else ""
        if rc is not None and rc < 0:  # a signal from outside: its output says nothing about why
            return ChildError(f"{self.name} was killed by {signal.Signals(-rc).name}{when} (log: {self.log_path})")
        return ChildError(f"{self.name} exited with {rc}{when}: {self.last_line()} (log: {self.log_path})")

    def wait_line(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """Wait until its output has a line matching ``pattern`` (a ready line)."""
        deadline = time.monotonic() + timeout_s
        while True:
            match = pattern.search(self.log_text())
            if match:
                return match
            if not self.alive():
                raise self.died("before it was ready")
            if time.monotonic() > deadline:
                raise ChildError(f"{self.name} not ready after {timeout_s:.0f} s (log: {self.log_path})")
            time.sleep(_POLL_S)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; reaps the process."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)


class ChildGroup:
    """Every child of one ``up`` run, stopped in reverse start order by ``stop()``.

    Reverse order stops edges before central and central before the broker, so edges
    can say goodbye and nobody first sees its upstream vanish."""

    def __init__(self, logs_dir: Path, stop_timeout_s: float = 10.0) -> None:
        self.logs_dir = logs_dir
        self.stop_timeout_s = stop_timeout_s
        self.children: list[Child] = []

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start ``argv`` as ``name``; its output goes to ``logs_dir/name.log``."""
        child = Child(name, argv, self.logs_dir / f"{name}.log", env or {})
        self.children.append(child)
        return child

    def spawn_modelfleet(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start ``python -m modelfleet ARGS`` with this interpreter."""
        return self.spawn(name, [sys.executable, "-m", "modelfleet", *args], env)

    def dead(self) -> list[Child]:
        """Children that have exited."""
        return [c for c in self.children if not c.alive()]

    def stop(self) -> None:
        """Stop every child, newest first (idempotent); edges in parallel."""
        for batch in self._batches():
            for child in batch:
                if child.alive():
                    with contextlib.suppress(ProcessLookupError):
                        child.popen.send_signal(signal.SIGTERM)
            for child in batch:
                child.stop(self.stop_timeout_s)

    def _batches(self) -> list[list[Child]]:
        """Newest first, children that share a name prefix (``edge-``) together."""
        batches: list[list[Child]] = []
        for child in reversed(self.children):
            kind = child.name.split("-", 1)[0]
            if batches and batches[-1][0].name.split("-", 1)[0] == kind:
                batches[-1].append(child)
            else:
                batches.append([child])
        return batches
