"""INT8 watched on live traffic: central's side. Edges sample live requests on the version's
FP32 artifact too and report the agreement counts in every heartbeat (``ModelInfo.shadow``);
this keeps the latest counts per version and node, judges them (``shadow_judge``: a node, and the
nodes serving the same INT8 artifact pooled, are flagged when agreement is confidently below the
guard's threshold), and acts per the version's policy, the manifest label
``modelfleet.drift_policy``:

* ``fallback`` (the default): the flagged nodes serve the FP32 artifact (``force_artifact`` in
  their desired state) and ``int8_fallback`` is logged;
* ``rollback``: the version's rollout is rolled back (a version no rollout brought: fallback);
* ``report``: only the ``int8_drift`` event and the API say so; ``off``: edges do not sample.

A language model's INT4/INT8 artifact is watched the same way: its edges score sampled
generations with FP32 (``edge_node.generation.shadow``), greedy agreement per served token is
judged against the text guard's threshold, a flag falls back to FP32 (the same events), and the
served tokens' mean log-probability under FP32 is in the report (``token_logprob``).

Pooling is what makes a fleet-wide drift quick to see: at a 1 % sample, 8 edges with their own
counts would each need ten samples (8,000 requests); pooled, the version is flagged after about
twenty samples in all. A pooled flag falls back every node serving that INT8 artifact (some of
whose local traffic may agree: FP32 costs them speed, never correctness); a node flagged on its
own counts falls back alone, under every policy.

Central does not take an edge's word for more than itself: counts are kept only for a version the
node's desired state has it serve (``assigned``) and an INT8 artifact that version's manifest has;
a pooled flag counts only when it still holds with any single node's counts left out
(``judge_fleet``), so one node's counts never flag another; and only a pooled flag rolls back.

Judged every ``interval_s`` over the versions whose counts changed, not per heartbeat: pooling
per heartbeat would cost O(nodes²) per interval on a large fleet.

What is decided is kept (``DecisionRecords``): each flag and fallback (``drift_flag``) and the
baselines a clear or a rollback set (``drift_baseline``), so a restarted central, and on
replicas the next leader and every replica serving a node's desired state, keeps serving FP32
where it fell back. Counts travel through ``ShadowCounts``: in memory on a single central;
between replicas the one that hears a node's heartbeats writes its counts to PostgreSQL and
only the leader judges (``leading``), pooled over every node, its decisions fenced by its epoch
(``fence``)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from central.quantize.verdict import z_score
from central.rollout.passes import PassLoop
from central.rollout.shadow_judge import (
    LIVE_CONFIDENCE,
    ShadowPolicy,
    ShadowVerdict,
    judge_fleet,
    judge_node,
    judging_terms,
    pool,
    token_logprob,
)
from central.storage.memory import LocalShadowCounts, MemoryDecisionRecords
from central.storage.offload import INLINE, StoreCalls
from central.storage.protocols import DecisionRecords, ShadowCountRow, ShadowCounts
from fleetwire.manifest import Manifest
from fleetwire.mqtt.fast import AnyHeartbeat, shadow_info
from fleetwire.mqtt.payloads import Event, ShadowInfo

log = logging.getLogger(__name__)

#: The manifest label naming what a flag does.
POLICY_LABEL = "modelfleet.drift_policy"
POLICIES = ("fallback", "rollback", "report", "off")
#: The artifact a fallback serves.
REFERENCE = "fp32"
#: The ``DecisionRecords`` kinds and the ``ShadowCounts`` kind of this watch.
FLAGS = "drift_flag"
BASELINES = "drift_baseline"
COUNTS = "drift"

Key = tuple[str, str]


def _record_key(model: str, version: str, node_id: str) -> str:
    return json.dumps([model, version, node_id])


@dataclass(frozen=True)
class NodeCounts:
    """What one node last reported for one version."""

    artifact: str
    info: ShadowInfo
    at: float
    #: The counts as the edge sent them (``info`` less any baseline).
    raw: ShadowInfo


def policy_of(manifest: Manifest) -> str:
    """The version's drift policy (an unknown word reads as the default, ``fallback``)."""
    value = manifest.labels.get(POLICY_LABEL, "fallback").strip().lower()
    return value if value in POLICIES else "fallback"


