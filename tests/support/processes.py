"""Child processes that take a SIGINT as Ctrl-C, whatever state the test process is in."""

from __future__ import annotations

import signal

_STOPS = {signal.SIGINT, signal.SIGTERM}


def ctrl_c_able() -> None:
    """``preexec_fn``: the child starts with SIGINT and SIGTERM unblocked and at their default
    dispositions. A blocked or ignored signal is inherited through fork and exec, and Python
    installs no ``KeyboardInterrupt`` handler for an ignored SIGINT: a test process left in
    either state (by a library blocking signals around a spawn, or a shell's background job)
    would make the SIGINT a test sends as Ctrl-C do nothing. Seen once in a full run: the three
    ``up`` tests of one worker waited 60–90 s for an exit that never came, and passed alone."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
    for sig in _STOPS:
        signal.signal(sig, signal.SIG_DFL)
