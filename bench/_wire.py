"""A userspace wire between TAP devices: the delay (and loss) ``netem`` adds, for kernels without it.

``bench._netns`` makes each WAN link of such a kernel a pair of TAP devices, one in the site's
router namespace, one on the core bridge, shaped to the link's rate by ``tbf`` on both, and
hands their file descriptors to this process, which copies every frame from one to the other
``delay`` seconds after it left (dropping ``loss`` percent of them). Frames keep their order
(one FIFO per direction, a constant delay). The TAPs carry virtio-net headers with TSO, so
the kernel hands over TCP segments of up to 64 KiB, not 1500-byte frames: about 300 a second
per direction at 20 MB/s, cheap for Python. The devices exist while a descriptor is open, so
the link goes away with this process (it dies with its parent, PR_SET_PDEATHSIG).

Run as ``python -m bench._wire FD_A:FD_B:DELAY_S:LOSS_PCT ...`` with the descriptors inherited.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import random
import selectors
import signal
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["open_tap", "serve"]

_TUNSETIFF = 0x400454CA
_TUNSETOFFLOAD = 0x400454D0
_IFF_TAP, _IFF_NO_PI, _IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
_TUN_F_CSUM, _TUN_F_TSO4, _TUN_F_TSO6 = 0x01, 0x02, 0x04
_READ_BYTES = 1 << 17  # a 64 KiB GSO frame and its headers
_PR_SET_PDEATHSIG = 1


def open_tap(name: str) -> int:
    """Create TAP device ``name`` in the caller's namespace (it may be moved to another while
    open) with virtio-net headers and TSO offload; returns its descriptor (non-blocking)."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI | _IFF_VNET_HDR))
        fcntl.ioctl(fd, _TUNSETOFFLOAD, _TUN_F_CSUM | _TUN_F_TSO4 | _TUN_F_TSO6)
    except OSError:
        os.close(fd)
        raise
    os.set_blocking(fd, False)
    return fd


@dataclass
class _Direction:
    """Frames read from one TAP, waiting for their time to be written to the other."""

    out_fd: int
    delay_s: float
    loss: float
    queue: deque[tuple[float, bytes]] = field(default_factory=deque)


def serve(links: list[tuple[int, int, float, float]]) -> None:
    """Copy frames both ways over each ``(fd_a, fd_b, delay_s, loss_pct)`` until killed."""
    sel = selectors.DefaultSelector()
    directions = []
    for a, b, delay_s, loss_pct in links:
        for src, dst in ((a, b), (b, a)):
            d = _Direction(dst, delay_s, loss_pct / 100.0)
            directions.append(d)
            sel.register(src, selectors.EVENT_READ, d)
    rng = random.Random()
    while True:
        due = [d.queue[0][0] for d in directions if d.queue]
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        for key, _ in sel.select(timeout):
            d = key.data
            while True:
                try:
                    frame = os.read(key.fd, _READ_BYTES)
                except BlockingIOError:
                    break
                if not d.loss or rng.random() >= d.loss:
                    d.queue.append((time.monotonic() + d.delay_s, frame))
        now = time.monotonic()
        for d in directions:
            while d.queue and d.queue[0][0] <= now:
                with contextlib.suppress(BlockingIOError):  # the receiving stack is full: a drop
                    os.write(d.out_fd, d.queue.popleft()[1])


def main(argv: list[str]) -> int:
    """Parse ``FD_A:FD_B:DELAY_S:LOSS_PCT`` arguments, die with the parent, serve."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before prctl
        return 1
    with contextlib.suppress(OSError):
        os.nice(-10)  # the wire models a network, not a process competing for the CPU
    links = []
    for arg in argv:
        a, b, delay_s, loss_pct = arg.split(":")
        links.append((int(a), int(b), float(delay_s), float(loss_pct)))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(links)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
