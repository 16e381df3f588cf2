"""Run a fleet of real modelfleet processes on loopback, for the benchmarks.

``Fleet`` is a context manager: central and every edge are subprocesses
(``sys.executable -m modelfleet ...``) with their own data and cache dirs under one
temp dir, stdout/stderr in log files there. Leaving the ``with`` block, normally or
by an exception or KeyboardInterrupt, stops every process (SIGTERM, then SIGKILL)
and, unless something failed or ``keep`` is set, removes the temp dir.

The processes are ``modelfleet up``'s (``modelfleet.up.children.Child``: PR_SET_PDEATHSIG
on Linux, so a benchmark killed with SIGKILL does not leave them behind; their own
session), with ``up``'s command lines and ready lines (``modelfleet.up.services``); this
module adds what only benchmarks and fault tests want: restarts on the same data, log
files per run, a command prefix, CPU times, and the HTTP calls they measure with.

Typical use::

    with Fleet(central_env={"MODELFLEET_ORIGIN__EGRESS_BYTES_S": "20000000"}) as fleet:
        fleet.start(edges=8)
        pushed = fleet.push("mlp", "v1", model_path)
        done = fleet.wait_complete("mlp", "v1")
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from modelfleet.up.children import Child, ChildError, modelfleet_command, raising_on_sigterm, stop_all, wait_ready
from modelfleet.up.services import CENTRAL_READY, EDGE_READY, central_args, edge_args, port_of

#: The accuracy guard's threshold for the random-weight benchmark MLP: its top-2 margins are
#: tiny, so INT8 flips about 1 % of its decisions, which the default (0.97 on the lower
#: confidence bound of agreement) may refuse. The benchmarks measure serving, not accuracy.
RANDOM_MODEL_THRESHOLD = 0.9

_POLL_S = 0.05  # ~20 Hz
_PUSH_BLOCK = 1024 * 1024
_TAIL_LINES = 40


#: How long a restarted central retries binding the ports it had.
RESTART_BIND_S = 20.0
_BIND_FAILED = re.compile(r"PORT_BINDING|[Ff]ailed to bind|[Aa]ddress already in use")


class FleetError(RuntimeError):
    """A process did not start, died, or a wait timed out; the message carries log tails."""


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_PUSH_BLOCK):
            h.update(block)
    return h.hexdigest()


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads) so far; None when it is gone (or off Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Proc(Child):
    """One started central or edge: its data dir, and its addresses once it printed its ready line."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        logs: tuple[Path, Path],
        env: Mapping[str, str],
        data_dir: Path,
        args: Sequence[str],
    ) -> None:
        super().__init__(name, argv, logs[0], env, stderr_path=logs[1])
        self.data_dir = data_dir
        #: The command-line arguments after ``-m modelfleet`` and the env overrides it got.
        self.args = list(args)
        self.env = dict(env)
        self.http_url = ""
        self.grpc_address = ""
        #: host:port of its KServe v2 gRPC inference service ("" when it is off).
        self.infer_grpc_address = ""

    @property
    def stdout_path(self) -> Path:
        """Where its stdout goes (its ready line)."""
        return self.log_path

    def tails(self) -> str:
        """The last lines of stdout and stderr, for error messages."""
        return (
            f"--- {self.name} (pid {self.pid}, rc {self.popen.returncode}) stdout {self.log_path}:\n"
            f"{self.tail(_TAIL_LINES) or '(empty)'}\n--- {self.name} stderr {self.stderr_path}:\n"
            f"{self.tail(_TAIL_LINES, stderr=True) or '(empty)'}"
        )


@dataclass(frozen=True)
class Completion:
    """When one edge reported a version complete."""

    node_id: str
    completed_at: float  # the edge's wall clock (time.time()), same host
    observed_at: float  # our wall clock when the poll saw it
    status: dict[str, Any]


@dataclass(frozen=True)
class Pushed:
    """A model pushed to central."""

    name: str
    version: str
    manifest: dict[str, Any]
    report: dict[str, Any]
    sha256: str
    size: int
    started_at: float  # wall clock before the request
    acked_at: float  # wall clock when the 201 arrived


