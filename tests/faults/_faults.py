"""Helpers of the fault suite (a module, not a conftest: a second ``conftest`` would shadow tests/conftest.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench._fleet import Fleet, sha256_of
from edge_node.cache.chunk_store import ChunkStore
from modelfleet.up.children import tied_to_parent
from support.brokers import MosquittoBroker

#: Central as a subprocess: 64 KiB chunks, no INT8 (random MLPs fail its guard).
CENTRAL_ENV = {
    "MODELFLEET_CHUNKING__AVG_BYTES": str(64 * 1024),
    "MODELFLEET_CHUNKING__MIN_BYTES": str(16 * 1024),
    "MODELFLEET_CHUNKING__MAX_BYTES": str(256 * 1024),
    "MODELFLEET_QUANTIZE__ENABLED": "false",
    "MODELFLEET_MQTT__ENABLED": "false",  # never the machine's default broker: tests must not see each other
}
EDGE_ENV = {
    "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
    "MODELFLEET_FETCH__BACKOFF_MAX_S": "0.5",
    "MODELFLEET_HEARTBEAT__ENABLED": "false",
}


def mqtt_envs(broker: MosquittoBroker, interval_s: float = 0.3) -> tuple[dict[str, str], dict[str, str]]:
    """(central env, edge env) additions for membership over ``broker``: heartbeats every
    ``interval_s``, reconnects within a second."""
    central = {"MODELFLEET_MQTT__ENABLED": "true", "MODELFLEET_BROKER__HOST": broker.host,
               "MODELFLEET_BROKER__PORT": str(broker.port), "MODELFLEET_BROKER__RECONNECT_MAX_S": "1.0"}  # fmt: skip
    edge = {"MODELFLEET_HEARTBEAT__ENABLED": "true", "MODELFLEET_BROKER__HOST": broker.host,
            "MODELFLEET_BROKER__PORT": str(broker.port), "MODELFLEET_HEARTBEAT__INTERVAL_S": str(interval_s),
            "MODELFLEET_BROKER__RECONNECT_MAX_S": "1.0"}  # fmt: skip
    return central, edge


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` (20 Hz) until it holds; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def version(fleet: Fleet, node: str, name: str, ver: str) -> dict[str, Any]:
    """The edge's progress entry of ``name:ver`` ({} while it has none)."""
    for entry in fleet.edge_status(node)["versions"]:
        if entry["name"] == name and entry["version"] == ver:
            return dict(entry)
    return {}


def sigkill_edge(fleet: Fleet, node: str) -> None:
    """SIGKILL one edge and reap it; ``fleet.start_edge(node)`` restarts it on the same dirs."""
    fleet.edges[node].kill()


def sigkill_edge_when(fleet: Fleet, node: str, found: Callable[[], Path | None], timeout: float, what: str) -> Path:
    """Poll ``found`` as fast as the disk allows and SIGKILL the edge the moment it returns a
    path (the edge is frozen first, so what the check saw is what the kill leaves); returns it."""
    proc = fleet.edges[node]
    deadline = time.monotonic() + timeout
    while (path := found()) is None:
        if time.monotonic() > deadline or not proc.alive():
            raise AssertionError(f"never saw {what} within {timeout}s")
        time.sleep(0.001)
    os.kill(proc.popen.pid, signal.SIGSTOP)
    sigkill_edge(fleet, node)
    return path


def assert_edge_files_sound(
    fleet: Fleet, node: str, name: str, ver: str, manifest: dict[str, Any], data_dir: Path | None = None
) -> None:
    """On a stopped edge: the assembled file hashes to the manifest, no temp file is left in
    the versions dir, and every chunk of the manifest is in the cache and passes its digest.
    ``data_dir``: where to look instead of the edge's data dir (e.g. a copy of it)."""
    data_dir = data_dir or fleet.edges[node].data_dir
    directory = data_dir / "versions" / name / ver / manifest.get("artifact", "fp32")
    assert sha256_of(directory / "model.onnx") == manifest["sha256"]
    for file in manifest.get("files", []):
        assert sha256_of(directory / file["path"]) == file["sha256"]
    versions = data_dir / "versions"
    temps = [p.name for p in versions.rglob("*") if p.name.startswith((".assemble-", ".manifest-", ".verified-"))]
    assert temps == []  # no half-written file that a later start could load
    digests = {c["digest"] for f in [manifest, *manifest.get("files", [])] for c in f["chunks"]}
    with ChunkStore(data_dir / "cache", size_limit=1 << 40, holder="fault-check") as store:
        corrupt_or_missing = [d for d in digests if store.get(d) is None]  # get() re-hashes, drops a bad one
    assert corrupt_or_missing == []