class DriftWatch:
    """Latest live agreement per version and node; flags, fallbacks and their events."""

    def __init__(
        self,
        manifest_of: Callable[[str, str], Manifest | None],
        *,
        emit: Callable[[Event], None],
        on_change: Callable[[], None],
        roll_back: Callable[[str, str, str], bool],
        assigned: Callable[[str, Key], bool] | None = None,
        interval_s: float = 0.5,
        records: DecisionRecords | None = None,
        counts: ShadowCounts | None = None,
        leading: Callable[[], bool] = lambda: True,
        fence: Callable[[], int | None] = lambda: None,
        calls: StoreCalls = INLINE,
    ) -> None:
        """``manifest_of(name, version)``: the stored manifest; ``roll_back(model, version,
        reason)``: roll back the rollout that brought ``version`` (False: there is none);
        ``assigned(node_id, (model, version))``: whether the node is registered and its desired
        state has it serve that version (None: every reporter is believed, for tests of judging);
        ``records``: where flags, fallbacks and baselines are kept (None: memory only);
        ``counts``: how heartbeats' counts reach the judge (None: within this process);
        ``leading``: whether this process judges now; ``fence``: the epoch it decides at;
        ``calls``: where the timer's store calls run (the counts' flush and read, the decisions'
        reads and writes: worker threads in central; inline by default, for tests of judging)."""
        self._calls = calls
        self._records: DecisionRecords = records if records is not None else MemoryDecisionRecords()
        self._feed: ShadowCounts = counts if counts is not None else LocalShadowCounts()
        self._leading = leading
        self._fence = fence
        self._led = False
        #: (version, node) → (artifact, raw counts) this process last passed on.
        self._sent: dict[tuple[Key, str], tuple[str, ShadowInfo]] = {}
        self._manifest_of = manifest_of
        self._assigned = assigned
        self._emit = emit
        self._on_change = on_change
        self._roll_back = roll_back
        self.interval_s = interval_s
        self._counts: dict[Key, dict[str, NodeCounts]] = {}
        #: Counts a clear or a rollback set aside, subtracted from later reports of the same load.
        self._baseline: dict[Key, dict[str, ShadowInfo]] = {}
        self._dirty: set[Key] = set()
        #: Per version: the pooled verdict (per INT8 artifact) and each node's, as last judged.
        self._fleet: dict[Key, dict[str, ShadowVerdict]] = {}
        self._nodes: dict[Key, dict[str, ShadowVerdict]] = {}
        self._flagged: set[tuple[str, str, str]] = set()  # (model, version, node or "*"+artifact)
        #: node → version → the artifact it must serve.
        self._forced: dict[str, dict[Key, str]] = {}
        self._passes = PassLoop(self.judge, "drift-watch", "judging live INT8 agreement")
        #: Decisions this watch wrote: a stored read begun before one is not adopted over it.
        self._writes = 0
        self.reload()

    def reload(self) -> None:
        """Take the flags, fallbacks and baselines as stored (another replica, or the run before
        a restart, decided them); counts already held are judged against the new baselines."""
        self.adopt(self.read_stored())

    def read_stored(self) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """How many decisions this watch had written, then the stored flags and baselines (a
        store read: any thread; ``adopt`` them on the loop)."""
        return self._writes, self._records.load(FLAGS), self._records.load(BASELINES)

    def adopt(self, stored: tuple[int, dict[str, Any], dict[str, Any]]) -> bool:
        """Take what ``read_stored`` read (on the loop: it replaces the loop-owned state), unless
        this watch wrote a decision meanwhile (the read may predate it; the write's generation
        bump, or the next leader's first pass, reads again)."""
        writes, stored_flags, stored_baselines = stored
        if writes != self._writes:
            return False
        flagged: set[tuple[str, str, str]] = set()
        forced: dict[str, dict[Key, str]] = {}
        for raw_key, body in stored_flags.items():
            model, version, node_id = json.loads(raw_key)
            flagged.add((model, version, node_id))
            if body.get("serves"):
                forced.setdefault(node_id, {})[(model, version)] = str(body["serves"])
        baseline: dict[Key, dict[str, ShadowInfo]] = {}
        for raw_key, body in stored_baselines.items():
            model, version, node_id = json.loads(raw_key)
            baseline.setdefault((model, version), {})[node_id] = ShadowInfo.model_validate(body)
        self._flagged, self._forced, self._baseline = flagged, forced, baseline
        for key, nodes in self._counts.items():
            for node_id, c in nodes.items():
                nodes[node_id] = NodeCounts(c.artifact, _since(c.raw, baseline.get(key, {}).get(node_id)), c.at, c.raw)
        return True

    # -- input ------------------------------------------------------------------------------

    def harvest(self, node_id: str, hb: AnyHeartbeat) -> None:
        """Keep the shadow counts a heartbeat reports (cheap: judging waits for the timer)."""
        for m in hb.models:
            if m.shadow is None or m.state != "ready" or m.shadow.candidate:
                continue  # a pending candidate's counts are the promotion's (``promotion``)
            key = (m.name, m.version)
            artifact = m.choice.artifact if m.choice is not None else ""
            raw = shadow_info(m.shadow)
            sent = self._sent.get((key, node_id))
            if sent is not None and artifact == REFERENCE:
                # A node that fell back to FP32 keeps reporting its INT8's counts, and a sample
                # queued before the switch may still add to them: they stay that artifact's
                # (FP32 has no shadow of its own), never relabelled as FP32's in the report.
                artifact = sent[0]
            if sent is not None and sent == (artifact, raw):
                continue
            if not self._serves(node_id, key):
                continue
            self._sent[(key, node_id)] = (artifact, raw)
            row = ShadowCountRow(m.name, m.version, "", node_id, artifact, raw.model_dump(mode="json"), time.time())
            self._feed.put(COUNTS, [row])

    def _pull(self) -> None:
        """Take the counts that reached the judge since the last pull."""
        self._take(self._feed.changed(COUNTS))

    def _take(self, rows: list[ShadowCountRow]) -> None:
        """Hold ``rows`` (read by ``_feed.changed``) as each node's latest counts."""
        for row in rows:
            key = (row.model, row.version)
            raw = ShadowInfo.model_validate(row.raw)
            info = _since(raw, self._baseline.get(key, {}).get(row.node_id))
            self._counts.setdefault(key, {})[row.node_id] = NodeCounts(row.artifact, info, row.at, raw)
            self._dirty.add(key)

    def _serves(self, node_id: str, key: Key) -> bool:
        """Whether ``node_id``'s counts for ``key`` may count at all: it is registered and its
        desired state has it serve the version (asked only when its counts change). Counts for
        the reference are kept but never judged; for an artifact the version's manifest does not
        have they are dropped when the version is judged (``_judge_version``)."""
        return self._assigned is None or self._assigned(node_id, key)

    # -- judging ----------------------------------------------------------------------------

    def start(self) -> None:
        """Judge every ``interval_s`` (needs the running loop; ``PassLoop``)."""
        self._passes.start(self.interval_s)

    def stop(self) -> None:
        """Stop judging."""
        self._passes.stop()

    async def judge(self) -> None:
        """Pass on the counts heard here; where this process judges, judge the versions whose
        counts changed since the last pass and act on new flags. A process that comes to judge
        (a new leader) first takes the stored decisions and judges every version it has counts of.
        Store calls are awaited through ``calls``; what they return is applied on the loop."""
        await self._calls(self._feed.flush)
        if not self._leading():
            self._led = False
            return
        if not self._led:
            stored = await self._calls(self.read_stored)
            if not self._leading() or not self.adopt(stored):
                return  # lost the lead meanwhile, or decided meanwhile (read again next pass)
            self._led = True
            self._dirty.update(self._counts)
        self._take(await self._calls(self._feed.changed, COUNTS))
        dirty, self._dirty = self._dirty, set()
        changed = False
        for key in sorted(dirty):
            for flag in self._judge_version(key):
                changed |= await self._act(key, *flag)
        if changed:
            self._on_change()

    def _judge_version(self, key: Key) -> list[tuple[str, list[str], ShadowVerdict, str, bool]]:
        """Judge ``key``'s counts (the figures the report shows); the flags to act on, each as
        ``(artifact, nodes, verdict, policy, fleet)`` (``_act``'s arguments)."""
        manifest = self._manifest_of(*key)
        if manifest is None:
            return []
        policy = policy_of(manifest)
        counts = self._counts.get(key, {})
        by_artifact: dict[str, list[str]] = {}
        for node_id, c in counts.items():
            if c.artifact != REFERENCE:
                by_artifact.setdefault(c.artifact, []).append(node_id)
        flags: list[tuple[str, list[str], ShadowVerdict, str, bool]] = []
        for artifact, nodes in by_artifact.items():
            ref = manifest.artifact_named(artifact)
            if ref is None:  # no such artifact: invented, and no count of it is believed
                for node_id in nodes:
                    del counts[node_id]
                continue
            terms = judging_terms(ShadowPolicy(), ref.quantization)
            if terms is None:
                continue
            threshold, z = terms
            pooled = judge_fleet((counts[n].info for n in nodes), threshold, z)
            self._fleet.setdefault(key, {})[artifact] = pooled
            own = {n: judge_node(counts[n].info, threshold, z) for n in nodes}
            self._nodes.setdefault(key, {}).update(own)
            flagged = nodes if pooled.flagged else [n for n, v in own.items() if v.flagged]
            if flagged:
                verdict = pooled if pooled.flagged else own[flagged[0]]
                flags.append((artifact, flagged, verdict, policy, pooled.flagged))
        return flags

    async def _act(
        self, key: Key, artifact: str, nodes: list[str], verdict: ShadowVerdict, policy: str, fleet: bool
    ) -> bool:
        """Log the flag (once per node) and apply the policy; True when a desired state changes."""
        model, version = key
        new = [n for n in sorted(nodes) if (model, version, n) not in self._flagged]
        if not new:
            return False
        # A rollback that happens deletes these records again (``_forget``); one that cannot falls back.
        body = {"artifact": artifact, "serves": None if policy == "report" else REFERENCE, "policy": policy}
        try:  # stored first: a flag nobody kept (the store away, a stale leader) is no decision
            puts = {_record_key(model, version, n): body for n in new}
            await self._calls(self._records.write, FLAGS, puts, fence=self._fence())
        except Exception as exc:
            log.warning(
                "%s:%s drift flags on %s not stored (%s); judged again at the next pass", model, version, new, exc
            )
            self._dirty.add(key)
            return False
        self._writes += 1
        self._flagged.update((model, version, n) for n in new)
        detail: dict[str, Any] = {
            "model": model, "version": version, "artifact": artifact, "nodes": new, "fleet": fleet,
            "policy": policy, **verdict.as_dict(),
        }  # fmt: skip
        log.warning(
            "%s:%s %s disagrees with FP32 on live traffic on %s: %s", model, version, artifact, new, verdict.reason
        )
        self._emit(Event(type="int8_drift", ts=_ms(), node_id=new[0] if len(new) == 1 else None, detail=detail))
        if policy == "report":
            return False
        if policy == "rollback" and fleet and self._rolled_back(model, version, verdict):
            try:
                baseline, deletes, kept = self._forgetting(key)  # rolled out again later, judged afresh
                fence = self._fence()
                await self._calls(self._records.write, FLAGS, {}, deletes, fence=fence, also={BASELINES: kept})
                self._forgot(key, baseline)
            except Exception as exc:
                log.warning("%s:%s rolled back; its flags stay until stored (%s)", model, version, exc)
            return False  # the rollback re-plans the fleet itself
        for node_id in new:
            self._forced.setdefault(node_id, {})[key] = REFERENCE
        fallback = {"model": model, "version": version, "artifact": REFERENCE, "nodes": new}
        self._emit(Event(type="int8_fallback", ts=_ms(), detail=fallback))
        return True

    def _rolled_back(self, model: str, version: str, verdict: ShadowVerdict) -> bool:
        """Roll back the rollout that brought the version; False (the nodes fall back instead)
        when there is none, or the rollback could not be written (another replica wrote the
        rollout meanwhile, or this one no longer leads)."""
        try:
            return self._roll_back(model, version, f"INT8 drift on live traffic: {verdict.reason}")
        except Exception as exc:
            log.warning("%s:%s not rolled back (%s); its flagged nodes fall back to %s", model, version, exc, REFERENCE)
            return False

    # -- output -----------------------------------------------------------------------------

    def forced(self, node_id: str) -> dict[Key, str]:
        """Version → the artifact ``node_id`` must serve (central's fallbacks)."""
        return dict(self._forced.get(node_id, {}))

    def clear(self, model: str, version: str) -> list[str]:
        """Forget ``model:version``'s flags and fallbacks (an operator accepts INT8 again, e.g.
        after the traffic came back); its nodes serve their own choice on the next state."""
        key = (model, version)
        self._pull()  # every node's counts so far, also on a replica that does not judge
        self._forget(key, fence=None)  # an operator's call, on whichever replica took it
        nodes = [n for n, forced in self._forced.items() if forced.pop(key, None) is not None]
        if nodes:
            self._on_change()
        return sorted(nodes)

    def _forget(self, key: Key, fence: int | None) -> None:
        """Judge ``key`` afresh: its flags go, and the counts so far become the baseline (edges
        report counts since the version loaded, so the samples before this point stay out).
        Stored first (one transaction): raises when it could not be, and nothing changes."""
        baseline, flags, kept = self._forgetting(key)
        self._records.write(FLAGS, {}, flags, fence=fence, also={BASELINES: kept})
        self._forgot(key, baseline)

    def _forgetting(self, key: Key) -> tuple[dict[str, ShadowInfo], list[str], dict[str, Any]]:
        """What forgetting ``key`` writes: the new baseline, the flag records to delete, the
        baseline records to put."""
        counts = self._counts.get(key, {})
        baseline = {n: c.raw for n, c in counts.items()}
        flags = [_record_key(*f) for f in self._flagged if (f[0], f[1]) == key]
        kept = {_record_key(*key, n): raw.model_dump(mode="json") for n, raw in baseline.items()}
        return baseline, flags, kept

    def _forgot(self, key: Key, baseline: dict[str, ShadowInfo]) -> None:
        """Apply a stored forget (``_forget``) on the loop-owned state."""
        self._writes += 1
        self._flagged = {f for f in self._flagged if (f[0], f[1]) != key}
        self._baseline[key] = baseline
        self._counts.pop(key, None)
        self._fleet.pop(key, None)
        self._nodes.pop(key, None)

    def report(self, model: str, version: str) -> dict[str, Any]:
        """What central knows of ``model:version`` on live traffic, per node and pooled."""
        key = (model, version)
        self._pull()
        if not self._leading():  # the figures as the leader judges them; deciding is the leader's
            self._judge_version(key)
        manifest = self._manifest_of(model, version)
        counts = self._counts.get(key, {})
        verdicts = self._nodes.get(key, {})
        z = _z_of(manifest)
        nodes = {}
        for node_id, c in sorted(counts.items()):
            v = verdicts.get(node_id)
            nodes[node_id] = {
                "artifact": c.artifact,
                "shadow": c.info.model_dump(mode="json"),
                "verdict": v.as_dict() if v is not None else None,
                "serves": self._forced.get(node_id, {}).get(key, c.artifact),
                "reported_at": c.at,
                "token_logprob": token_logprob(c.info, z),
            }
        report: dict[str, Any] = {
            "model": model,
            "version": version,
            "policy": policy_of(manifest) if manifest is not None else None,
            "fleet": {a: v.as_dict() for a, v in self._fleet.get(key, {}).items()},
            "nodes": nodes,
            "fallback_nodes": sorted(n for n, f in self._forced.items() if key in f),
        }
        if manifest is not None and manifest.is_language_model:  # served tokens' log-probability, pooled
            report["token_logprob"] = {
                a: token_logprob(pool(c.info for c in counts.values() if c.artifact == a), z)
                for a in sorted({c.artifact for c in counts.values()})
            }
        return report


def _z_of(manifest: Manifest | None) -> float:
    """The z live counts of ``manifest``'s served artifact are judged at (for report figures)."""
    terms = judging_terms(ShadowPolicy(), manifest.quantization) if manifest is not None else None
    return terms[1] if terms is not None else z_score(LIVE_CONFIDENCE)


def _since(info: ShadowInfo, baseline: ShadowInfo | None) -> ShadowInfo:
    """``info`` less ``baseline`` when it counts on from it (the same load), else ``info`` (a new
    load starts its counts at zero)."""
    if baseline is None or info.samples < baseline.samples or info.measure != baseline.measure:
        return info
    return info.model_copy(
        update={
            "samples": info.samples - baseline.samples,
            "top1_agree": max(0, info.top1_agree - baseline.top1_agree),
            "top1_samples": max(0, info.top1_samples - baseline.top1_samples),
            "measure_sum": max(0.0, info.measure_sum - baseline.measure_sum),
            "measure_sumsq": max(0.0, info.measure_sumsq - baseline.measure_sumsq),
            "dropped": max(0, info.dropped - baseline.dropped),
        }
    )


def _ms() -> int:
    return int(time.time() * 1000)
