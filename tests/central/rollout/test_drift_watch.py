"""Central's live INT8 watch on real heartbeat payloads (decoded as central decodes them): pooled
counts flag a fleet-wide drift no single node could, each policy acts as it says, a node
agreeing well is left alone, and an operator's clear undoes a fallback."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from central.rollout.drift import FLAGS, DriftWatch
from central.storage.offload import StoreCalls
from central.storage.protocols import DecisionRecords
from central.storage.sqlite.decisions import SQLiteDecisionStore
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.mqtt.fast import decode_heartbeat
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, Event, Heartbeat, ModelInfo, ShadowInfo

INT8 = "int8-s8s8-qdq"
_seq = itertools.count()


def _manifest(policy: str | None = None) -> Manifest:
    chunk = ChunkRef(digest="a" * 64, size=1)
    int8 = ArtifactRef(
        artifact=INT8, sha256="b" * 64, size=1, chunks=[ChunkRef(digest="b" * 64, size=1)],
        quantization={"guard": {"threshold": 0.99, "confidence": 0.95}},
    )  # fmt: skip
    return Manifest(
        name="m", version="2", sha256="a" * 64, size=1, chunks=[chunk], created_at="2026-12-04T00:00:00Z",
        alternatives=[int8], labels={"modelfleet.drift_policy": policy} if policy else {},
    )  # fmt: skip


class Watch:
    """A ``DriftWatch`` with what it called recorded."""

    def __init__(self, policy: str | None = None, rollout: bool = True, records: DecisionRecords | None = None) -> None:
        self.events: list[Event] = []
        self.changes = 0
        self.rollbacks: list[tuple[str, str, str]] = []
        self._rollout = rollout
        manifest = _manifest(policy)
        self.watch = DriftWatch(
            lambda n, v: manifest if (n, v) == ("m", "2") else None,
            emit=self.events.append,
            on_change=self._changed,
            roll_back=self._roll_back,
            records=records,
        )

    def _changed(self) -> None:
        self.changes += 1

    def _roll_back(self, model: str, version: str, reason: str) -> bool:
        self.rollbacks.append((model, version, reason))
        return self._rollout

    def beat(self, node_id: str, samples: int, agree: int, artifact: str = INT8) -> None:
        cosine = 0.9999 if agree == samples else 0.9
        shadow = ShadowInfo(
            samples=samples, top1_agree=agree, top1_samples=samples, measure="cosine",
            measure_sum=samples * cosine, measure_sumsq=samples * cosine * cosine,
        )  # fmt: skip
        choice = ArtifactChoiceInfo(artifact=artifact, source="measured")
        model = ModelInfo(name="m", version="2", state="ready", choice=choice, shadow=shadow)
        hb = Heartbeat(node_id=node_id, bdseq=0, seq=next(_seq), ts=int(time.time() * 1000), interval_s=1.0,
                       models=[model])  # fmt: skip
        self.watch.harvest(node_id, decode_heartbeat(hb.model_dump_json().encode()))

    def types(self) -> list[str]:
        return [e.type for e in self.events]


def test_pooled_counts_flag_a_fleet_wide_drift_and_fall_every_int8_node_back() -> None:
    w = Watch()
    for node in ("e0", "e1", "e2", "e3"):
        w.beat(node, samples=5, agree=2)  # five samples each: too few to judge one node
    w.beat("e4", samples=40, agree=40, artifact="fp32")  # serves FP32 already: not judged
    asyncio.run(w.watch.judge())
    assert w.types() == ["int8_drift", "int8_fallback"]
    drift = w.events[0].detail
    assert drift["nodes"] == ["e0", "e1", "e2", "e3"] and drift["fleet"] and drift["flagged"]
    assert drift["samples"] == 20 and drift["measure"] == "top1"
    assert all(w.watch.forced(n) == {("m", "2"): "fp32"} for n in ("e0", "e1", "e2", "e3"))
    assert w.watch.forced("e4") == {} and w.changes == 1
    report = w.watch.report("m", "2")
    assert report["policy"] == "fallback" and report["fallback_nodes"] == ["e0", "e1", "e2", "e3"]
    assert report["nodes"]["e0"]["serves"] == "fp32" and report["fleet"][INT8]["flagged"]

    asyncio.run(w.watch.judge())  # nothing new: no second event
    w.beat("e0", samples=6, agree=2)
    asyncio.run(w.watch.judge())
    assert w.types() == ["int8_drift", "int8_fallback"]

    assert w.watch.clear("m", "2") == ["e0", "e1", "e2", "e3"]
    assert w.watch.forced("e0") == {} and w.changes == 2


def test_a_node_that_agrees_is_left_alone() -> None:
    w = Watch()
    for node in ("e0", "e1"):
        w.beat(node, samples=200, agree=200)
    asyncio.run(w.watch.judge())
    assert w.events == [] and w.watch.forced("e0") == {}
    assert w.watch.report("m", "2")["nodes"]["e0"]["verdict"]["flagged"] is False


@pytest.mark.parametrize(("policy", "rollout", "expected", "forced"), [
    ("report", True, ["int8_drift"], False),
    ("rollback", True, ["int8_drift"], False),
    ("rollback", False, ["int8_drift", "int8_fallback"], True),
])  # fmt: skip
def test_each_policy_acts_as_it_says(policy: str, rollout: bool, expected: list[str], forced: bool) -> None:
    w = Watch(policy, rollout)
    for node in ("e0", "e1"):  # a fleet flag: it holds with either node left out
        w.beat(node, samples=30, agree=10)
    asyncio.run(w.watch.judge())
    assert w.types() == expected and w.events[0].detail["fleet"]
    assert (w.watch.forced("e0") != {}) is forced
    assert bool(w.rollbacks) is (policy == "rollback")
    if w.rollbacks:
        assert "INT8 drift on live traffic" in w.rollbacks[0][2]


@pytest.mark.parametrize("policy", ["fallback", "rollback"])
def test_one_nodes_counts_flag_only_that_node_and_never_roll_back(policy: str) -> None:
    """One node's invented counts (the stolen edge) against another's real agreement: the
    liar falls back alone, the other keeps INT8, and nothing is rolled back."""
    w = Watch(policy)
    w.beat("e0", samples=2000, agree=0)
    w.beat("e1", samples=24, agree=24)
    asyncio.run(w.watch.judge())
    assert w.types() == ["int8_drift", "int8_fallback"]
    assert w.events[0].detail["nodes"] == ["e0"] and not w.events[0].detail["fleet"]
    assert w.watch.forced("e0") == {("m", "2"): "fp32"} and w.watch.forced("e1") == {}
    assert w.rollbacks == []
    assert not w.watch.report("m", "2")["fleet"][INT8]["flagged"]


def test_counts_only_for_an_assigned_version_and_an_int8_artifact_of_it() -> None:
    w = Watch()
    w.watch = DriftWatch(
        lambda n, v: _manifest() if (n, v) == ("m", "2") else None,
        emit=w.events.append, on_change=lambda: None, roll_back=lambda *a: False,
        assigned=lambda node, key: node != "stranger",
    )  # fmt: skip
    w.beat("stranger", samples=2000, agree=0)  # not assigned the version
    w.beat("e0", samples=2000, agree=0, artifact="int8-invented")  # no such artifact
    w.beat("e1", samples=2000, agree=0, artifact="fp32")  # the reference itself
    asyncio.run(w.watch.judge())
    assert w.events == [] and set(w.watch.report("m", "2")["nodes"]) <= {"e1"}  # FP32: kept, not judged
    assert w.watch.report("m", "2")["fleet"] == {}


def test_a_language_model_drifting_on_greedy_agreement_falls_back_to_fp32() -> None:
    int4 = ArtifactRef(
        artifact="int4-b32", sha256="b" * 64, size=1, chunks=[ChunkRef(digest="b" * 64, size=1)],
        quantization={"family": "decoder",
                      "text_guard": {"greedy_agreement": {"min": 0.9}, "confidence": 0.95}},
    )  # fmt: skip
    manifest = _manifest().model_copy(update={"kind": "decoder", "alternatives": [int4]})
    events: list[Event] = []
    watch = DriftWatch(lambda n, v: manifest, emit=events.append, on_change=lambda: None, roll_back=lambda *a: False)
    for node, agree in (("e0", 30), ("e1", 59)):  # per served greedy token; NLL of each 2.0
        shadow = ShadowInfo(samples=60, top1_agree=agree, top1_samples=60, measure="token_nll",
                            measure_sum=120.0, measure_sumsq=240.0)  # fmt: skip
        model = ModelInfo(name="m", version="2", state="ready", shadow=shadow,
                          choice=ArtifactChoiceInfo(artifact="int4-b32", source="default"))  # fmt: skip
        hb = Heartbeat(node_id=node, bdseq=0, seq=next(_seq), ts=int(time.time() * 1000), interval_s=1.0,
                       models=[model])  # fmt: skip
        watch.harvest(node, decode_heartbeat(hb.model_dump_json().encode()))
    asyncio.run(watch.judge())
    assert [e.type for e in events] == ["int8_drift", "int8_fallback"]
    assert events[0].detail["nodes"] == ["e0"] and "greedy agreement 0.5" in events[0].detail["reason"]
    assert watch.forced("e0") == {("m", "2"): "fp32"} and watch.forced("e1") == {}
    report = watch.report("m", "2")
    assert report["nodes"]["e0"]["token_logprob"]["mean"] == -2.0
    assert report["token_logprob"]["int4-b32"]["tokens"] == 120


def test_a_fallback_and_a_clear_outlive_a_restart(tmp_path: Path) -> None:
    """A restarted central serves FP32 where it fell back, before any node reports again, and
    after an operator's clear the counts before it stay out (no flag from the old samples)."""
    db = tmp_path / "central.sqlite3"
    before = Watch(records=SQLiteDecisionStore(db))
    before.beat("e0", samples=2000, agree=0)
    asyncio.run(before.watch.judge())
    assert before.watch.forced("e0") == {("m", "2"): "fp32"}

    after = Watch(records=SQLiteDecisionStore(db))  # restarted: no counts heard yet
    assert after.watch.forced("e0") == {("m", "2"): "fp32"}
    after.beat("e0", samples=2010, agree=0)
    asyncio.run(after.watch.judge())
    assert after.events == [], "a node flagged before the restart is not flagged (nor told) twice"
    assert after.watch.clear("m", "2") == ["e0"]

    cleared = Watch(records=SQLiteDecisionStore(db))
    assert cleared.watch.forced("e0") == {}
    cleared.beat("e0", samples=2015, agree=5)  # the old load's counts go on: five new, all agreeing
    asyncio.run(cleared.watch.judge())
    assert cleared.events == [] and cleared.watch.forced("e0") == {}, "the cleared samples stay out"


