"""The object store crashing under a replicated central: SeaweedFS SIGKILLed and restarted
while pushes go on (``bench.central_ha``'s last section), and the checks the fault suite
shares: an acknowledged push is listed by every live replica with each of its chunks in the
bucket, byte for byte (read back and hashed), and no listed version lacks a chunk.

A push the crash cut must be refused (503) or completed, never half-listed; one that was
acknowledged must never be lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._replicas import ReplicatedFleet
from fleetwire.digest import chunk_digest
from modelfleet.up.s3server import S3Server
from modelfleet.zoo.synthetic import build_mlp

__all__ = ["S3_TARGETS", "damaged_chunks", "listed_versions", "s3_restart_pushes", "unstored_versions"]

#: What the section must measure: every acked push kept, no version listed without its chunks,
#: and every push answered 201 or 503 with Retry-After (central itself never goes away here).
S3_TARGETS = {"s3_restart_pushes_lost": 0, "s3_restart_half_listed": 0, "s3_restart_unclear_answers": 0}
MODEL = "s3-restarted"


def listed_versions(fleet: ReplicatedFleet, url: str, model: str) -> list[str]:
    """The versions of ``model`` the replica at ``url`` lists ([] for an unknown model)."""
    r = fleet.client.get(f"{url}/api/v1/models/{model}/versions")
    return [] if r.status_code == 404 else [str(v["version"]) for v in r.json()]


def damaged_chunks(s3: S3Server, bucket: str, manifest: dict[str, Any]) -> list[str]:
    """The chunks of ``manifest`` that are not in ``bucket`` whole: each is read back and hashed."""
    client = s3.client()
    bad = []
    for chunk in manifest["chunks"]:
        digest = str(chunk["digest"])
        try:
            data = client.get_object(Bucket=bucket, Key=f"sha256/{digest[:2]}/{digest}")["Body"].read()
        except Exception as exc:  # boto's ClientError (NoSuchKey) and connection errors alike
            bad.append(f"{digest[:12]}: {type(exc).__name__}")
            continue
        if chunk_digest(data) != digest:
            bad.append(f"{digest[:12]}: {len(data)} bytes of other content")
    return bad


def unstored_versions(
    fleet: ReplicatedFleet, s3: S3Server, bucket: str, model: str, versions: list[str] | None = None
) -> list[str]:
    """``versions`` (every listed one when None) that a live replica does not list, or whose
    chunks are not all whole in the bucket; one line each saying what is wrong."""
    if versions is None:
        versions = sorted({v for p in fleet.live() for v in listed_versions(fleet, p.http_url, model)})
    problems = []
    for version in versions:
        manifest, missing = _manifest_on_every_replica(fleet, model, version)
        if manifest is None:
            problems.append(missing)
            continue
        bad = damaged_chunks(s3, bucket, manifest)
        if bad:
            problems.append(f"{model}:{version}: {len(bad)} chunk(s) not whole in the bucket: {bad[:3]}")
    return problems


def _manifest_on_every_replica(fleet: ReplicatedFleet, model: str, version: str) -> tuple[dict[str, Any] | None, str]:
    """The version's manifest when every live replica serves it, else (None, which one does not)."""
    manifest: dict[str, Any] | None = None
    for proc in fleet.live():
        r = fleet.client.get(f"{proc.http_url}/api/v1/models/{model}/versions/{version}")
        if r.status_code != 200:
            return None, f"{model}:{version} on {proc.name}: {r.status_code}"
        manifest = r.json()
    return manifest, "" if manifest is not None else f"{model}:{version}: no live replica"


@dataclass
class _Pushes:
    """Pushes from a few threads to the live replicas, one after another each, every one a new
    model of a few chunks (new bytes: each push writes to the store, none is deduplicated)."""

    fleet: ReplicatedFleet
    work: Path
    acked: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    #: (start, end) of every push, ``time.monotonic()``: which ones a kill cut through
    spans: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, worker: int) -> None:
        sent = 0
        with httpx.Client(timeout=60.0) as client:
            while not self.stop.is_set():
                live = self.fleet.live()
                if not live:
                    return
                proc = live[(worker + sent) % len(live)]
                seed = 1000 * (worker + 1) + sent
                body = build_mlp(self.work / f"s3-{seed}.onnx", width=256, hidden_layers=3, seed=seed).read_bytes()
                sent += 1
                started = time.monotonic()
                try:
                    r = client.post(
                        f"{proc.http_url}/api/v1/models/{MODEL}/versions",
                        content=body,
                        headers={"Content-Type": "application/octet-stream"},
                    )
                except httpx.TransportError as exc:
                    with self.lock:
                        self.spans.append((started, time.monotonic()))
                        self.refused.append(f"{proc.name}: UNEXPECTED {type(exc).__name__} {exc!r:.160}")
                    continue
                with self.lock:
                    self.spans.append((started, time.monotonic()))
                    if r.status_code == 201:
                        self.acked.append(str(r.json()["manifest"]["version"]))
                    elif r.status_code == 503 and r.headers.get("Retry-After"):
                        self.refused.append(f"{proc.name}: 503 {r.json().get('error', '')[:80]}")
                    else:  # anything else is a broken promise: no clear refusal
                        self.refused.append(f"{proc.name}: UNEXPECTED {r.status_code} {r.text[:120]}")


def s3_restart_pushes(
    fleet: ReplicatedFleet,
    s3: S3Server,
    bucket: str,
    work: Path,
    *,
    restarts: int = 2,
    gap_s: float = 1.0,
    pushers: int = 2,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Push from ``pushers`` threads while SeaweedFS is SIGKILLed and restarted ``restarts``
    times, ``gap_s`` apart; then check every acked push and every listed version."""
    started_s = s3.ready_s  # its first start, before this section restarts it
    pushes = _Pushes(fleet, work)
    threads = [threading.Thread(target=pushes.run, args=(i,), daemon=True) for i in range(pushers)]
    for t in threads:
        t.start()
    ready_s, kills = [], []
    for _ in range(restarts):
        time.sleep(gap_s)
        acked_before = len(pushes.acked)
        kills.append(time.monotonic())
        s3.restart()
        assert s3.ready_s is not None
        ready_s.append(round(s3.ready_s, 3))
        log(f"S3 SIGKILLed with {acked_before} pushes acked; serving again after {s3.ready_s:.2f}s")
    time.sleep(gap_s)
    pushes.stop.set()
    for t in threads:
        t.join(timeout=90)
    lost = unstored_versions(fleet, s3, bucket, MODEL, list(pushes.acked))
    half = unstored_versions(fleet, s3, bucket, MODEL)
    unexpected = [r for r in pushes.refused if "UNEXPECTED" in r]
    return {
        "s3_start_s": round(started_s, 3) if started_s is not None else None,
        "s3_restarts": restarts,
        "s3_restart_ready_s": ready_s,
        "s3_restart_pushes_acked": len(pushes.acked),
        "s3_restart_pushes_refused": len(pushes.refused),
        # pushes under way when the server was killed (each one cut, then completed or refused)
        "s3_restart_pushes_cut": sum(any(a < k < b for k in kills) for a, b in pushes.spans),
        "s3_restart_pushes_lost": len(lost),
        "s3_restart_half_listed": len(half),
        "s3_restart_unclear_answers": len(unexpected),
        "s3_restart_problems": (lost + half + unexpected)[:10],
    }
