"""The three measurements of ``bench.rollout``, each on a started fleet (see that module)."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench._fleet import Fleet, cached_mlp
from bench._rollout_api import (
    SwitchWatch,
    central_call,
    events_since,
    push_raw,
    settled_counters,
    wait_rollout,
    wait_until,
)
from bench.failover import oip_bodies

FLIP_MODEL = "mlp"
DRIFT_MODEL = "drift"


def _r(value: float | None, digits: int = 4) -> float | None:
    return round(value, digits) if value is not None else None


# -- part 1: staged rollout, flip at an instant ------------------------------------------


def measure_flip(fleet: Fleet, models: Path, *, width: int, lead_s: float, timeout_s: float) -> dict[str, Any]:
    """v1 everywhere, v2 staged everywhere, flipped at ``now + lead_s``; when each edge switched."""
    v1 = cached_mlp(models, width=width, hidden_layers=2, seed=0)
    v2 = cached_mlp(models, width=width, hidden_layers=2, seed=1)
    push_raw(fleet, FLIP_MODEL, "1", v1)
    nodes = sorted(fleet.edges)
    for node in nodes:
        fleet.wait_model_ready(node, FLIP_MODEL, timeout_s=timeout_s)
    push_raw(fleet, FLIP_MODEL, "2", v2, activate="false")
    clocks_known = wait_until(lambda: all(s.get("clock") for s in fleet.statuses().values()), timeout_s)
    started = central_call(fleet, "POST", f"/api/v1/models/{FLIP_MODEL}/rollouts", json={"version": "2", "stage": True})
    if started.status_code != 201:
        raise fleet.fail(f"staged rollout refused: {started.status_code} {started.text[:300]}", [])
    staging_started = time.time()
    staged = wait_rollout(
        fleet, FLIP_MODEL, "every node staged",
        lambda r: len(r["nodes"]) == len(nodes) and set(r["nodes"].values()) == {"staged"}, timeout_s,
    )  # fmt: skip
    staged_s = time.time() - staging_started
    clocks = {n: s.get("clock") for n, s in fleet.statuses().items()}
    instant = time.time() + lead_s
    at = datetime.fromtimestamp(instant, UTC).isoformat()
    flipped = central_call(fleet, "POST", f"/api/v1/models/{FLIP_MODEL}/rollout/flip", json={"at": at})
    if flipped.status_code != 200:
        raise fleet.fail(f"flip refused: {flipped.status_code} {flipped.text[:300]}", [])
    body = oip_bodies(np.zeros((1, width), dtype=np.float32), "input", count=1)[0]
    watches = {
        n: SwitchWatch(f"{fleet.edges[n].http_url}/v2/models/{FLIP_MODEL}/infer", body, "2", instant - 0.5)
        for n in nodes
    }
    for w in watches.values():
        w.start()
    for w in watches.values():
        w.join(max(0.0, instant - time.time()) + timeout_s)
    done = wait_rollout(fleet, FLIP_MODEL, "complete", lambda r: r["state"] == "complete", timeout_s)
    switched = {n: w.at for n, w in watches.items()}
    seen = [t for t in switched.values() if t is not None]
    complete = len(seen) == len(nodes)
    offsets_ms = [abs(c["offset_s"]) * 1000 for c in clocks.values() if c]
    return {
        "flip_skew_s": _r(max(seen) - min(seen)) if complete else None,
        "flip_error_s": _r(max(abs(t - instant) for t in seen)) if complete else None,
        "flip_switch_offsets_s": {n: _r(t - instant if t is not None else None) for n, t in switched.items()},
        "flip_resolution_s": _r(max((w.bound or 0.0) for w in watches.values())),
        "flip_poll_requests": sum(w.requests for w in watches.values()),
        "flip_poll_errors": sum(w.errors for w in watches.values()),
        "flip_lead_s": lead_s,
        "flip_staged_s": _r(staged_s, 3),
        "flip_nodes_staged": staged["nodes"],
        "flip_nodes_after": done["nodes"],
        "clock_offsets_ms": {n: (_r(c["offset_s"] * 1000, 3) if c else None) for n, c in clocks.items()},
        "clock_errors_ms": {n: (_r(c["error_s"] * 1000, 3) if c else None) for n, c in clocks.items()},
        "clock_offset_abs_max_ms": _r(max(offsets_ms), 3) if offsets_ms else None,
        "clocks_known": clocks_known is not None,
        "flip_model_bytes": v2.stat().st_size,
    }


# -- part 2: preview against what the edges fetched --------------------------------------


def _relative_error(predicted: int, measured: int) -> float:
    return abs(predicted - measured) / max(measured, predicted, 1)


def preview_then_roll_out(
    fleet: Fleet, name: str, version: str, path: Path, interval_s: float, timeout_s: float
) -> dict[str, Any]:
    """Push ``version`` held back, preview its rollout to every node, run it, compare per node.
    The preview reads what nodes hold from their heartbeats: two intervals pass first."""
    pushed = push_raw(fleet, name, version, path, activate="false")
    before = settled_counters(fleet)
    time.sleep(2 * interval_s)
    request = {"version": version, "canary": 1.0, "soak_s": 0}
    url = f"/api/v1/models/{name}/rollouts"
    answer = central_call(fleet, "POST", url, params={"dry_run": "true"}, json=request)
    if answer.status_code != 200:
        raise fleet.fail(f"dry run answered {answer.status_code}: {answer.text[:300]}", [])
    preview = answer.json()
    if preview.get("refused"):
        raise fleet.fail(f"dry run says a start would be refused: {preview['refused']}", [])
    started = central_call(fleet, "POST", url, json=request)
    if started.status_code != 201:
        raise fleet.fail(f"rollout start answered {started.status_code}: {started.text[:300]}", [])
    fleet.wait_complete(name, version, timeout_s=timeout_s)
    wait_rollout(fleet, name, "complete", lambda r: r["state"] == "complete", timeout_s)
    after = settled_counters(fleet)
    by_node = {n["node_id"]: n for n in preview["nodes"]}
    measured = {n: after[n]["bytes_fetched"] - before[n]["bytes_fetched"] for n in fleet.edges}
    predicted = {n: int(by_node.get(n, {}).get("bytes_total", 0)) for n in fleet.edges}
    errors = {n: _relative_error(predicted[n], measured[n]) for n in fleet.edges}
    egress = sum(after[n]["bytes_from_origin"] - before[n]["bytes_from_origin"] for n in fleet.edges)
    return {
        "version": version,
        "previous_version": preview.get("previous_version"),
        "version_bytes": sum(c["size"] for c in pushed["manifest"]["chunks"]),
        "worst_error": round(max(errors.values()), 5),
        "predicted_bytes": predicted,
        "measured_bytes": measured,
        "central_egress_predicted": preview["totals"]["central_egress_bytes"],
        "central_egress_measured": egress,
        "detours": {n: after[n]["detours"] - before[n]["detours"] for n in fleet.edges},
        "artifacts": [pushed["manifest"]["artifact"], *(a["artifact"] for a in pushed["manifest"]["alternatives"])],
        "predicted_artifacts": {n: by_node.get(n, {}).get("artifacts") for n in fleet.edges},
        "predicted_reused": {n: by_node.get(n, {}).get("bytes_reused") for n in fleet.edges},
        "served_artifacts": {n: _artifact(s, f"{name}:{version}") for n, s in fleet.statuses().items()},
    }


def measure_preview(
    fleet: Fleet, models: Path, *, width: int, layers: int, interval_s: float, timeout_s: float
) -> dict[str, Any]:
    """A new model version (all chunks new) then a delta (a new head only), each previewed."""
    full = cached_mlp(models, width=width, hidden_layers=layers, seed=2)
    delta = cached_mlp(models, width=width, hidden_layers=layers, seed=2, head_seed=1)
    runs = [
        preview_then_roll_out(fleet, FLIP_MODEL, "3", full, interval_s, timeout_s),
        preview_then_roll_out(fleet, FLIP_MODEL, "4", delta, interval_s, timeout_s),
    ]
    return {
        "preview_error": max(r["worst_error"] for r in runs),
        "preview_error_full": runs[0]["worst_error"],
        "preview_error_delta": runs[1]["worst_error"],
        "preview_runs": runs,
    }


# -- part 3: live drift under INT8, shadow sampling and fallback -------------------------


def _artifact(status: dict[str, Any], key: str) -> str | None:
    choice = status.get("artifacts", {}).get(key)
    return choice.get("artifact") if choice else None


def _guard(report: dict[str, Any]) -> dict[str, Any]:
    """What the push's accuracy guard measured on the calibration data."""
    keys = ("served", "method", "lower_bound", "threshold")
    return {**{k: report[k] for k in keys if k in report}, "guard": report.get("guard")}


