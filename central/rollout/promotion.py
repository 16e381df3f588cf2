"""Pending INT8 promoted (or rejected) on live evidence: central's side.

A candidate that agreed on every guard sample, but on too few to prove the threshold, is
stored *pending* (``Manifest.pending``). Edges serve FP32 and run the candidate beside it on
a sample of live requests, within the shadow's CPU budget (``edge_node.inference.shadow``),
reporting the counts in ``ShadowInfo`` with ``candidate`` set. Here the counts are pooled
across nodes and judged the other way round from drift (``shadow_judge``):

* **promoted** once every measure's *lower* bound at the live confidence (the guard's, at
  least ``LIVE_CONFIDENCE``: each heartbeat is another look) reaches the guard's threshold,
  pooled and still with any single node's counts left out;
* **rejected** once the pooled counts show it confidently *below* the threshold (the drift
  test, ``judge_fleet``).

A single node's counts decide only when that node is the only one serving the version: one
node never promotes or rejects for the others. The decision re-issues the version's signed
manifest (``central.registry.pending``): durable, shared by replicas, and the edges switch
to the promoted artifact (each timing it against FP32 as usual) through their sealed
desired state. The counts travel through ``ShadowCounts``: in memory on a single central (after
a restart the edges' next heartbeats, counts since the version loaded, bring them back); between
replicas, PostgreSQL, written by the replica that hears the node and judged by the leader only,
so a leader change keeps every node's counts and one replica never decides on its share."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from central.quantize.verdict import LABELS, wilson_lower_bound
from central.rollout.passes import PassLoop
from central.rollout.shadow_judge import (
    MIN_LIVE_SAMPLES,
    ShadowPolicy,
    judge_fleet,
    judge_node,
    judging_terms,
    pool,
)
from central.storage.memory import LocalShadowCounts
from central.storage.offload import INLINE, StoreCalls
from central.storage.protocols import ShadowCountRow, ShadowCounts
from fleetwire.manifest import Manifest
from fleetwire.mqtt.fast import AnyHeartbeat, shadow_info
from fleetwire.mqtt.payloads import Event, ShadowInfo

log = logging.getLogger(__name__)

__all__ = ["LiveProof", "PromotionWatch", "prove"]

Key = tuple[str, str]
#: The ``ShadowCounts`` kind of pending candidates' counts.
COUNTS = "promotion"
#: ``decide(model, version, artifact, evidence)``: re-issue the manifest; False when no longer pending.
Decide = Callable[[str, str, str, dict[str, Any]], bool]


def mean_lower_bound_of(total: float, total_sq: float, n: int, z: float) -> float:
    """mean − z·sd/√n of per-sample values given their sum and sum of squares (−inf below two)."""
    if n < 2:
        return -math.inf
    mean = total / n
    variance = max(0.0, (total_sq - n * mean * mean) / (n - 1))
    return mean - z * math.sqrt(variance / n)


@dataclass(frozen=True)
class LiveProof:
    """Whether live counts prove a candidate: each measure's lower bound against the threshold."""

    proven: bool
    #: measure → (value, lower bound, samples).
    measures: dict[str, tuple[float, float, int]]
    threshold: float
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """For events, the report and the re-issued manifest."""
        return {
            "proven": self.proven,
            "threshold": self.threshold,
            "reason": self.reason,
            "measures": {k: {"value": v, "lower_bound": b, "samples": n} for k, (v, b, n) in self.measures.items()},
        }


