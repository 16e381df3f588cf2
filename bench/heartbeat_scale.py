"""Heartbeat scale: can central track N nodes heartbeating over MQTT, and does it
detect the ones that fall silent, on time and only those?

Usage: ``python -m bench.heartbeat_scale --nodes 10000 --rate 1 --json out.json
[--duration-s 60] [--silent-fraction 0.01] [--connections 4] [--sim-procs 2]
[--py-spy DIR]``

What runs (all on loopback, all real processes):

* a private Mosquitto (``modelfleet.up.mosquitto.MosquittoBroker``: listener on a free loopback port,
  ``allow_anonymous true``, ``persistence false``; this bench appends
  ``max_queued_messages 1000000``, ``max_queued_bytes 0`` and ``max_inflight_messages 0``
  so that the broker queues rather than drops QoS 0 heartbeats for a slow central; it
  never touches a system broker on 1883);
* central (``python -m modelfleet central``) with ``MODELFLEET_BROKER__HOST/PORT`` pointing
  at it, ``MODELFLEET_MQTT__DEFAULT_INTERVAL_S`` = 1/rate and
  ``MODELFLEET_EVENTS__KEPT`` = max(20000, 2 × nodes + 1000), so that the events
  endpoint still holds the deaths behind the N start-up ``node_alive`` events;
* ``--sim-procs`` simulator processes (``--connections`` raw-socket MQTT 3.1.1
  connections between them). Each node first publishes a retained birth (``NodeStatus``
  online, QoS 1, acknowledged), then a ``Heartbeat`` (QoS 0) every 1/rate seconds, phases
  spread evenly over the interval. Payloads are real ``Heartbeat`` JSON (load, two ready
  models, cache, addresses) precomputed per node; only ``seq`` and ``ts`` are patched in,
  as fixed-width, space-padded JSON numbers, so a packet is a join of five byte strings.

Timeline: births, wait until central has processed all of them, a warm-up of
max(1 s, 2 intervals) with every node beating, then the measured window of
``--duration-s``; at its middle a random ``--silent-fraction`` of the nodes stop
(no Last Will, just silence). Everyone else keeps beating until the window's end plus a
grace of 3.5 intervals, then central's events and states are read.

Figures: ``offered_per_s`` (heartbeats the simulator actually sent per second in the
window), ``processed_per_s`` (delta of central's ``heartbeats_processed`` counter from
``/api/v1/membership`` over the window), ``false_deaths`` (nodes central marked dead that
were never silenced), ``missed_deaths`` (silenced nodes without a ``node_dead`` by the end
of the grace), ``detect_p99_s`` (p99 over silenced nodes of their ``node_dead`` event's
ts minus the ts of their last heartbeat sent), ``central_cpu_percent``,
``simulator_cpu_percent``, ``broker_cpu_percent`` (of one core, over the window, from
/proc/<pid>/stat). Death events come from central's ``/api/v1/events`` (limit 10000)
merged with a subscription to the events topic.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import queue
import random
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import httpx

from bench._broker import Recorder
from bench._fleet import Fleet, parse_env_pairs, process_cpu_s, sigterm_raises, write_result
from fleetwire.mqtt.payloads import CacheInfo, Heartbeat, LoadInfo, ModelInfo, NodeStatus
from fleetwire.mqtt.topics import DEFAULT_PREFIX, Topics, partition_of
from modelfleet.up.children import tied_to_parent
from modelfleet.up.mosquitto import BENCH_LOG, MosquittoBroker

#: processed_ratio and the counts are fixed; detect_p99_s is 3.5 × the interval.
TARGET_PROCESSED_RATIO = 0.99
DETECT_FACTOR = 3.5
GRACE_FACTOR = 3.5
BROKER_EXTRA_CONF = "max_queued_messages 1000000\nmax_queued_bytes 0\nmax_inflight_messages 0\n"

_SEQ_WIDTH = 12  # digits of seq, space padded: fixed packet length
_TS_WIDTH = 13  # ms since the epoch: 13 digits until the year 2286
_BIRTH_CHUNK = 500  # births in flight per connection before waiting for their PUBACKs
_PING_EVERY_S = 15.0  # raw connections use keepalive 60
_KEEPALIVE_S = 60
_REPORT_EVERY_S = 0.2  # simulators print their sent total this often
#: After the births, wait at most this long for central to work off its backlog.
_CATCH_UP_TIMEOUT_S = 60.0


def targets_for(interval_s: float) -> dict[str, float]:
    """The targets at one heartbeat interval."""
    return {
        "processed_ratio": TARGET_PROCESSED_RATIO,
        "false_deaths": 0,
        "missed_deaths": 0,
        "detect_p99_s": round(DETECT_FACTOR * interval_s, 6),
    }


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# ----------------------------------------------------------------- raw MQTT 3.1.1


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _utf8(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("!H", len(b)) + b


def _packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + _varint(len(body)) + body


class RawConnection:
    """A minimal MQTT 3.1.1 publisher on a blocking socket: CONNECT, PUBLISH, PINGREQ."""

    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking without a timeout: recv(MSG_DONTWAIT) must not wait (with a timeout,
        # Python polls for readability first).
        self.sock.settimeout(None)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * 1024 * 1024)
        self._buf = b""
        self._next_pid = 1
        self.last_ping = time.monotonic()
        body = _utf8("MQTT") + bytes([4, 0x02]) + struct.pack("!H", _KEEPALIVE_S) + _utf8(client_id)
        self.sock.sendall(_packet(0x10, body))
        connack = self._read_packet()
        if connack[0] >> 4 != 2 or connack[-1] != 0:
            raise RuntimeError(f"CONNACK refused: {connack.hex()}")

    def _read_packet(self) -> bytes:
        """One whole packet (fixed header included), blocking."""
        while True:
            if len(self._buf) >= 2:
                length, mult, i = 0, 1, 1
                while i < len(self._buf):
                    byte = self._buf[i]
                    length += (byte & 0x7F) * mult
                    mult *= 128
                    i += 1
                    if not byte & 0x80:
                        if len(self._buf) >= i + length:
                            pkt, self._buf = self._buf[: i + length], self._buf[i + length :]
                            return pkt
                        break
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self._buf += chunk

    def publish_qos1_batch(self, items: list[tuple[bytes, bytes]], retain: bool) -> None:
        """Publish (topic, payload) pairs at QoS 1, ``_BIRTH_CHUNK`` in flight, wait for every PUBACK."""
        first = 0x32 | (0x01 if retain else 0)
        for start in range(0, len(items), _BIRTH_CHUNK):
            chunk = items[start : start + _BIRTH_CHUNK]
            out, want = [], set()
            for topic, payload in chunk:
                pid = self._next_pid
                self._next_pid = pid % 65535 + 1
                want.add(pid)
                out.append(_packet(first, _utf8(topic) + struct.pack("!H", pid) + payload))
            self.sock.sendall(b"".join(out))
            while want:
                pkt = self._read_packet()
                if pkt[0] >> 4 == 4:  # PUBACK
                    want.discard(struct.unpack("!H", pkt[2:4])[0])

    def ping_if_due(self, now: float) -> None:
        """PINGREQ every ``_PING_EVERY_S`` and drain whatever came back (PINGRESPs)."""
        if now - self.last_ping < _PING_EVERY_S:
            return
        self.last_ping = now
        self.sock.sendall(b"\xc0\x00")
        with contextlib.suppress(BlockingIOError, InterruptedError, TimeoutError):
            while self.sock.recv(65536, socket.MSG_DONTWAIT):
                pass

    def close(self) -> None:
        """DISCONNECT and close."""
        with contextlib.suppress(OSError):
            self.sock.sendall(b"\xe0\x00")
        self.sock.close()


def heartbeat_parts(
    topics: Topics, node_id: str, index: int, interval_s: float, bdseq: int
) -> tuple[bytes, bytes, bytes]:
    """(head, mid, tail) of a node's heartbeat PUBLISH: ``head + seq + mid + ts + tail``
    with seq/ts right-aligned in ``_SEQ_WIDTH``/``_TS_WIDTH`` characters."""
    hb = Heartbeat(
        node_id=node_id, bdseq=bdseq, seq=0, ts=0, interval_s=interval_s, state="online",
        load=LoadInfo(inflight=index % 4, queue_depth=index % 3, cpu_percent=12.5, rps=3.25, p50_ms=4.2, p99_ms=9.8),
        models=[
            ModelInfo(name="mlp", version="v3", state="ready"),
            ModelInfo(name="digits", version="v1", state="ready"),
        ],
        cache=CacheInfo(bytes=48_000_000 + index, capacity=1 << 30, hits=1000 + index, misses=17),
        grpc_address=f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:50051",
        http_address=f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}:8081",
    )  # fmt: skip
    js = hb.model_dump_json().encode()
    seq_key, ts_key = b'"seq":0,', b'"ts":0,'
    i_seq, i_ts = js.index(seq_key), js.index(ts_key)
    payload_head = js[: i_seq + len(seq_key) - 2]
    payload_mid = js[i_seq + len(seq_key) - 1 : i_ts + len(ts_key) - 2]
    payload_tail = js[i_ts + len(ts_key) - 1 :]
    topic = topics.node_heartbeat(node_id).encode()
    payload_len = len(payload_head) + _SEQ_WIDTH + len(payload_mid) + _TS_WIDTH + len(payload_tail)
    fixed = bytes([0x30]) + _varint(2 + len(topic) + payload_len) + _utf8(topic)
    return fixed + payload_head, payload_mid, payload_tail


def _check_template(head: bytes, mid: bytes, tail: bytes, node_id: str) -> None:
    """Parse one patched payload exactly as central does."""
    packet = head + b"%*d" % (_SEQ_WIDTH, 7) + mid + b"%*d" % (_TS_WIDTH, 1_700_000_000_123) + tail
    topic_len = struct.unpack("!H", packet[2:4])[0] if packet[1] < 128 else struct.unpack("!H", packet[3:5])[0]
    start = (4 if packet[1] < 128 else 5) + topic_len
    hb = Heartbeat.model_validate_json(packet[start:])
    if (hb.node_id, hb.seq, hb.ts) != (node_id, 7, 1_700_000_000_123):
        raise AssertionError(f"heartbeat template is wrong: {hb}")


# ----------------------------------------------------------------- simulator process


def _sim_main(config_path: Path) -> int:
    """One simulator process: births, then heartbeats until told to stop (stdin ``stop``)."""
    cfg = json.loads(config_path.read_text())
    base_topics = Topics(cfg["prefix"])
    partitions = int(cfg.get("partitions", 0))  # a replicated central's heartbeat partitions; 0: plain topics

    def topics_of(node_id: str) -> Topics:
        return base_topics if not partitions else base_topics.in_partition(partition_of(node_id, partitions))

    interval = float(cfg["interval_s"])
    node_ids: list[str] = cfg["node_ids"]
    indexes: list[int] = cfg["indexes"]
    phases: list[float] = cfg["phases"]
    silent_set = set(cfg["silent"])
    n = len(node_ids)
    conns = [RawConnection(cfg["host"], cfg["port"], f"{cfg['client_prefix']}-{c}") for c in range(cfg["connections"])]
    conn_of = [i % len(conns) for i in range(n)]
    bdseq = 1

    heads, mids, tails = [], [], []
    for node_id, index in zip(node_ids, indexes, strict=True):
        h, m, t = heartbeat_parts(topics_of(node_id), node_id, index, interval, bdseq)
        heads.append(h)
        mids.append(m)
        tails.append(t)
    _check_template(heads[0], mids[0], tails[0], node_ids[0])

    t_births = time.time()
    per_conn: list[list[tuple[bytes, bytes]]] = [[] for _ in conns]
    for i, node_id in enumerate(node_ids):
        birth = NodeStatus(state="online", bdseq=bdseq, ts=int(time.time() * 1000)).model_dump_json().encode()
        per_conn[conn_of[i]].append((topics_of(node_id).node_status(node_id).encode(), birth))
    for conn, items in zip(conns, per_conn, strict=True):
        conn.publish_qos1_batch(items, retain=True)
    births_s = time.time() - t_births
    print(f"births {n} {births_s:.3f}", flush=True)

    # Commands from the orchestrator: "go T silence_at end", "stop" (EOF = stop).
    window: list[float] = []
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            parts = line.split()
            if parts and parts[0] == "go":
                window[:] = [float(x) for x in parts[1:4]]
            elif parts and parts[0] == "stop":
                break
        stop.set()

    threading.Thread(target=read_stdin, name="stdin", daemon=True).start()

    order = sorted(range(n), key=lambda i: phases[i])
    o_phase = [phases[i] for i in order]
    o_head = [heads[i] for i in order]
    o_mid = [mids[i] for i in order]
    o_tail = [tails[i] for i in order]
    o_conn = [conn_of[i] for i in order]
    o_silent = [node_ids[i] in silent_set for i in order]
    o_ids = [node_ids[i] for i in order]
    seq = [0] * n
    last_ts: dict[str, int] = {}
    tick = min(0.005, interval / 20)
    base = time.time() + 0.01
    idx, k = 0, 0
    sent_total = sent_window = 0
    lags: list[float] = []
    cpu_t0: float | None = None
    cpu_t1: float | None = None
    wall_t0 = wall_t1 = 0.0
    last_report = 0.0
    seq_fmt = b"%" + str(_SEQ_WIDTH).encode() + b"d"
    ts_fmt = b"%" + str(_TS_WIDTH).encode() + b"d"
    while not stop.is_set():
        loop_start = now = time.time()
        win = window[:] if window else None
        if win is not None:
            if cpu_t0 is None and now >= win[0]:
                cpu_t0, wall_t0 = time.process_time(), now
            if cpu_t1 is None and now >= win[2]:
                cpu_t1, wall_t1 = time.process_time(), now
        silence_at = win[1] if win is not None else math.inf
        in_window = win is not None and win[0] <= now < win[2]
        ts_ms = int(now * 1000)
        ts_b = ts_fmt % ts_ms
        bufs: list[list[bytes]] = [[] for _ in conns]
        first_due: float | None = None
        count = 0
        while True:
            due = base + o_phase[idx] + k * interval
            if due > now:
                break
            if first_due is None:
                first_due = due
            if not (o_silent[idx] and due >= silence_at):
                b = bufs[o_conn[idx]]
                b.append(o_head[idx])
                b.append(seq_fmt % seq[idx])
                b.append(o_mid[idx])
                b.append(ts_b)
                b.append(o_tail[idx])
                seq[idx] += 1
                count += 1
                if o_silent[idx]:
                    last_ts[o_ids[idx]] = ts_ms
            idx += 1
            if idx == n:
                idx = 0
                k += 1
        for conn, b in zip(conns, bufs, strict=True):
            if b:
                conn.sock.sendall(b"".join(b))
        sent_total += count
        if in_window:
            sent_window += count
            if first_due is not None:
                lags.append(now - first_due)
        if now - last_report >= _REPORT_EVERY_S:
            last_report = now
            print(f"sent {sent_total} {now!r}", flush=True)
        mono = time.monotonic()
        for conn in conns:
            conn.ping_if_due(mono)
        next_due = base + o_phase[idx] + k * interval
        pause = max(next_due, loop_start + tick) - time.time()
        if pause > 0:
            time.sleep(min(pause, 0.05))
    for conn in conns:
        conn.close()
    if cpu_t0 is not None and cpu_t1 is None:
        cpu_t1, wall_t1 = time.process_time(), time.time()
    result = {
        "nodes": n,
        "connections": len(conns),
        "births_s": births_s,
        "sent_total": sent_total,
        "sent_window": sent_window,
        "cpu_window_s": (cpu_t1 - cpu_t0) if cpu_t0 is not None and cpu_t1 is not None else None,
        "wall_window_s": (wall_t1 - wall_t0) if cpu_t0 is not None else None,
        "cpu_total_s": time.process_time(),
        "lag_p99_ms": (percentile(lags, 99) or 0.0) * 1000,
        "lag_max_ms": max(lags, default=0.0) * 1000,
        "silent_last_ts": last_ts,
    }
    print("result " + json.dumps(result), flush=True)
    return 0


class SimProc:
    """A simulator subprocess with a line reader on its stdout."""

    def __init__(self, name: str, config: dict[str, Any], directory: Path) -> None:
        self.name = name
        config_path = directory / f"{name}.json"
        config_path.write_text(json.dumps(config))
        self.stderr_path = directory / f"{name}.err"
        self._stderr: IO[bytes] = self.stderr_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench.heartbeat_scale", "--sim", str(config_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=tied_to_parent(),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        #: (heartbeats sent so far, wall time) as last reported.
        self.sent: tuple[int, float] = (0, 0.0)
        self._pump_thread = threading.Thread(target=self._pump, name=f"{name}-stdout", daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line.startswith("sent "):
                _, count, at = line.split()
                self.sent = (int(count), float(at))
            else:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str, timeout_s: float) -> str:
        """The next stdout line starting with ``word``; raises with stderr on EOF/timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{self.name}: no {word!r} after {timeout_s}s\n{self.stderr_tail()}") from None
            if line is None:
                raise RuntimeError(f"{self.name} exited ({self.popen.poll()}) before {word!r}\n{self.stderr_tail()}")
            if line.startswith(word):
                return line[len(word) :].strip()

    def send(self, line: str) -> None:
        """A command line to the simulator (ignored once it exited)."""
        assert self.popen.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.popen.stdin.write(line + "\n")
            self.popen.stdin.flush()

    def stderr_tail(self) -> str:
        """The end of its stderr."""
        try:
            return self.stderr_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Close stdin (= stop), then terminate/kill stragglers."""
        with contextlib.suppress(OSError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)
        self._pump_thread.join(timeout=5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._stderr.close()


# ----------------------------------------------------------------- orchestration


class _Central:
    """REST helpers against central."""

    def __init__(self, client: httpx.Client, url: str) -> None:
        self.client = client
        self.url = url

    def membership(self, summary: bool = True) -> tuple[float, dict[str, Any]]:
        """(wall time at the middle of the request, body of GET /api/v1/membership);
        ``summary`` leaves out the 10k-entry node list (counters only)."""
        t0 = time.time()
        r = self.client.get(self.url + "/api/v1/membership", params={"summary": "true" if summary else "false"})
        t1 = time.time()
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        return (t0 + t1) / 2, body

    def events(self) -> list[dict[str, Any]]:
        """GET /api/v1/events with the largest limit the endpoint allows."""
        r = self.client.get(self.url + "/api/v1/events", params={"limit": 10_000})
        r.raise_for_status()
        events: list[dict[str, Any]] = r.json()
        return events


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


@contextlib.contextmanager
def _py_spy(pid: int, duration_s: float, out_dir: Path | None, log: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """Record central with py-spy (raw collapsed stacks, per thread) while inside."""
    info: dict[str, Any] = {}
    if out_dir is None:
        yield info
        return
    exe = Path(sys.executable).with_name("py-spy")
    if not exe.exists():
        found = shutil.which("py-spy")
        if found is None:
            log("py-spy not found; not profiling")
            yield info
            return
        exe = Path(found)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "central.pyspy.txt"
    p = subprocess.Popen(
        [str(exe), "record", "--pid", str(pid), "--duration", str(max(1, int(duration_s))), "--rate", "100",
         "--format", "raw", "--threads", "--nonblocking", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=(out_dir / "py-spy.err").open("wb"),
    )  # fmt: skip
    try:
        yield info
    finally:
        try:
            p.wait(timeout=duration_s + 30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if raw.exists():
            info.update(summarize_collapsed(raw.read_text()))
            info["raw"] = str(raw)


def summarize_collapsed(text: str, top: int = 20) -> dict[str, Any]:
    """Per-thread sample totals and the top self/inclusive frames of py-spy's raw output."""
    threads: dict[str, int] = {}
    self_counts: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        frames = stack.split(";")
        thread = frames[0]
        threads[thread] = threads.get(thread, 0) + count
        if len(frames) > 1:
            leaf = frames[-1]
            self_counts[leaf] = self_counts.get(leaf, 0) + count
        for f in set(frames[1:]):
            incl[f] = incl.get(f, 0) + count

    def ranked(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {
        "samples": total,
        "threads_pct": ranked(threads),
        "self_pct": ranked(self_counts),
        "inclusive_pct": ranked(incl),
    }


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole benchmark; returns the result dict."""
    interval = 1.0 / args.rate
    grace = GRACE_FACTOR * interval
    n = args.nodes
    topics = Topics(DEFAULT_PREFIX)
    rng = random.Random(args.seed)
    node_ids = [f"sim-{i:06d}" for i in range(n)]
    silent_count = min(n, round(n * args.silent_fraction)) if args.silent_fraction > 0 else 0
    if args.silent_fraction > 0:
        silent_count = max(1, silent_count)
    silent = set(rng.sample(node_ids, silent_count))
    sim_procs = max(1, min(args.sim_procs, args.connections, n))
    errors: list[str] = []

    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hb-scale-", dir=args.work_dir))
    broker = MosquittoBroker(log=BENCH_LOG)
    # Heartbeats are QoS 0: let the broker queue them for a slow central rather than drop
    # them (the default is 1000 messages per client); events to the recorder are QoS 1.
    with broker.conf_path.open("a") as conf:
        conf.write(BROKER_EXTRA_CONF)
    sims: list[SimProc] = []
    recorder: Recorder | None = None
    topic_events: list[dict[str, Any]] = []
    broker_drops = 0
    events_kept = max(20_000, 2 * n + 1000)
    central_env = {
        "MODELFLEET_BROKER__HOST": broker.host,
        "MODELFLEET_MQTT__DEFAULT_INTERVAL_S": repr(interval),
        "MODELFLEET_EVENTS__KEPT": str(events_kept),
        **parse_env_pairs(args.central_env),
    }
    if args.central_gc_threshold:
        # Experiment knob: a sitecustomize that sets central's GC thresholds at start-up.
        site = work / "site"
        site.mkdir()
        values = [int(x) for x in args.central_gc_threshold.split(",")]
        (site / "sitecustomize.py").write_text(f"import gc\ngc.set_threshold(*{values!r})\n")
        pythonpath = [str(site), str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
        central_env["PYTHONPATH"] = os.pathsep.join(p for p in pythonpath if p)
    failed = True
    try:
        broker.start()
        broker_pid = broker.pid  # for its CPU time
        central_env["MODELFLEET_BROKER__PORT"] = str(broker.port)
        recorder = Recorder(broker.host, broker.port, [topics.events, topics.central_status], qos=1).start()
        with Fleet(root=work, central_env=central_env, keep=args.keep, log=_stderr) as fleet:
            proc = fleet.start_central()
            central_pid = proc.popen.pid
            online = recorder.wait_for(
                lambda m: m.topic == topics.central_status and b'"online"' in m.payload, timeout=30
            )
            if online is None:
                raise fleet.fail("central did not publish online on the broker within 30 s")
            api = _Central(fleet.client, proc.http_url)

            # Simulators: nodes interleaved over processes, phases evenly over the interval.
            per_proc_conns = [args.connections // sim_procs + (1 if p < args.connections % sim_procs else 0)
                              for p in range(sim_procs)]  # fmt: skip
            for p in range(sim_procs):
                idxs = list(range(p, n, sim_procs))
                config = {
                    "host": broker.host, "port": broker.port, "prefix": topics.prefix, "interval_s": interval,
                    "connections": per_proc_conns[p], "client_prefix": f"bench-sim{p}",
                    "node_ids": [node_ids[i] for i in idxs], "indexes": idxs,
                    "phases": [interval * i / n for i in idxs],
                    "silent": sorted(node_ids[i] for i in idxs if node_ids[i] in silent),
                }  # fmt: skip
                sims.append(SimProc(f"sim{p}", config, work))
            t_spawn = time.time()
            births_s = [float(s.expect("births", 120).split()[1]) for s in sims]
            log(f"births acked by the broker in {time.time() - t_spawn:.2f}s (sim-side {max(births_s):.2f}s)")

            # Wait until central has processed every birth (heartbeats are already flowing).
            deadline = time.monotonic() + 120
            while True:
                _, body = api.membership()
                if body["counters"]["statuses_processed"] >= n:
                    break
                if time.monotonic() > deadline:
                    raise fleet.fail(f"central processed {body['counters']['statuses_processed']} of {n} births")
                time.sleep(0.5)
            t_births_done = time.time()
            log(f"central has all {n} births {t_births_done - t_spawn:.2f}s after the simulators started")

            # Heartbeats started right after the births: wait until central has worked off
            # what queued up meanwhile (backlog under half a second of traffic, twice).
            streak, backlog = 0, 0
            deadline = time.monotonic() + _CATCH_UP_TIMEOUT_S
            while streak < 2:
                _, body = api.membership()
                backlog = sum(s.sent[0] for s in sims) - body["counters"]["heartbeats_processed"]
                streak = streak + 1 if backlog <= 0.5 * n * args.rate else 0
                if time.monotonic() > deadline:
                    errors.append(f"central never caught up after the births (backlog {backlog} heartbeats)")
                    break
                if streak < 2:
                    time.sleep(1.0)
            t_caught_up = time.time()
            log(f"central caught up {t_caught_up - t_births_done:.1f}s later (backlog {backlog})")

            t_start = time.time() + max(1.0, 2 * interval)
            silence_at = t_start + args.duration_s / 2
            t_end = t_start + args.duration_s
            for s in sims:
                s.send(f"go {t_start!r} {silence_at!r} {t_end!r}")
            _sleep_until(t_start)
            c0_t, body0 = api.membership()
            cpu0 = process_cpu_s(central_pid)
            bcpu0 = process_cpu_s(broker_pid) if broker_pid else None
            c0 = body0["counters"]["heartbeats_processed"]
            log(f"measuring {args.duration_s:g}s: {n} nodes at {args.rate:g}/s, {len(silent)} go silent at the middle")
            with _py_spy(central_pid, args.duration_s - 1, args.py_spy, log) as profile:
                _sleep_until(t_end)
                c1_t, body1 = api.membership()
                cpu1 = process_cpu_s(central_pid)
                bcpu1 = process_cpu_s(broker_pid) if broker_pid else None
            c1 = body1["counters"]["heartbeats_processed"]

            _sleep_until(t_end + grace)
            rest_events = api.events()
            _, body_final = api.membership(summary=False)
            t_stop = time.time()  # events after this are the simulators stopping: not counted
            for s in sims:
                s.send("stop")
            results = [json.loads(s.expect("result", 60)) for s in sims]
            for s in sims:
                s.stop()
            # Drain: everything sent must eventually be counted (the broker must not drop).
            sent_total = sum(r["sent_total"] for r in results)
            drained_deadline = time.monotonic() + 10
            previous = -1
            while True:
                _, body_drained = api.membership()
                processed_all = body_drained["counters"]["heartbeats_processed"]
                if processed_all >= sent_total or processed_all == previous or time.monotonic() > drained_deadline:
                    break
                previous = processed_all
                time.sleep(0.5)
            if not proc.alive():
                errors.append("central died during the run")
        failed = False
    finally:
        for s in sims:
            with contextlib.suppress(Exception):
                s.stop()
        if recorder is not None:
            for m in recorder.messages:
                if m.topic == topics.events:
                    with contextlib.suppress(ValueError):
                        topic_events.append(m.json())
            recorder.close()
        broker_log = broker.log_tail()
        with contextlib.suppress(OSError):
            broker_drops = sum("dropped" in line for line in broker.log_path.read_text(errors="replace").splitlines())
        broker.close()
        if not failed and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"bench files kept in {work}", file=sys.stderr)

    # ---- figures
    window = c1_t - c0_t
    offered_window = sum(r["sent_window"] for r in results)
    offered_per_s = offered_window / args.duration_s
    processed_per_s = (c1 - c0) / window
    processed_ratio = processed_per_s / offered_per_s if offered_per_s else 0.0
    central_cpu = 100.0 * (cpu1 - cpu0) / window if cpu0 is not None and cpu1 is not None else None
    broker_cpu = 100.0 * (bcpu1 - bcpu0) / window if bcpu0 is not None and bcpu1 is not None else None
    sim_cpu = sum(100.0 * r["cpu_window_s"] / r["wall_window_s"] for r in results if r["cpu_window_s"] is not None)

    seen: set[tuple[Any, Any, Any]] = set()
    merged = []
    for e in [*rest_events, *topic_events]:
        if int(e.get("ts", 0)) > t_stop * 1000:
            continue
        key = (e.get("type"), e.get("node_id"), e.get("ts"))
        if key not in seen:
            seen.add(key)
            merged.append(e)
    deaths: dict[str, list[int]] = {}
    startup_false_dead: set[str] = set()
    suspects: set[str] = set()
    suspect_phases = {"before": 0, "window": 0, "grace": 0}
    for e in merged:
        if e.get("type") == "node_dead" and e.get("node_id"):
            if int(e["ts"]) < t_start * 1000:
                if e["node_id"] not in silent:
                    startup_false_dead.add(e["node_id"])
                continue
            deaths.setdefault(e["node_id"], []).append(int(e["ts"]))
        elif e.get("type") == "node_suspect" and e.get("node_id") and e["node_id"] not in silent:
            if e["ts"] >= t_start * 1000:
                suspects.add(e["node_id"])
            phase = "before" if e["ts"] < t_start * 1000 else "window" if e["ts"] < t_end * 1000 else "grace"
            suspect_phases[phase] += 1
    final_states = {v["node_id"]: v["state"] for v in body_final["nodes"]}
    false_dead = {nid for nid in deaths if nid not in silent} | {
        nid for nid, st in final_states.items() if st == "dead" and nid not in silent
    }
    last_ts: dict[str, int] = {}
    for r in results:
        last_ts.update(r["silent_last_ts"])
    detect: list[float] = []
    missed = []
    for nid in sorted(silent):
        last = last_ts.get(nid)
        dts = sorted(t for t in deaths.get(nid, []) if last is None or t >= last)
        if last is None or not dts:
            missed.append(nid)
            continue
        detect.append((dts[0] - last) / 1000.0)
    detect_p99 = percentile(detect, 99)
    targets = targets_for(interval)
    met = {
        "processed_ratio": processed_ratio >= targets["processed_ratio"],
        "false_deaths": len(false_dead) <= targets["false_deaths"],
        "missed_deaths": len(missed) <= targets["missed_deaths"],
        "detect_p99_s": detect_p99 is not None and detect_p99 <= targets["detect_p99_s"],
    }
    topic_alive = sum(1 for e in topic_events if e.get("type") == "node_alive")
    sim_lag_p99 = max((r["lag_p99_ms"] for r in results), default=0.0)
    return {
        "nodes": n,
        "rate_per_node_s": args.rate,
        "interval_s": interval,
        "duration_s": args.duration_s,
        "silent_fraction": args.silent_fraction,
        "silenced": len(silent),
        "connections": args.connections,
        "sim_procs": sim_procs,
        "cpu_count": os.cpu_count(),
        "offered_per_s": round(offered_per_s, 1),
        "expected_per_s": round(n * args.rate - len(silent) * args.rate / 2, 1),
        "processed_per_s": round(processed_per_s, 1),
        "processed_ratio": round(processed_ratio, 4),
        "false_deaths": len(false_dead),
        "false_death_ids": sorted(false_dead)[:20],
        "false_suspects": len(suspects),
        "startup_false_deaths": len(startup_false_dead),
        "births_to_caught_up_s": round(t_caught_up - t_births_done, 3),
        "false_suspect_events": suspect_phases,
        "missed_deaths": len(missed),
        "missed_death_ids": missed[:20],
        "detect_p50_s": percentile(detect, 50),
        "detect_p99_s": detect_p99,
        "detect_max_s": max(detect, default=None),
        "central_cpu_percent": None if central_cpu is None else round(central_cpu, 1),
        "simulator_cpu_percent": round(sim_cpu, 1),
        "broker_cpu_percent": None if broker_cpu is None else round(broker_cpu, 1),
        "sim_lag_p99_ms": round(sim_lag_p99, 2),
        "sim_lag_max_ms": round(max((r["lag_max_ms"] for r in results), default=0.0), 2),
        "births_s": round(max(births_s), 3),
        "births_to_central_s": round(t_births_done - t_spawn, 3),
        "heartbeats_sent_total": sent_total,
        "heartbeats_processed_total": processed_all,
        "heartbeats_lost": max(0, sent_total - processed_all),
        "broker_drop_log_lines": broker_drops,
        "central_gc_threshold": args.central_gc_threshold,
        "counters_final": body_drained["counters"],
        "events_kept": events_kept,
        "events_rest": len(rest_events),
        "events_topic": len(topic_events),
        "events_topic_node_alive": topic_alive,
        "central_env": central_env,
        "broker_extra_config": BROKER_EXTRA_CONF.strip().split("\n"),
        "profile": profile or None,
        "targets": targets,
        "met": met,
        "all_met": all(met.values()),
        "errors": errors,
        "broker_log_tail": broker_log[-500:] if errors else "",
    }


def _f(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def print_table(r: dict[str, Any]) -> None:
    """Figures against targets."""
    t, m = r["targets"], r["met"]

    def ok(key: str) -> str:
        return "met" if m[key] else "MISSED"

    p50, pmax = _f(r["detect_p50_s"], "{:.3f}"), _f(r["detect_max_s"], "{:.3f}")
    lag = f"lag p99 {r['sim_lag_p99_ms']:.1f} ms, max {r['sim_lag_max_ms']:.1f} ms"
    rows = [
        ("nodes", f"{r['nodes']}", f"{r['silenced']} silenced; {r['connections']} conns, {r['sim_procs']} procs", ""),
        ("offered_per_s", _f(r["offered_per_s"], "{:.1f}"), f"expected {r['expected_per_s']:.1f}", ""),
        (
            "processed_per_s",
            _f(r["processed_per_s"], "{:.1f}"),
            f"ratio {r['processed_ratio']:.4f} (>= {t['processed_ratio']})",
            ok("processed_ratio"),
        ),
        (
            "false_deaths",
            f"{r['false_deaths']}",
            f"target 0 (false suspects {r['false_suspects']})",
            ok("false_deaths"),
        ),
        ("missed_deaths", f"{r['missed_deaths']}", "target 0", ok("missed_deaths")),
        (
            "detect_p99_s",
            _f(r["detect_p99_s"], "{:.3f}"),
            f"target <= {t['detect_p99_s']:.3f} (p50 {p50}, max {pmax})",
            ok("detect_p99_s"),
        ),
        ("central_cpu_percent", _f(r["central_cpu_percent"], "{:.1f}"), f"of one core; {r['cpu_count']} here", ""),
        ("simulator_cpu_percent", _f(r["simulator_cpu_percent"], "{:.1f}"), lag, ""),
        ("broker_cpu_percent", _f(r["broker_cpu_percent"], "{:.1f}"), "", ""),
        ("heartbeats_lost", f"{r['heartbeats_lost']}", f"of {r['heartbeats_sent_total']} sent (10 s drain)", ""),
        (
            "startup_false_deaths",
            f"{r['startup_false_deaths']}",
            f"before the window; births->central {r['births_to_central_s']:.1f}s, "
            f"catch-up {r['births_to_caught_up_s']:.1f}s",
            "",
        ),
    ]
    print(f"heartbeat scale: {r['nodes']} nodes x {r['rate_per_node_s']:g}/s for {r['duration_s']:g}s")
    print(f"{'figure':<22} {'value':>10}  {'':<60} status")
    print("-" * 100)
    for name, value, note, status in rows:
        print(f"{name:<22} {value:>10}  {note:<60} {status}")
    print(f"all targets met: {r['all_met']}" + (f"; errors: {r['errors']}" if r["errors"] else ""))
    prof = r.get("profile")
    if prof and prof.get("samples"):
        print(f"central py-spy ({prof['samples']} samples): threads {prof['threads_pct']}")
        for frame, pct in prof["self_pct"][:12]:
            print(f"  self {pct:5.1f}%  {frame}")


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m bench.heartbeat_scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=1.0, help="heartbeats per node per second")
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--duration-s", type=float, default=60.0, help="measured window; silence at its middle")
    p.add_argument("--silent-fraction", type=float, default=0.01)
    p.add_argument("--connections", type=int, default=4, help="simulator MQTT connections in all")
    p.add_argument("--sim-procs", type=int, default=2, help="simulator processes (connections are split)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--central-env", action="append", default=[], metavar="K=V", help="extra env var for central")
    p.add_argument(
        "--central-gc-threshold",
        default=None,
        metavar="G0,G1,G2",
        help="experiment: gc.set_threshold() in central (via a sitecustomize on its PYTHONPATH)",
    )
    p.add_argument("--py-spy", type=Path, default=None, metavar="DIR", help="profile central over the window")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temp dir goes")
    p.add_argument("--keep", action="store_true", help="keep broker/central/simulator files")
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry point (``--sim CONFIG`` is the simulator child)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--sim":
        return _sim_main(Path(argv[1]))
    args = build_parser().parse_args(argv)
    if args.nodes < 1 or args.rate <= 0 or args.duration_s <= 0 or args.connections < 1 or args.sim_procs < 1:
        print("--nodes, --rate, --duration-s, --connections and --sim-procs must be positive", file=sys.stderr)
        return 2
    if not 0 <= args.silent_fraction < 1:
        print("--silent-fraction must be in [0, 1)", file=sys.stderr)
        return 2
    with sigterm_raises():
        result = run(args)
    print_table(result)
    return write_result(args.json, result)


if __name__ == "__main__":
    raise SystemExit(main())
