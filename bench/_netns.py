"""Simulated sites on one machine: network namespaces, veth pairs and ``tc``, for the benchmarks.

``SiteTopology`` builds, as root, with ``ip`` and ``tc``::

    root ns ──mgmt veth (unshaped)──┐
                                    │
    host ns ─veth(LAN)─┐            │
    host ns ─veth(LAN)─┤ LAN bridge ┴ router ns ─veth(WAN)─ core bridge (core ns) ─ … other sites
                         (10.N.<i>.0/24)        (10.N.254.0/24)

* one *core* namespace holding an L2 bridge, the "internet" between sites;
* per site a *router* namespace (``ip_forward`` on): its WAN veth goes to the core bridge, its
  LAN bridge connects one namespace per host by veth; hosts route by default through it, and
  each router has a route to every other site's LAN through that site's router, so site↔site
  traffic crosses both sites' WAN links and traffic inside a site never leaves its LAN;
* shaping on both directions of every WAN link and every LAN link: ``tc netem`` with rate,
  delay, loss and a queue above the bandwidth-delay product. On a kernel without ``netem``
  (``shaping == "tbf+wire"``), ``tbf`` sets the rates and a WAN link with delay or loss is a
  pair of TAP devices joined by ``bench._wire``, a small process that holds each frame for the
  delay (LAN links get rates only); without TUN either, rates only (``delay_emulated`` False);
* a management veth from the caller's namespace into each site's LAN bridge, unshaped, so the
  benchmark's own HTTP calls (pushes, status polls) reach every host without crossing, or
  being counted on, a WAN link.

Nothing routes off the machine: the only addresses are ``10.N.*`` on our own veths, N
(201…250) picked free, under a lock file, for each topology. Interface names are
``mf<tag><role>`` (<= 15 chars), namespace names ``mfnb-<pid>-<tag>-<role>``; leaving the
``with`` block deletes them, and entering one first deletes namespaces of a run whose pid is
gone (a killed benchmark). ``wan_bytes(site)`` reads the real counters of a site's WAN veth.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from bench._wire import open_tap

__all__ = ["FAMILY", "Link", "NetnsError", "Site", "SiteTopology", "available", "delay_unavailable"]

#: Every namespace this module makes starts with this.
FAMILY = "mfnb-"
_NETNS_DIR = Path("/run/netns")
_OCTETS = range(201, 251)
_WAN_NET = 254  # 10.N.254.0/24: the core bridge's subnet
_MGMT_HOST = 250  # 10.N.<i>.250: the caller's end of site i's management link
_MTU_BYTES = 1514
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,30}\Z")


class NetnsError(RuntimeError):
    """An ``ip``/``tc`` command failed; the message names it and carries its stderr."""


@dataclass(frozen=True)
class Link:
    """One shaped link, the same in both directions."""

    rate_bytes_s: float
    """Cap per direction in bytes/s (1e6 = 8 mbit)."""
    delay_s: float = 0.0
    """One-way delay added per direction (netem; without it, WAN links only, by ``bench._wire``)."""
    loss_pct: float = 0.0
    """Random loss per direction in percent (as the delay; the wire drops whole TSO segments)."""


@dataclass(frozen=True)
class Site:
    """A site: its label, its hosts (one namespace each, names unique over the topology), its links."""

    name: str
    hosts: Sequence[str]
    wan: Link
    lan: Link = field(default_factory=lambda: Link(200e6))


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class _Probe:
    reason: str | None  # why no topology can be built here; None when it can
    shaping: str  # "netem", "tbf+wire" (no netem: delay in userspace) or "tbf" (rates only)
    no_delay: str | None = None  # why links get no delay or loss; None when they do


@functools.cache
def _probe() -> _Probe:
    if os.geteuid() != 0:
        return _Probe("network namespaces need root (run the benchmark as root)", "")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return _Probe(f"iproute2 tools not found: {', '.join(missing)}", "")
    ns = f"{FAMILY}{os.getpid()}-probe"
    made = _run(["ip", "netns", "add", ns], check=False)
    if made.returncode != 0:
        return _Probe(f"ip netns add refused: {made.stderr.strip()}", "")
    try:
        veth = _run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=False)
        if veth.returncode != 0:
            return _Probe(f"no veth pairs: {veth.stderr.strip()}", "")
        netem = _run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "rate", "1mbit", "delay", "1ms"],
                     check=False)  # fmt: skip
        if netem.returncode == 0:
            return _Probe(None, "netem")
        tbf = _run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "tbf", "rate", "1mbit", "burst", "64kb",
                    "limit", "1mb"], check=False)  # fmt: skip
        if tbf.returncode != 0:
            return _Probe(f"tc can shape no link: netem and tbf refused ({tbf.stderr.strip()})", "")
        try:
            os.close(open_tap(f"mfprobe{os.getpid() % 100000}"))
        except OSError as exc:
            return _Probe(None, "tbf", f"no netem qdisc in this kernel and no TUN ({exc}): rates only")
        return _Probe(None, "tbf+wire")
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def available() -> str | None:
    """None when a topology can be built here (root, ``ip netns``, veth, a rate-shaping qdisc),
    else the reason, for a skip message."""
    return _probe().reason


def delay_unavailable() -> str | None:
    """None when WAN links get delay and loss too (``netem``, or ``tbf`` and the userspace
    wire), else why not (rates still apply)."""
    return _probe().no_delay


def shaping() -> str:
    """How links are shaped here: ``netem``, ``tbf+wire`` or ``tbf`` (see the module doc)."""
    return _probe().shaping


def sweep_stale() -> list[str]:
    """Delete namespaces of our family whose creating process is gone; returns their names."""
    swept = []
    for entry in sorted(_NETNS_DIR.glob(f"{FAMILY}*")) if _NETNS_DIR.is_dir() else []:
        pid = entry.name[len(FAMILY) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _run(["ip", "netns", "del", entry.name], check=False)
            swept.append(entry.name)
    return swept


def _claim_octet() -> tuple[int, IO[str]]:
    """A free second octet N (no 10.N.* route here) and its held lock file."""
    routes = json.loads(_run(["ip", "-j", "route", "show", "table", "all"]).stdout or "[]")
    used = {int(m.group(1)) for r in routes if (m := re.match(r"10\.(\d+)\.", str(r.get("dst", ""))))}
    for octet in _OCTETS:
        if octet in used:
            continue
        lock = Path(tempfile.gettempdir(), f"modelfleet-netns-{octet}.lock").open("w")  # noqa: SIM115 (held)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return octet, lock
    raise NetnsError("no free 10.N.0.0/16 for a topology (N in 201..250)")


def _qdisc(link: Link, netem: bool) -> list[str]:
    """``tc qdisc`` arguments after ``root``: netem (rate, delay, loss, queue over 4 × BDP) or tbf."""
    bits = f"{round(link.rate_bytes_s * 8)}bit"
    if netem:
        bdp_packets = link.rate_bytes_s * max(2 * link.delay_s, 0.01) / _MTU_BYTES
        args = ["netem", "rate", bits, "limit", str(max(1000, round(4 * bdp_packets)))]
        if link.delay_s > 0:
            args += ["delay", f"{link.delay_s * 1e6:.0f}us"]
        if link.loss_pct > 0:
            args += ["loss", f"{link.loss_pct}%"]
        return args
    burst = max(128 * 1024, round(link.rate_bytes_s * 0.005))  # a GSO super-packet, or 5 ms at the rate
    limit = max(1024 * 1024, round(link.rate_bytes_s * 0.2))  # 200 ms of queue: TCP fills it, not drops
    return ["tbf", "rate", bits, "burst", str(burst), "limit", str(limit)]


class SiteTopology:
    """Sites in namespaces, built on ``__enter__``, removed on ``__exit__`` (see the module doc)."""

    def __init__(self, sites: Sequence[Site]) -> None:
        names = [s.name for s in sites]
        hosts = [h for s in sites for h in s.hosts]
        if not sites or len(set(names)) != len(names) or len(set(hosts)) != len(hosts):
            raise ValueError("sites need unique names and hosts unique over the topology")
        if len(sites) > 250 or any(len(s.hosts) > 200 for s in sites):
            raise ValueError("at most 250 sites of 200 hosts")
        if bad := [n for n in (*names, *hosts) if not _NAME.match(n)]:
            raise ValueError(f"site and host names must match {_NAME.pattern}: {bad}")
        self.sites = list(sites)
        self.tag = secrets.token_hex(2)
        self.octet = 0
        self._lock: IO[str] | None = None
        self._namespaces: list[str] = []
        self._site_of = {h: i for i, s in enumerate(sites) for h in s.hosts}
        #: ``netem``, ``tbf+wire`` or ``tbf``: how links are shaped here.
        self.shaping = shaping()
        #: Whether WAN links carry their delay and loss (else rates only).
        self.delay_emulated = delay_unavailable() is None
        self._wire: subprocess.Popen[bytes] | None = None
        self._wire_links: list[tuple[int, int, float, float]] = []
        self._wire_fds: list[int] = []

    # -- names ---------------------------------------------------------------

    def _ns(self, role: str) -> str:
        return f"{FAMILY}{os.getpid()}-{self.tag}-{role}"

    def _dev(self, role: str) -> str:
        return f"mf{self.tag}{role}"

    def _site_index(self, site: str) -> int:
        for i, s in enumerate(self.sites):
            if s.name == site:
                return i
        raise KeyError(f"no site {site!r}")

    def namespace(self, host: str) -> str:
        """The namespace of ``host``."""
        self._site_of[host]  # KeyError for an unknown host
        return self._ns(host)

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a process in ``host``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def address(self, host: str) -> str:
        """``host``'s IPv4 address (its LAN address; reachable from every host and the caller)."""
        i = self._site_of[host]
        return f"10.{self.octet}.{i}.{10 + list(self.sites[i].hosts).index(host)}"

    def site_of(self, host: str) -> str:
        """The site ``host`` is in."""
        return self.sites[self._site_of[host]].name

    def wan_bytes(self, site: str) -> tuple[int, int]:
        """(rx, tx) bytes so far on ``site``'s WAN interface (its router's end): rx came into the
        site, tx left it. Real interface counters, Ethernet headers included."""
        i = self._site_index(site)
        out = _run(["ip", "-n", self._ns(f"r{i}"), "-j", "-s", "link", "show", "dev", self._dev(f"w{i}")]).stdout
        stats = json.loads(out)[0]["stats64"]
        return int(stats["rx"]["bytes"]), int(stats["tx"]["bytes"])

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> Self:
        if (reason := available()) is not None:
            raise NetnsError(reason)
        sweep_stale()
        self.octet, self._lock = _claim_octet()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Delete every namespace (their veths go with them) and our ends of the management links
        (the kernel would remove them with their peers, but only later, asynchronously); idempotent."""
        if self._wire is not None:
            self._wire.terminate()
            self._wire.wait()
            self._wire = None
        self._close_wire_fds()
        if self._namespaces:
            for i in range(len(self.sites)):
                _run(["ip", "link", "del", self._dev(f"m{i}")], check=False)
        for ns in reversed(self._namespaces):
            _run(["ip", "netns", "del", ns], check=False)
        self._namespaces.clear()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def _add_ns(self, role: str) -> str:
        ns = self._ns(role)
        _run(["ip", "netns", "add", ns])
        self._namespaces.append(ns)
        # No IPv6: its router solicitations and MLD reports would add to the counters.
        for key in ("all", "default"):
            _run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"], check=False)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        return ns

    def _veth(self, a: str, ns_a: str | None, b: str, ns_b: str) -> None:
        """A veth pair a (in ns_a; None: the caller's) ↔ b (in ns_b), both up."""
        where_a = ["netns", ns_a] if ns_a else []
        _run(["ip", "link", "add", a, *where_a, "type", "veth", "peer", "name", b, "netns", ns_b])
        _run(["ip", *(["-n", ns_a] if ns_a else []), "link", "set", a, "up"])
        _run(["ip", "-n", ns_b, "link", "set", b, "up"])

    def _shape(self, ns: str, dev: str, link: Link) -> None:
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *_qdisc(link, self.shaping == "netem")])

    def _wan(self, i: int, link: Link, router: str, core: str) -> None:
        """Site i's WAN link: router's w<i> ↔ core's c<i>, a veth pair or, for a delay without
        netem, two TAPs the wire joins."""
        w, c = self._dev(f"w{i}"), self._dev(f"c{i}")
        if self.shaping != "tbf+wire" or (link.delay_s <= 0 and link.loss_pct <= 0):
            self._veth(w, router, c, core)
            return
        a = open_tap(w)
        self._wire_fds.append(a)
        b = open_tap(c)
        self._wire_fds.append(b)
        self._wire_links.append((a, b, link.delay_s, link.loss_pct))
        for dev, ns in ((w, router), (c, core)):
            _run(["ip", "link", "set", dev, "netns", ns])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])

    def _start_wire(self) -> None:
        """The process holding the TAPs' frames for their delay; our copies of the fds then close."""
        if not self._wire_links:
            return
        argv = [sys.executable, "-m", "bench._wire", *(f"{a}:{b}:{d!r}:{p!r}" for a, b, d, p in self._wire_links)]
        fds = list(self._wire_fds)
        root = Path(__file__).resolve().parent.parent
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        self._wire = subprocess.Popen(argv, pass_fds=fds, env=env)
        self._close_wire_fds()

    def _close_wire_fds(self) -> None:
        for fd in self._wire_fds:
            os.close(fd)
        self._wire_fds.clear()
        self._wire_links.clear()

    def _build(self) -> None:
        n = self.octet
        core, bridge = self._add_ns("core"), self._dev("core")
        _run(["ip", "-n", core, "link", "add", bridge, "type", "bridge"])
        _run(["ip", "-n", core, "link", "set", bridge, "up"])
        for i, site in enumerate(self.sites):
            router, lan_bridge = self._add_ns(f"r{i}"), self._dev(f"b{i}")
            _run(["ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1"])
            # WAN: router's w<i> ↔ core bridge port c<i>, shaped both ways.
            self._wan(i, site.wan, router, core)
            _run(["ip", "-n", core, "link", "set", self._dev(f"c{i}"), "master", bridge])
            _run(["ip", "-n", router, "addr", "add", f"10.{n}.{_WAN_NET}.{i + 1}/24", "dev", self._dev(f"w{i}")])
            self._shape(router, self._dev(f"w{i}"), site.wan)
            self._shape(core, self._dev(f"c{i}"), site.wan)
            _run(["ip", "-n", router, "link", "add", lan_bridge, "type", "bridge"])
            _run(["ip", "-n", router, "addr", "add", f"10.{n}.{i}.1/24", "dev", lan_bridge])
            _run(["ip", "-n", router, "link", "set", lan_bridge, "up"])
            for j, host in enumerate(site.hosts):
                ns, h_dev, l_dev = self._add_ns(host), self._dev(f"h{i}x{j}"), self._dev(f"l{i}x{j}")
                self._veth(h_dev, ns, l_dev, router)
                _run(["ip", "-n", router, "link", "set", l_dev, "master", lan_bridge])
                _run(["ip", "-n", ns, "addr", "add", f"10.{n}.{i}.{10 + j}/24", "dev", h_dev])
                _run(["ip", "-n", ns, "route", "add", "default", "via", f"10.{n}.{i}.1"])
                self._shape(ns, h_dev, site.lan)
                self._shape(router, l_dev, site.lan)
            # Management: the caller's m<i> ↔ LAN bridge port n<i>, unshaped.
            self._veth(self._dev(f"m{i}"), None, self._dev(f"n{i}"), router)
            _run(["ip", "-n", router, "link", "set", self._dev(f"n{i}"), "master", lan_bridge])
            _run(["ip", "addr", "add", f"10.{n}.{i}.{_MGMT_HOST}/24", "dev", self._dev(f"m{i}")])
        for i in range(len(self.sites)):
            for t in range(len(self.sites)):
                if t != i:
                    via = f"10.{n}.{_WAN_NET}.{t + 1}"
                    _run(["ip", "-n", self._ns(f"r{i}"), "route", "add", f"10.{n}.{t}.0/24", "via", via])
        self._start_wire()