class Fleet:
    """Central plus N edges as subprocesses; stop() always runs on leaving ``with``."""

    def __init__(
        self,
        *,
        root: Path | None = None,
        central_env: Mapping[str, str] | None = None,
        edge_env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
        keep: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self._root_parent = root
        self.central_env = without_default_broker(central_env or {})
        self.edge_env = without_default_broker(edge_env or {})
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.keep = keep
        self._log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.dir: Path | None = None
        self.central: Proc | None = None
        self.edges: dict[str, Proc] = {}
        self._client: httpx.Client | None = None
        self._failed = False

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> Self:
        if self._root_parent is not None:
            self._root_parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-", dir=self._root_parent))
        self._client = httpx.Client(timeout=httpx.Timeout(30.0, read=300.0))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is not None and not issubclass(exc_type, (KeyboardInterrupt, SystemExit)):  # not interruptions
                self._failed = True
                if not isinstance(exc, FleetError):  # a FleetError already carries the tails
                    self._log(self.tails())
        finally:
            self.stop()

    def _procs(self) -> list[Proc]:
        return [*self.edges.values(), *([self.central] if self.central else [])]

    def stop(self) -> None:
        """SIGTERM every process (edges first, so they can unregister), SIGKILL stragglers; idempotent."""
        try:
            self._terminate(list(self.edges.values()))
            if self.central is not None:
                self._terminate([self.central])
        finally:
            for p in self._procs():
                if p.alive():  # only if the wait was interrupted
                    p.kill()
            if self._client is not None:
                self._client.close()
                self._client = None
            if self.dir is not None:
                if self._failed or self.keep:
                    self._log(f"fleet files kept in {self.dir}")
                else:
                    shutil.rmtree(self.dir, ignore_errors=True)

    def _terminate(self, procs: list[Proc]) -> None:
        def killing(child: Child) -> None:
            self._log(f"{child.name} did not stop within {self.stop_timeout_s}s; killing it")

        stop_all(procs, self.stop_timeout_s, killing)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far by each live process; {} off Linux."""
        used = {p.name: process_cpu_s(p.pid) for p in self._procs()}
        return {name: seconds for name, seconds in used.items() if seconds is not None}

    def tails(self) -> str:
        """Log tails of every process."""
        return "\n".join(p.tails() for p in self._procs())

    def fail(self, message: str, procs: list[Proc] | None = None) -> FleetError:
        """A FleetError with log tails (all processes unless ``procs``), marking the fleet failed."""
        self._failed = True
        chosen = procs if procs is not None else self._procs()
        return FleetError(message + "\n" + "\n".join(p.tails() for p in chosen))

    # -- processes -----------------------------------------------------------

    @property
    def client(self) -> httpx.Client:
        """The HTTP client (only inside ``with``)."""
        if self._client is None:
            raise RuntimeError("use Fleet inside a with block")
        return self._client

    def _spawn(self, name: str, args: list[str], env_overrides: Mapping[str, str], data_dir: Path) -> Proc:
        """Start ``python -m modelfleet ARGS`` as ``name``; its output in ``logs/NAME.out``/``.err``,
        ``NAME.2.out``/``.err`` for its second run and so on."""
        assert self.dir is not None, "use Fleet inside a with block"
        logs = self.dir / "logs"
        runs = 1 + sum(1 for _ in logs.glob(f"{name}.*out"))
        log_name = name if runs == 1 else f"{name}.{runs}"
        argv = [*self._command_prefix(name), *modelfleet_command(args)]
        return Proc(name, argv, (logs / f"{log_name}.out", logs / f"{log_name}.err"), env_overrides, data_dir, args)

    def _command_prefix(self, name: str) -> list[str]:
        """What process ``name`` is started under (a subclass's ``nsenter …``); nothing here."""
        return []

    def _wait_ready(self, procs: list[Proc], pattern: re.Pattern[str]) -> None:
        """Wait for every process's ready line; fill in its addresses."""
        try:
            lines = wait_ready(procs, pattern, self.startup_timeout_s)
        except ChildError as exc:
            raise self.fail(str(exc), [p for p in procs if p is exc.child] or procs) from None
        for p, line in zip(procs, lines, strict=True):
            p.http_url, p.grpc_address = line["http"], line["grpc"]
            p.infer_grpc_address = line["infer_grpc"] or ""

    def start_central(self, *, http_port: int = 0, grpc_port: int = 0) -> Proc:
        """Start central (free ports unless given) with ``central_env``; returns once it printed
        its ready line. Started again (after ``kill_central``), it runs on the same data dir
        and its logs go to ``central.N.out``/``.err``."""
        assert self.dir is not None, "use Fleet inside a with block"
        if self.central is not None and self.central.alive():
            raise RuntimeError("central is running")
        data_dir = self.dir / "central"
        # A port central had before a restart may be held for a moment by another process's
        # outgoing connection (the kernel hands freed ports out again): try again for a while.
        deadline = time.monotonic() + (RESTART_BIND_S if http_port or grpc_port else 0.0)
        failed_before = self._failed
        while True:
            args = central_args(data_dir, http_port, grpc_port)
            self.central = self._spawn("central", args, self.central_env, data_dir)
            try:
                self._wait_ready([self.central], CENTRAL_READY)
                return self.central
            except FleetError as exc:
                if time.monotonic() > deadline or not _BIND_FAILED.search(str(exc)):
                    raise
                self._log(f"central could not bind its old ports yet; starting it again ({exc})"[:300])
                self._failed = failed_before  # a retry that binds is no failure of the fleet
                time.sleep(0.5)

    def kill_central(self) -> None:
        """SIGKILL central and reap it (for restart tests); a later ``start_central`` reuses its data dir."""
        if self.central is not None:
            self.central.kill()

    def central_ports(self) -> tuple[int, int]:
        """(http port, grpc port) of the current central, to start it again on the same ones."""
        assert self.central is not None, "start central first"
        return port_of(self.central.http_url), port_of(self.central.grpc_address)

    def start_edges(self, count: int, prefix: str = "e") -> list[Proc]:
        """Start ``count`` edges at once (own data and cache dirs), wait for all ready lines."""
        started = [
            self.start_edge(f"{prefix}{i}", wait_ready=False) for i in range(len(self.edges), len(self.edges) + count)
        ]
        self._wait_ready(started, EDGE_READY)
        return started

    def start(self, edges: int, registered_timeout_s: float = 30.0) -> None:
        """Central, then ``edges`` edges, then wait until central lists all of them."""
        self.start_central()
        self.start_edges(edges)
        self.wait_registered(registered_timeout_s)

    def _check_alive(self) -> None:
        dead = [p for p in self._procs() if not p.alive()]
        if dead:
            raise self.fail(f"process(es) died: {', '.join(p.name for p in dead)}", dead)

    # -- central -------------------------------------------------------------

    def _central_url(self, path: str) -> str:
        assert self.central is not None, "start central first"
        return self.central.http_url + path

    def nodes(self) -> list[dict[str, Any]]:
        """``GET /api/v1/nodes`` of central."""
        r = self.client.get(self._central_url("/api/v1/nodes"))
        r.raise_for_status()
        nodes: list[dict[str, Any]] = r.json()
        return nodes

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Wait until every started edge is in central's node list."""
        want = set(self.edges)
        deadline = time.monotonic() + timeout_s
        while True:
            self._check_alive()
            have = {n["node_id"] for n in self.nodes()}
            if want <= have:
                return
            if time.monotonic() > deadline:
                raise self.fail(f"edges not registered after {timeout_s}s: {sorted(want - have)}")
            time.sleep(_POLL_S)

    def push(self, name: str, version: str, path: Path) -> Pushed:
        """Stream ``path`` to central as a raw body; returns once the 201 arrived."""
        size = path.stat().st_size
        digest = sha256_of(path)

        def body() -> Iterator[bytes]:
            with path.open("rb") as f:
                while block := f.read(_PUSH_BLOCK):
                    yield block

        started = time.time()
        r = self.client.post(
            self._central_url(f"/api/v1/models/{name}/versions"),
            params={"version": version},
            content=body(),
            headers={"content-length": str(size), "content-type": "application/octet-stream"},
        )
        acked = time.time()
        if r.status_code != 201:
            raise self.fail(f"push of {name}:{version} answered {r.status_code}: {r.text[:500]}", [])
        doc = r.json()
        manifest = doc["manifest"]
        if manifest.get("sha256") not in (None, digest):
            raise self.fail(f"central's manifest sha256 {manifest.get('sha256')} != pushed file's {digest}", [])
        return Pushed(name, version, manifest, doc.get("report", {}), digest, size, started, acked)

    def membership(self) -> dict[str, Any]:
        """``GET /api/v1/membership`` of central (MQTT liveness of every known node)."""
        r = self.client.get(self._central_url("/api/v1/membership"))
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc

    def events(self, limit: int = 1000) -> list[dict[str, Any]]:
        """``GET /api/v1/events`` of central, oldest first."""
        r = self.client.get(self._central_url("/api/v1/events"), params={"limit": limit})
        r.raise_for_status()
        events: list[dict[str, Any]] = r.json()
        return events

    def stats(self) -> dict[str, Any]:
        """``GET /api/v1/stats`` of central (``origin.bytes_sent`` etc.)."""
        r = self.client.get(self._central_url("/api/v1/stats"))
        r.raise_for_status()
        stats: dict[str, Any] = r.json()
        return stats

    # -- edges ---------------------------------------------------------------

    def edge_status(self, node_id: str) -> dict[str, Any]:
        """``GET /api/v1/status`` of one edge."""
        r = self.client.get(self.edges[node_id].http_url + "/api/v1/status")
        r.raise_for_status()
        status: dict[str, Any] = r.json()
        return status

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Status of every edge."""
        return {node_id: self.edge_status(node_id) for node_id in self.edges}

    def wait_complete(self, name: str, version: str, timeout_s: float = 300.0) -> dict[str, Completion]:
        """Poll every edge (~20 Hz) until each reports ``name:version`` complete.

        An edge is not polled again once complete, so polling does not load the
        ones still working more than needed."""
        pending = set(self.edges)
        done: dict[str, Completion] = {}
        deadline = time.monotonic() + timeout_s
        last: dict[str, dict[str, Any]] = {}
        while pending:
            self._check_alive()
            for node_id in sorted(pending):
                status = self.edge_status(node_id)
                last[node_id] = status
                for v in status.get("versions", []):
                    if v.get("name") == name and v.get("version") == version and v.get("state") == "complete":
                        observed = time.time()
                        completed = float(v.get("completed_at") or observed)
                        done[node_id] = Completion(node_id, completed, observed, status)
                        pending.discard(node_id)
            if not pending:
                break
            if time.monotonic() > deadline:
                states = {
                    n: [(v["name"], v["version"], v["state"], v["chunks_present"], v["chunks_total"], v.get("error"))
                        for v in last.get(n, {}).get("versions", [])]
                    for n in sorted(pending)
                }  # fmt: skip
                raise self.fail(f"{name}:{version} not complete after {timeout_s}s on {sorted(pending)}: {states}")
            time.sleep(_POLL_S)
        return done

    # -- single edges, models, metrics (serving and warm-start benchmarks) ---------

    def start_edge(
        self,
        node_id: str,
        *,
        env: Mapping[str, str] | None = None,
        http_port: int = 0,
        wait_ready: bool = True,
    ) -> Proc:
        """Start one edge ``node_id`` with ``edge_env`` plus ``env``; its data and cache dirs
        are the ones ``start_edges`` would give it, so a stopped edge restarts on its own
        files. With ``wait_ready=False`` it returns right after the spawn (``started_at``)."""
        assert self.dir is not None and self.central is not None, "start central first"
        old = self.edges.get(node_id)
        if old is not None and old.alive():
            raise RuntimeError(f"edge {node_id} is running; stop_edge it first")
        data_dir = self.dir / "edges" / node_id
        args = edge_args(node_id, self._central_for_edge(), data_dir, http_port, 0)
        proc = self._spawn(node_id, args, {**self.edge_env, **(env or {})}, data_dir)
        self.edges[node_id] = proc
        if wait_ready:
            self.wait_ready_line(proc)
        return proc

    def _central_for_edge(self) -> str:
        """The ``--central`` of the next edge: central's gRPC address."""
        assert self.central is not None, "start central first"
        return self.central.grpc_address

    def wait_ready_line(self, proc: Proc) -> None:
        """Wait for an edge's ready line (fills in ``http_url`` and ``grpc_address``)."""
        self._wait_ready([proc], EDGE_READY)

    def stop_edge(self, node_id: str) -> int | None:
        """SIGTERM one edge (SIGKILL after ``stop_timeout_s``); returns its exit code."""
        proc = self.edges[node_id]
        self._terminate([proc])
        return proc.popen.returncode

    def push_files(
        self, name: str, version: str, path: Path, *, calibration: Path | None = None, keep_fp32: bool = False,
        threshold: float | None = None,
    ) -> Pushed:  # fmt: skip
        """Push as multipart (``file``, optional ``calibration``, ``keep_fp32``, the guard's
        ``threshold``); returns on the 201."""
        size = path.stat().st_size
        digest = sha256_of(path)
        with contextlib.ExitStack() as stack:
            files = {"file": (path.name, stack.enter_context(path.open("rb")), "application/octet-stream")}
            if calibration is not None:
                f = stack.enter_context(calibration.open("rb"))
                files["calibration"] = (calibration.name, f, "application/octet-stream")
            data = {"keep_fp32": "true"} if keep_fp32 else {}
            started = time.time()
            r = self.client.post(
                self._central_url(f"/api/v1/models/{name}/versions"),
                params={"version": version, **({"threshold": str(threshold)} if threshold is not None else {})},
                files=files,
                data=data,
            )
            acked = time.time()
        if r.status_code != 201:
            raise self.fail(f"push of {name}:{version} answered {r.status_code}: {r.text[:500]}", [])
        doc = r.json()
        return Pushed(name, version, doc["manifest"], doc.get("report", {}), digest, size, started, acked)

    def push_folder(
        self, name: str, version: str, folder: Path, *, eval_text: Path | None = None, activate: bool = True
    ) -> Pushed:
        """Push a folder as multipart: its ``model.onnx`` as ``file``, every other file (external
        data, a language model's tokenizer and config) as ``data``; returns on the 201.
        ``activate=False`` stores the version without serving it (for a rollout to start)."""
        graph = folder / "model.onnx"
        with contextlib.ExitStack() as stack:
            files: list[tuple[str, Any]] = [("file", ("model.onnx", stack.enter_context(graph.open("rb"))))]
            files += [("data", (p.name, stack.enter_context(p.open("rb"))))
                      for p in sorted(folder.iterdir()) if p.is_file() and p.name != "model.onnx"]  # fmt: skip
            if eval_text is not None:
                files.append(("eval", ("eval.txt", stack.enter_context(eval_text.open("rb")))))
            started = time.time()
            url = self._central_url(f"/api/v1/models/{name}/versions")
            params = {"version": version, **({} if activate else {"activate": "false"})}
            r = self.client.post(url, params=params, files=files)
            acked = time.time()
        if r.status_code != 201:
            raise self.fail(f"push of {name}:{version} answered {r.status_code}: {r.text[:500]}", [])
        doc = r.json()
        return Pushed(name, version, doc["manifest"], doc.get("report", {}), sha256_of(graph), graph.stat().st_size,
                      started, acked)  # fmt: skip

    def manifest(self, name: str, version: str, artifact: str | None = None) -> dict[str, Any]:
        """``GET /api/v1/models/{name}/versions/{version}`` of central (the served artifact by default)."""
        params = {"artifact": artifact} if artifact else None
        r = self.client.get(self._central_url(f"/api/v1/models/{name}/versions/{version}"), params=params)
        r.raise_for_status()
        doc: dict[str, Any] = r.json()
        return doc

    def model_ready(self, node_id: str, model: str) -> bool:
        """Whether ``GET /v2/models/{model}/ready`` of the edge answers 200."""
        try:
            r = self.client.get(f"{self.edges[node_id].http_url}/v2/models/{model}/ready", timeout=5.0)
        except httpx.TransportError:
            return False
        return r.status_code == 200

    def wait_model_ready(self, node_id: str, model: str, timeout_s: float = 300.0, poll_s: float = 0.01) -> float:
        """Poll until the edge serves ``model``; returns ``time.monotonic()`` of the first 200."""
        proc = self.edges[node_id]
        deadline = time.monotonic() + timeout_s
        while True:
            if self.model_ready(node_id, model):
                return time.monotonic()
            if not proc.alive():
                raise self.fail(f"{node_id} exited with {proc.popen.returncode} before {model} was ready", [proc])
            if time.monotonic() > deadline:
                raise self.fail(f"{model} not ready on {node_id} after {timeout_s}s", [proc])
            time.sleep(poll_s)

    def edge_metrics(self, node_id: str) -> str:
        """The edge's ``/metrics`` text (Prometheus)."""
        r = self.client.get(self.edges[node_id].http_url + "/metrics")
        r.raise_for_status()
        return r.text

    def model_file(self, node_id: str, name: str, version: str) -> Path:
        """Where an edge assembled a version: ``<version>/<artifact>/model.onnx`` of the artifact
        it completed last (its data files, if any, lie beside it)."""
        directory = self.edges[node_id].data_dir / "versions" / name / version
        markers = sorted(directory.glob("*/manifest.json"), key=lambda m: m.stat().st_mtime)
        return (markers[-1].parent if markers else directory / "fp32") / "model.onnx"

    def verify_files(self, name: str, version: str, sha256: str) -> dict[str, bool]:
        """node id → whether its assembled file hashes to ``sha256``."""
        result = {}
        for node_id in self.edges:
            path = self.model_file(node_id, name, version)
            result[node_id] = path.is_file() and sha256_of(path) == sha256
        return result


def sigterm_raises() -> contextlib.AbstractContextManager[None]:
    """Turn SIGTERM into SystemExit while inside, so ``finally`` blocks stop the fleet (main thread only)."""
    return raising_on_sigterm(lambda signum: SystemExit(128 + signum))


def write_result(path: Path, result: Mapping[str, Any]) -> int:
    """Write a benchmark's JSON to ``path`` (its folder made); the exit code: 1 when the run
    recorded errors, else 0 (a missed target is a figure, not an error)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result["errors"] else 0


# -- models ------------------------------------------------------------------

_WIDTHS = (2048, 1536, 1024, 768, 512, 384, 256, 192, 128, 96, 64)


def plan_mlp(target_bytes: int, width: int | None = None) -> tuple[int, int]:
    """(width, hidden_layers) of a float32 MLP of at least ``target_bytes``.

    Without ``width``: the widest layer that still gives at least two hidden layers,
    so the file is many similar layers (like a real model), not one huge one; among
    those, the widest that overshoots the target by at most 10%."""
    from modelfleet.zoo import mlp_bytes

    def layers_for(w: int) -> int:
        layers = 1
        while mlp_bytes(w, layers) < target_bytes:
            layers += 1
        return layers

    if width is None:
        fits = [w for w in _WIDTHS if mlp_bytes(w, 2) <= target_bytes] or [_WIDTHS[-1]]
        # The widest whose overshoot is at most 10%, else the one with the least overshoot.
        close = [w for w in fits if mlp_bytes(w, layers_for(w)) <= 1.10 * target_bytes]
        width = close[0] if close else min(fits, key=lambda w: mlp_bytes(w, layers_for(w)))
    return width, layers_for(width)


def model_cache_dir(path: Path | None) -> Path:
    """Where generated models are kept between runs."""
    return path if path is not None else Path(tempfile.gettempdir()) / "modelfleet-bench-models"


def cached_mlp(cache: Path, *, width: int, hidden_layers: int, seed: int = 0, head_seed: int = 0) -> Path:
    """A generated MLP, built once per (width, layers, seeds) and reused afterwards."""
    from modelfleet.zoo import build_mlp

    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"mlp-w{width}-l{hidden_layers}-s{seed}-h{head_seed}.onnx"
    if path.is_file():
        return path
    fd, tmp_name = tempfile.mkstemp(dir=cache, prefix=".build-", suffix=".onnx")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        build_mlp(tmp, width=width, hidden_layers=hidden_layers, seed=seed, head_seed=head_seed)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


#: Settings that say where a broker is (the current names, and the deprecated ones that still work).
_BROKER_KEYS = re.compile(r"MODELFLEET_(BROKER__(HOST|PORT)|MQTT__(HOST|PORT)|HEARTBEAT__BROKER_(HOST|PORT))\Z")
#: What turns MQTT off in central and in an edge (a key neither reads is ignored).
_MQTT_OFF = {"MODELFLEET_MQTT__ENABLED": "false", "MODELFLEET_HEARTBEAT__ENABLED": "false"}


def without_default_broker(env: Mapping[str, str]) -> dict[str, str]:
    """``env``, with MQTT off unless it names a broker.

    Without one, central and the edges would talk to whatever listens on the machine's
    127.0.0.1:1883, shared with every other fleet there: another fleet's retained
    ``offline`` for its ``e0`` would evict ours and reshuffle placement mid-run (and a
    machine without that broker would behave differently). A caller that wants MQTT starts
    its own broker and says where (``MODELFLEET_BROKER__PORT``...)."""
    if any(_BROKER_KEYS.match(key) for key in env):
        return dict(env)
    return {**_MQTT_OFF, **env}


def chunking_env(avg_kb: int) -> dict[str, str]:
    """Central's chunking bounds for an average of ``avg_kb`` KiB (min avg/4, max avg×4)."""
    avg = avg_kb * 1024
    return {
        "MODELFLEET_CHUNKING__AVG_BYTES": str(avg),
        "MODELFLEET_CHUNKING__MIN_BYTES": str(avg // 4),
        "MODELFLEET_CHUNKING__MAX_BYTES": str(avg * 4),
    }


def parse_env_pairs(pairs: list[str]) -> dict[str, str]:
    """``["K=V", ...]`` → dict; raises ValueError on a pair without ``=``."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        env[key] = value
    return env
