"""One timed edge start, for the warm-start benchmark: from just before the process is
spawned to the first ``GET /v2/models/{m}/ready`` answering 200, with its breakdown."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any

import httpx

from bench._fleet import Fleet, Proc
from modelfleet.up.ports import free_port

__all__ = ["median_of", "time_start"]

_POLL_S = 0.005


def _get_ok(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url).status_code == 200
    except httpx.TransportError:
        return False


def time_start(
    fleet: Fleet, node_id: str, model: str, timeout_s: float, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Start ``node_id`` (on its data dir; ``env`` added to the fleet's edge env) and time it
    to healthz, ready line, complete, serving; with its ``fetch`` and ``verification``
    counters from ``/api/v1/status`` (bytes fetched; model bytes re-hashed or trusted)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc: Proc = fleet.start_edge(node_id, env=env, http_port=port, wait_ready=False)
    t0 = proc.started_at
    marks: dict[str, float | None] = {"healthz_s": None, "ready_line_s": None, "ready_s": None}
    deadline = t0 + timeout_s
    with httpx.Client(timeout=httpx.Timeout(5.0, connect=1.0)) as client:
        while marks["ready_s"] is None:
            now = time.monotonic()
            if marks["healthz_s"] is None and _get_ok(client, base + "/healthz"):
                marks["healthz_s"] = time.monotonic() - t0
            if marks["ready_line_s"] is None and b" ready http=" in proc.stdout_path.read_bytes():
                marks["ready_line_s"] = time.monotonic() - t0
            if marks["healthz_s"] is not None and _get_ok(client, f"{base}/v2/models/{model}/ready"):
                marks["ready_s"] = time.monotonic() - t0
                break
            if not proc.alive():
                raise fleet.fail(f"{node_id} exited with {proc.popen.returncode} during start-up", [proc])
            if now > deadline:
                break
            time.sleep(_POLL_S)
        status: dict[str, Any] = {}
        if marks["healthz_s"] is not None:
            r = client.get(base + "/api/v1/status")
            if r.status_code == 200:
                status = r.json()
    fleet.wait_ready_line(proc)  # fills in the proc's addresses (the line is there by now)
    version: dict[str, Any] = next((v for v in status.get("versions", []) if v.get("name") == model), {})
    completed_at = version.get("completed_at")
    complete_s = float(completed_at) - proc.started_wall if completed_at else None
    return {
        **marks,
        "complete_s": complete_s,
        "load_s": marks["ready_s"] - complete_s if marks["ready_s"] is not None and complete_s is not None else None,
        "version_state": version.get("state"),
        "fetch": status.get("fetch", {}),
        "verification": status.get("verification", {}),
        "error": None if marks["ready_s"] is not None else f"{model} not ready after {timeout_s}s",
    }


def median_of(values: list[float | None]) -> float | None:
    """The median of the values that are not None (None if there are none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