class ThreadNoting(SQLiteDecisionStore):
    """The SQLite decision store, noting which thread each call ran in."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.threads: list[str] = []

    def load(self, kind: str) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        return super().load(kind)

    def write(self, kind: str, puts: Any, deletes: Any = (), *, fence: int | None = None, also: Any = None) -> None:
        self.threads.append(threading.current_thread().name)
        super().write(kind, puts, deletes, fence=fence, also=also)


def test_the_running_watch_stores_its_decisions_from_worker_threads_not_the_loop(tmp_path: Path) -> None:
    records = ThreadNoting(tmp_path / "c.sqlite3")
    calls = StoreCalls(1)
    events: list[Event] = []
    manifest = _manifest()

    async def run() -> None:
        watch = DriftWatch(
            lambda n, v: manifest if (n, v) == ("m", "2") else None,
            emit=events.append, on_change=lambda: None, roll_back=lambda *_: False,
            records=records, interval_s=0.02, calls=calls,
        )  # fmt: skip
        records.threads.clear()  # the constructor's read: before the loop serves anyone
        w = Watch()
        w.watch = watch
        watch.start()
        for node in ("e0", "e1", "e2", "e3"):
            w.beat(node, samples=5, agree=2)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if events:
                break
        watch.stop()
        assert watch.forced("e0") == {("m", "2"): "fp32"}

    try:
        asyncio.run(run())
    finally:
        calls.close()
    assert [e.type for e in events] == ["int8_drift", "int8_fallback"]
    # the first pass reads the stored decisions, a flag is written: all in the pool's thread
    assert len(records.threads) >= 3 and all(t.startswith("store") for t in records.threads)
    assert SQLiteDecisionStore(tmp_path / "c.sqlite3").load(FLAGS).keys() == {
        json.dumps(["m", "2", n]) for n in ("e0", "e1", "e2", "e3")
    }


def test_counts_that_grow_after_a_fallback_stay_the_int8_artifacts() -> None:
    """A sample queued before the switch to FP32 may land after it: the node's counts, now
    reported beside FP32, are still its INT8's (FP32 has no shadow of its own)."""
    w = Watch()
    w.beat("e0", samples=30, agree=10)
    asyncio.run(w.watch.judge())
    assert w.watch.forced("e0") == {("m", "2"): "fp32"}
    w.beat("e0", samples=31, agree=10, artifact="fp32")  # one more sample, heard on FP32
    report = w.watch.report("m", "2")
    assert report["nodes"]["e0"]["artifact"] == INT8 and report["nodes"]["e0"]["shadow"]["samples"] == 31