class SmallDisk:
    """A size-limited tmpfs mounted on ``path`` in a mount namespace of its own (``unshare -m``),
    held by a sleeping process: processes started under ``prefix`` (``nsenter``) see it, the rest
    of the machine sees the empty directory. Needs root (CI runs as root): without it the test
    fails with the reason, it never skips. ``host_path`` reads files through /proc (not SQLite
    databases: SQLite resolves the /proc link to the host's path; copy them out first)."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
        assert not missing, f"a disk-full test needs util-linux's {', '.join(missing)} on PATH"
        script = (
            f"mount -t tmpfs -o size={size_bytes} tmpfs {shlex.quote(str(path))} && echo mounted && exec sleep 3600"
        )
        self._holder = subprocess.Popen(  # util-linux unshare makes the new namespace's mounts private
            ["unshare", "-m", "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=tied_to_parent(),  # gone with the test process, even when it is SIGKILLed
        )  # fmt: skip
        assert self._holder.stdout is not None and self._holder.stderr is not None
        line = self._holder.stdout.readline()
        if line.strip() != b"mounted":
            self._holder.wait(timeout=5)
            why = self._holder.stderr.read().decode(errors="replace").strip()
            raise AssertionError(
                f"cannot mount a {size_bytes}-byte tmpfs in a private mount namespace (unshare -m; needs root"
                f" or CAP_SYS_ADMIN, which CI has): rc {self._holder.returncode}: {why}"
            )

    @property
    def prefix(self) -> list[str]:
        """Run a command in the namespace that sees the tmpfs."""
        return ["nsenter", "-t", str(self._holder.pid), "-m", "--"]

    def host_path(self, inside: Path) -> Path:
        """``inside`` (a path under ``path``) as this process can read it."""
        return Path(f"/proc/{self._holder.pid}/root{inside}")

    def resize(self, size_bytes: int) -> None:
        """Grow (or shrink) the tmpfs in place: what "freeing space" looks like to the edge."""
        remount = ["mount", "-o", f"remount,size={size_bytes}", str(self.path)]
        subprocess.run([*self.prefix, *remount], check=True, capture_output=True, timeout=10)

    def free_bytes(self) -> int:
        """Bytes left on the tmpfs."""
        done = subprocess.run([*self.prefix, "df", "-B1", "--output=avail", str(self.path)],
                              check=True, capture_output=True, timeout=10)  # fmt: skip
        return int(done.stdout.split()[-1])

    def copy_out(self, inside: Path, to: Path) -> Path:
        """Copy a directory off the tmpfs (plain files: SQLite databases included, closed first)."""
        shutil.copytree(self.host_path(inside), to)
        return to

    def close(self) -> None:
        """End the holder: the namespace and its tmpfs go with it."""
        if self._holder.poll() is None:
            self._holder.kill()
        self._holder.wait(timeout=10)
        for stream in (self._holder.stdout, self._holder.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PrefixedFleet(Fleet):
    """A ``Fleet`` whose processes named in ``prefixes`` start under a command prefix
    (``SmallDisk.prefix``)."""

    def __init__(self, *, prefixes: Mapping[str, list[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prefixes = dict(prefixes or {})

    def _command_prefix(self, name: str) -> list[str]:
        return self.prefixes.get(name, [])  # nsenter execs the program: the pid is the edge's


def infer(fleet: Fleet, node: str, model: str, width: int) -> dict[str, Any]:
    """One OIP v2 inference of a zero row on an edge (a ``build_mlp`` model of ``width``); its JSON answer."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": [0.0] * width}]}
    response = fleet.client.post(f"{fleet.edges[node].http_url}/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    return doc