def prove(info: ShadowInfo, threshold: float, z: float, min_samples: int = MIN_LIVE_SAMPLES) -> LiveProof:
    """Proven when every measure the counts carry has ``min_samples`` and a lower bound at
    ``z`` that reaches ``threshold``; the weakest measure says why."""
    measures: dict[str, tuple[float, float, int]] = {}
    if info.top1_samples:
        n = info.top1_samples
        measures["top1"] = (info.top1_agree / n, wilson_lower_bound(info.top1_agree, n, z), n)
    if info.measure in LABELS and info.samples:
        n = info.samples
        bound = mean_lower_bound_of(info.measure_sum, info.measure_sumsq, n, z)
        measures[info.measure] = (info.measure_sum / n, bound, n)
    if not measures:
        return LiveProof(False, measures, threshold, "no live samples yet")
    name, (value, bound, n) = min(measures.items(), key=lambda kv: kv[1][1])
    enough = all(m[2] >= min_samples for m in measures.values())
    proven = enough and bound >= threshold
    figures = f"{LABELS[name]} {value:.4g} (lower bound {bound:.4g}) on {n} live samples"
    reason = f"{figures} {'reaches' if proven else 'does not yet reach'} threshold {threshold:.4g}"
    return LiveProof(proven, measures, threshold, reason)


def _less(total: ShadowInfo, info: ShadowInfo) -> ShadowInfo:
    """``total`` (pooled) without one node's ``info``."""
    same = info.measure == total.measure
    return total.model_copy(
        update={
            "samples": max(0, total.samples - info.samples) if same else total.samples,
            "top1_agree": max(0, total.top1_agree - info.top1_agree),
            "top1_samples": max(0, total.top1_samples - info.top1_samples),
            "measure_sum": max(0.0, total.measure_sum - info.measure_sum) if same else total.measure_sum,
            "measure_sumsq": max(0.0, total.measure_sumsq - info.measure_sumsq) if same else total.measure_sumsq,
        }
    )


