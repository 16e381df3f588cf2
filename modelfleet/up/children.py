"""The fleet's processes: spawned with their output in log files, tied to our life
(``PR_SET_PDEATHSIG`` on Linux, so even a SIGKILLed ``modelfleet up`` or benchmark leaves
nothing behind), each in its own session (a Ctrl-C reaches us alone, and we then stop them
in order), and stopped with SIGTERM, then SIGKILL.

``modelfleet up``, the benchmarks' ``bench._fleet.Fleet``, the test brokers and the fault
tests all start their central, edges and Mosquitto through ``Child``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

from modelfleet.up.errors import UpError

__all__ = [
    "Child",
    "ChildError",
    "ChildGroup",
    "modelfleet_command",
    "raising_on_sigterm",
    "stop_all",
    "tied_to_parent",
    "wait_ready",
]

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
    """A child did not start, died, or did not get ready in time; ``child``: which one."""

    def __init__(self, message: str, child: Child | None = None) -> None:
        super().__init__(message)
        self.child = child


def tied_to_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when we die (None elsewhere).

    Linux sends it when the *thread* that spawned the child ends: spawn from the main
    thread, or from one that lives as long as the child should."""
    libc, parent_pid = _LIBC, os.getpid()
    if libc is None:
        return None

    def preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # we died before prctl took effect
            os._exit(1)

    return preexec


def modelfleet_command(args: Sequence[str]) -> list[str]:
    """``python -m modelfleet ARGS`` with this interpreter."""
    return [sys.executable, "-m", "modelfleet", *args]


class Child:
    """One running process; ``log_path`` holds its stdout, and its stderr too unless
    ``stderr_path`` is given."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        *,
        stderr_path: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.stderr_path = stderr_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as files:  # the child has its own descriptors; ours close now
            log = files.enter_context(log_path.open("wb"))
            err = files.enter_context(stderr_path.open("wb")) if stderr_path is not None else subprocess.STDOUT
            #: ``time.monotonic()`` and ``time.time()`` just before the spawn.
            self.started_at, self.started_wall = time.monotonic(), time.time()
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=err,
                env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                preexec_fn=tied_to_parent(),
            )

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def log_text(self) -> str:
        """Everything it wrote to ``log_path`` so far."""
        return _read(self.log_path)

    def tail(self, lines: int, stderr: bool = False) -> str:
        """The last ``lines`` lines of its output (of ``stderr_path`` with ``stderr``)."""
        path = self.stderr_path if stderr and self.stderr_path is not None else self.log_path
        return "\n".join(_read(path).splitlines()[-lines:])

    def last_line(self) -> str:
        """Its last non-empty output line (stderr first, when kept apart), for a one-line error."""
        for text in (self.tail(_TAIL_LINES, stderr=True), self.tail(_TAIL_LINES)):
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            if lines:
                return lines[-1]
        return "(no output)"

    def died(self, when: str = "") -> ChildError:
        """The error for this child having exited (``when``: "before it was ready", …): how, and its last words."""
        rc = self.popen.returncode
        when = f" {when}" if when else ""
        if rc is not None and rc < 0:  # a signal from outside: its output says nothing about why
            return ChildError(
                f"{self.name} was killed by {signal.Signals(-rc).name}{when} (log: {self.log_path})", self
            )
        return ChildError(f"{self.name} exited with {rc}{when}: {self.last_line()} (log: {self.log_path})", self)

    def wait_line(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """Wait until its output has a line matching ``pattern`` (a ready line)."""
        return wait_ready([self], pattern, timeout_s)[0]

    def send(self, sig: signal.Signals) -> None:
        """Send ``sig`` if it still runs (SIGSTOP and SIGCONT freeze and thaw it)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def stop(self, timeout_s: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; reaps the process."""
        stop_all([self], timeout_s)

    def kill(self) -> None:
        """SIGKILL (no goodbye, no clean-up: a crash) and reap."""
        self.send(signal.SIGKILL)
        self.popen.wait(timeout=10)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def wait_ready(children: Sequence[Child], pattern: re.Pattern[str], timeout_s: float) -> list[re.Match[str]]:
    """Wait until every child's output has a line matching ``pattern``; the matches, in order.
    ChildError for the first that exits first, or is not ready within ``timeout_s`` (all together)."""
    deadline = time.monotonic() + timeout_s
    found: dict[int, re.Match[str]] = {}
    while True:
        for i, child in enumerate(children):
            if i in found:
                continue
            match = pattern.search(child.log_text())
            if match:
                found[i] = match
            elif not child.alive():
                raise child.died("before it was ready")
        if len(found) == len(children):
            return [found[i] for i in range(len(children))]
        if time.monotonic() > deadline:
            late = next(c for i, c in enumerate(children) if i not in found)
            raise ChildError(f"{late.name} not ready after {timeout_s:.0f} s (log: {late.log_path})", late)
        time.sleep(_POLL_S)


def stop_all(children: Sequence[Child], timeout_s: float, on_timeout: Callable[[Child], None] | None = None) -> None:
    """SIGTERM every child at once, SIGKILL those still running after ``timeout_s``
    (``on_timeout`` told first); reaps them all. A frozen (SIGSTOPped) child is thawed, so
    it sees the SIGTERM."""
    for child in children:
        child.send(signal.SIGTERM)
        child.send(signal.SIGCONT)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if on_timeout is not None:
                on_timeout(child)
            child.kill()


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
        child = Child(name, argv, self.logs_dir / f"{name}.log", env)
        self.children.append(child)
        return child

    def spawn_modelfleet(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> Child:
        """Start ``python -m modelfleet ARGS`` with this interpreter."""
        return self.spawn(name, modelfleet_command(args), env)

    def dead(self) -> list[Child]:
        """Children that have exited."""
        return [c for c in self.children if not c.alive()]

    def stop(self) -> None:
        """Stop every child, newest first (idempotent); edges in parallel."""
        for batch in self._batches():
            stop_all(batch, self.stop_timeout_s)

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


@contextlib.contextmanager
def raising_on_sigterm(error: Callable[[int], BaseException]) -> Iterator[None]:
    """While inside, SIGTERM raises ``error(signum)`` (KeyboardInterrupt, SystemExit, …) in
    the main thread, so ``finally`` blocks stop the children as they do on Ctrl-C. Only in
    the main thread (signal handlers cannot be set elsewhere); restores the old handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise error(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
