"""Helpers of the fault suite (a module, not a conftest: a second ``conftest`` would shadow tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._fleet import Fleet, sha256_of
from brokers import MosquittoBroker
from edge_node.cache.chunk_store import ChunkStore

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
    central = {"MODELFLEET_MQTT__ENABLED": "true", "MODELFLEET_MQTT__HOST": broker.host,
               "MODELFLEET_MQTT__PORT": str(broker.port), "MODELFLEET_MQTT__RECONNECT_MAX_S": "1.0"}  # fmt: skip
    edge = {"MODELFLEET_HEARTBEAT__ENABLED": "true", "MODELFLEET_HEARTBEAT__BROKER_HOST": broker.host,
            "MODELFLEET_HEARTBEAT__BROKER_PORT": str(broker.port), "MODELFLEET_HEARTBEAT__INTERVAL_S": str(interval_s),
            "MODELFLEET_HEARTBEAT__RECONNECT_MAX_S": "1.0"}  # fmt: skip
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
    proc = fleet.edges[node]
    proc.popen.kill()
    proc.popen.wait(timeout=10)
    proc.close_logs()


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


def assert_edge_files_sound(fleet: Fleet, node: str, name: str, ver: str, manifest: dict[str, Any]) -> None:
    """On a stopped edge: the assembled file hashes to the manifest, no temp file is left in
    the versions dir, and every chunk of the manifest is in the cache and passes its digest."""
    path = fleet.model_file(node, name, ver)
    assert sha256_of(path) == manifest["sha256"]
    versions = fleet.edges[node].data_dir / "versions"
    temps = [p.name for p in versions.rglob("*") if p.name.startswith((".assemble-", ".manifest-"))]
    assert temps == []  # no half-written file that a later start could load
    digests = {c["digest"] for c in manifest["chunks"]}
    with ChunkStore(fleet.edges[node].data_dir / "cache", size_limit=1 << 40, holder="fault-check") as store:
        corrupt_or_missing = [d for d in digests if store.get(d) is None]  # get() re-hashes, drops a bad one
    assert corrupt_or_missing == []


def infer(fleet: Fleet, node: str, model: str, width: int) -> dict[str, Any]:
    """One OIP v2 inference of a zero row on an edge (a ``build_mlp`` model of ``width``); its JSON answer."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, width], "data": [0.0] * width}]}
    response = fleet.client.post(f"{fleet.edges[node].http_url}/v2/models/{model}/infer", json=body)
    assert response.status_code == 200, response.text
    doc: dict[str, Any] = response.json()
    return doc