class PromotionWatch:
    """Latest live counts of each version's pending candidate per node; promotions, rejections."""

    def __init__(
        self,
        manifest_of: Callable[[str, str], Manifest | None],
        *,
        promote: Decide,
        reject: Decide,
        emit: Callable[[Event], None],
        holders: Callable[[Key], int],
        assigned: Callable[[str, Key], bool] | None = None,
        interval_s: float = 0.5,
        counts: ShadowCounts | None = None,
        leading: Callable[[], bool] = lambda: True,
        calls: StoreCalls = INLINE,
    ) -> None:
        """``holders(key)``: how many nodes serve the version; ``assigned(node, key)``: whether
        the node's desired state has it serve the version (None: believe every reporter);
        ``counts``: how heartbeats' counts reach the judge (None: within this process);
        ``leading``: whether this process judges now; ``calls``: where the timer's counts flush
        and read run (worker threads in central; inline by default, for tests of judging)."""
        self._calls = calls
        self._feed: ShadowCounts = counts if counts is not None else LocalShadowCounts()
        self._leading = leading
        self._sent: dict[tuple[tuple[str, str, str], str], ShadowInfo] = {}
        self._manifest_of = manifest_of
        self._promote = promote
        self._reject = reject
        self._emit = emit
        self._holders = holders
        self._assigned = assigned
        self.interval_s = interval_s
        #: (model, version, candidate) → node → counts.
        self._counts: dict[tuple[str, str, str], dict[str, ShadowInfo]] = {}
        self._dirty: set[tuple[str, str, str]] = set()
        #: The decisions made: (model, version, candidate) → status and evidence.
        self._last: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._passes = PassLoop(self.judge, "promotion-watch", "judging pending INT8 on live traffic")

    def harvest(self, node_id: str, hb: AnyHeartbeat) -> None:
        """Keep the counts of pending candidates a heartbeat reports (judged on the timer)."""
        for m in hb.models:
            if m.shadow is None or m.state != "ready" or not m.shadow.candidate:
                continue
            info = shadow_info(m.shadow)
            key = (m.name, m.version, info.candidate)
            if self._sent.get((key, node_id)) == info:
                continue
            if self._assigned is not None and not self._assigned(node_id, (m.name, m.version)):
                continue
            self._sent[(key, node_id)] = info
            artifact = m.choice.artifact if m.choice is not None else ""
            row = ShadowCountRow(*key, node_id, artifact, info.model_dump(mode="json"), time.time())
            self._feed.put(COUNTS, [row])

    def _pull(self) -> None:
        """Take the counts that reached the judge since the last pull."""
        self._take(self._feed.changed(COUNTS))

    def _take(self, rows: list[ShadowCountRow]) -> None:
        """Hold ``rows`` (read by ``_feed.changed``) as each node's latest counts."""
        for row in rows:
            key = (row.model, row.version, row.candidate)
            self._counts.setdefault(key, {})[row.node_id] = ShadowInfo.model_validate(row.raw)
            self._dirty.add(key)

    def start(self) -> None:
        """Judge every ``interval_s`` (needs the running loop; ``PassLoop``)."""
        self._passes.start(self.interval_s)

    def stop(self) -> None:
        """Stop judging."""
        self._passes.stop()

    async def judge(self) -> None:
        """Pass on the counts heard here; where this process judges (the leader), judge the
        candidates whose counts changed and promote or reject the decided ones. The counts'
        flush and read are awaited through ``calls``; judging and deciding run on the loop."""
        await self._calls(self._feed.flush)
        if not self._leading():
            return
        self._take(await self._calls(self._feed.changed, COUNTS))
        if not self._leading():
            return
        dirty, self._dirty = self._dirty, set()
        for key in sorted(dirty):
            self._judge(key)

    def _evidence(self, key: tuple[str, str, str]) -> tuple[float, float, list[ShadowInfo], LiveProof] | None:
        """``(threshold, z, each node's counts, the pooled proof)`` of a candidate still pending, or
        None (decided already, or never pending: its counts are dropped)."""
        model, version, artifact = key
        manifest = self._manifest_of(model, version)
        ref = next((p for p in manifest.pending if p.artifact == artifact), None) if manifest else None
        terms = judging_terms(ShadowPolicy(), ref.quantization) if ref is not None else None
        if terms is None:
            self._counts.pop(key, None)
            return None
        threshold, z = terms
        infos = list(self._counts.get(key, {}).values())
        return threshold, z, infos, prove(pool(infos), threshold, z)

    def _judge(self, key: tuple[str, str, str]) -> None:
        found = self._evidence(key)
        if found is None:
            return
        threshold, z, infos, proof = found
        total = pool(infos)
        alone = len(infos) == 1 and self._holders(key[:2]) <= 1
        if proof.proven and (alone or (len(infos) >= 2 and _holds_without_each(total, infos, threshold, z))):
            self._decide(key, "promoted", proof.as_dict(), len(infos))
            return
        drift = judge_node(total, threshold, z) if alone else judge_fleet(infos, threshold, z)
        if drift.flagged:
            self._decide(key, "rejected", drift.as_dict(), len(infos))

    def _decide(self, key: tuple[str, str, str], status: str, figures: dict[str, Any], nodes: int) -> None:
        model, version, artifact = key
        evidence = {**figures, "nodes": nodes, "decided_at": time.time()}
        act = self._promote if status == "promoted" else self._reject
        if not act(model, version, artifact, evidence):
            return
        self._last[key] = {"status": status, **evidence}
        self._counts.pop(key, None)
        kind = "int8_promoted" if status == "promoted" else "int8_rejected"
        detail = {"model": model, "version": version, "artifact": artifact, **evidence}
        self._emit(Event(type=kind, ts=int(time.time() * 1000), detail=detail))

    def report(self, model: str, version: str) -> dict[str, Any]:
        """Per candidate of ``model:version``: its status (pending, promoted, rejected), the pooled
        live evidence so far (or that decided), and each node's counts."""
        self._pull()
        out: dict[str, Any] = {
            artifact: {**last, "per_node": {}}
            for (m, v, artifact), last in self._last.items()
            if (m, v) == (model, version)
        }
        for key, counts in list(self._counts.items()):
            found = self._evidence(key) if key[:2] == (model, version) else None
            if found is not None:
                out[key[2]] = {
                    "status": "pending",
                    "nodes": len(counts),
                    **found[3].as_dict(),
                    "per_node": {n: c.model_dump(mode="json") for n, c in sorted(counts.items())},
                }
        return out


def _holds_without_each(total: ShadowInfo, infos: list[ShadowInfo], threshold: float, z: float) -> bool:
    """Whether the proof stands with any one node's counts left out (no node promotes alone)."""
    return all(prove(_less(total, info), threshold, z).proven for info in infos)