def _fp32_decisions(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"input": x})[0]).argmax(axis=1)


def _decision(doc: dict[str, Any]) -> int:
    """Top-1 class of one OIP v2 answer (its ``logits`` output, one row)."""
    output = next(o for o in doc["outputs"] if o["name"] == "logits")
    return int(np.argmax(output["data"]))


def measure_shadow(fleet: Fleet, work: Path, *, max_requests: int, timeout_s: float) -> dict[str, Any]:
    """Serve the drift classifier in INT8, send shifted inputs until central raises
    ``int8_drift``, then time the fallback to FP32 on every edge. Absent feature: says so."""
    from modelfleet.zoo.drift import DRIFT_SHIFT, build_drift_classifier, drift_samples

    model = build_drift_classifier(work / "drift")
    pushed = fleet.push_files(DRIFT_MODEL, "1", model.onnx_path, calibration=model.calibration_path)
    key = f"{DRIFT_MODEL}:1"
    nodes = sorted(fleet.edges)
    for node in nodes:
        fleet.wait_model_ready(node, DRIFT_MODEL, timeout_s=timeout_s)
    served = {n: _artifact(s, key) for n, s in fleet.statuses().items()}
    result: dict[str, Any] = {
        "shadow_artifacts_before": served,
        "shadow_served_artifact": pushed.manifest.get("artifact"),
        "shadow_guard": _guard(pushed.manifest.get("quantization") or {}),
    }
    if not all(a and a.startswith("int8") for a in served.values()):
        return {**result, "shadow_available": False, "shadow_reason": f"INT8 not served on every edge: {served}"}
    x, _ = drift_samples(model.prototypes, 256, shift=DRIFT_SHIFT, seed=11)
    bodies = [
        json.dumps({"inputs": [{"name": model.input_name, "datatype": "FP32", "shape": [1, int(r.size)],
                                "data": r.tolist()}]}).encode()
        for r in x
    ]  # fmt: skip
    last = max((e.get("seq", 0) for e in events_since(fleet, None)), default=0)
    headers = {"content-type": "application/json"}
    expected = _fp32_decisions(model.onnx_path, x)
    agreed: list[bool] = []
    sent = failed = 0
    drift: dict[str, Any] | None = None
    started = time.monotonic()
    while drift is None and sent < max_requests and time.monotonic() - started < timeout_s:
        node = nodes[sent % len(nodes)]
        r = fleet.client.post(
            f"{fleet.edges[node].http_url}/v2/models/{DRIFT_MODEL}/infer", content=bodies[sent % len(bodies)],
            headers=headers,
        )  # fmt: skip
        if r.status_code == 200 and len(agreed) < len(bodies):
            agreed.append(_decision(r.json()) == expected[sent % len(bodies)])
        sent += 1
        failed += r.status_code != 200
        if sent % 25 == 0:
            for event in events_since(fleet, last):
                last = max(last, int(event.get("seq", last)))
                if event.get("type") == "int8_drift" and event.get("detail", {}).get("model") == DRIFT_MODEL:
                    drift = event
                    break
    live = round(sum(agreed) / len(agreed), 4) if agreed else None
    result.update({"shadow_requests_sent": sent, "shadow_requests_failed": failed, "shadow_live_agreement": live})
    if drift is None:
        reason = f"no int8_drift event after {sent} shifted requests (edge shadow sampling or central judging absent?)"
        return {**result, "shadow_available": False, "shadow_reason": reason}
    detected_at = drift["ts"] / 1000
    fp32_at = wait_until(
        lambda: all(_artifact(s, key) == "fp32" for s in fleet.statuses().values()), timeout_s, poll_s=0.05
    )
    fallback = [e for e in events_since(fleet, None) if e.get("type") == "int8_fallback"]
    return {
        **result,
        "shadow_available": True,
        "shadow_detect_requests": sent,
        "shadow_drift_event": drift,
        "shadow_fallback_event": fallback[-1] if fallback else None,
        "fallback_s": _r(fp32_at - detected_at, 3) if fp32_at is not None else None,
        "shadow_artifacts_after": {n: _artifact(s, key) for n, s in fleet.statuses().items()},
    }
