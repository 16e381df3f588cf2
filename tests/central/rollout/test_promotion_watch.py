"""Central's judge of pending INT8 candidates on real heartbeat payloads (decoded as central
decodes them): pooled agreement promotes once its lower bound clears the threshold, one node
never promotes or rejects for the others, a confident disagreement rejects, and a candidate
decided already is not judged again. The re-issued manifest is ``test_pending_manifests``'."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest

from central.quantize.verdict import z_score
from central.rollout.promotion import PromotionWatch, prove
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.mqtt.fast import decode_heartbeat
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, Event, Heartbeat, ModelInfo, ShadowInfo

INT8 = "int8-s8s8-qdq"
_seq = itertools.count()


def _manifest() -> Manifest:
    int8 = ArtifactRef(
        artifact=INT8, sha256="b" * 64, size=1, chunks=[ChunkRef(digest="b" * 64, size=1)],
        quantization={"guard": {"threshold": 0.97, "confidence": 0.95}},
    )  # fmt: skip
    return Manifest(
        name="m", version="1", sha256="a" * 64, size=1, chunks=[ChunkRef(digest="a" * 64, size=1)],
        created_at="2026-12-05T00:00:00Z", pending=[int8],
    )  # fmt: skip


class Watch:
    """A ``PromotionWatch`` over one pending version, recording what it decided."""

    def __init__(self, holders: int = 2) -> None:
        self.events: list[Event] = []
        self.decided: list[tuple[str, str]] = []
        self.manifest: Manifest | None = _manifest()
        self.watch = PromotionWatch(
            lambda n, v: self.manifest if (n, v) == ("m", "1") else None,
            promote=lambda m, v, a, e: self._decide("promoted", a),
            reject=lambda m, v, a, e: self._decide("rejected", a),
            emit=self.events.append,
            holders=lambda key: holders,
        )

    def _decide(self, status: str, artifact: str) -> bool:
        self.decided.append((status, artifact))
        self.manifest = None  # re-issued: no longer pending
        return True

    def beat(self, node_id: str, samples: int, agree: int, candidate: str = INT8) -> None:
        cosine = 0.9999 if agree == samples else 0.8
        shadow = ShadowInfo(
            candidate=candidate, samples=samples, top1_agree=agree, top1_samples=samples, measure="cosine",
            measure_sum=samples * cosine, measure_sumsq=samples * cosine * cosine,
        )  # fmt: skip
        choice = ArtifactChoiceInfo(artifact="fp32", source="only")
        model = ModelInfo(name="m", version="1", state="ready", choice=choice, shadow=shadow)
        hb = Heartbeat(node_id=node_id, bdseq=0, seq=next(_seq), ts=int(time.time() * 1000), interval_s=1.0,
                       models=[model])  # fmt: skip
        self.watch.harvest(node_id, decode_heartbeat(hb.model_dump_json().encode()))
        asyncio.run(self.watch.judge())

    def report(self) -> dict[str, Any]:
        return dict(self.watch.report("m", "1").get(INT8, {}))


def test_proof_needs_every_measures_lower_bound_at_the_threshold() -> None:
    z = z_score(0.999)
    few = prove(ShadowInfo(top1_agree=100, top1_samples=100), 0.97, z)
    assert not few.proven and "does not yet reach" in few.reason  # 100 of 100 prove ~91 % at 99.9 %
    many = prove(ShadowInfo(top1_agree=400, top1_samples=400), 0.97, z)
    assert many.proven and many.measures["top1"][1] >= 0.97
    # top-1 alone would prove it; a poor continuous measure holds it back
    mixed = ShadowInfo(top1_agree=400, top1_samples=400, samples=400, measure="cosine", measure_sum=400 * 0.9,
                       measure_sumsq=400 * 0.81 + 1.0)  # fmt: skip
    assert not prove(mixed, 0.97, z).proven


def test_pooled_agreement_promotes_once_it_is_proven_across_nodes() -> None:
    w = Watch(holders=2)
    w.beat("edge-1", 150, 150)
    w.beat("edge-2", 150, 150)
    assert w.decided == [] and w.report()["status"] == "pending" and w.report()["nodes"] == 2
    w.beat("edge-1", 400, 400)
    w.beat("edge-2", 400, 400)
    assert w.decided == [("promoted", INT8)]
    [event] = w.events
    assert event.type == "int8_promoted" and event.detail["artifact"] == INT8 and event.detail["nodes"] == 2
    assert w.report()["status"] == "promoted"


def test_one_node_never_promotes_for_the_others() -> None:
    w = Watch(holders=3)
    w.beat("edge-1", 100_000, 100_000)  # proves it alone, but two other nodes serve the version
    assert w.decided == []
    w.beat("edge-2", 10, 10)  # pooled it holds, yet not with edge-1 left out
    assert w.decided == []
    w.beat("edge-2", 400, 400)
    assert w.decided == [("promoted", INT8)]


def test_a_node_alone_decides_when_it_is_the_only_one_serving() -> None:
    w = Watch(holders=1)
    w.beat("edge-1", 400, 400)
    assert w.decided == [("promoted", INT8)]


@pytest.mark.parametrize("holders", [1, 3])
def test_confident_disagreement_rejects(holders: int) -> None:
    w = Watch(holders=holders)
    w.beat("edge-1", 40, 20)
    if holders > 1:
        assert w.decided == []  # one node's counts reject nothing for the others
        w.beat("edge-2", 40, 20)
    assert w.decided == [("rejected", INT8)]
    assert w.events[-1].type == "int8_rejected" and w.events[-1].detail["flagged"] is True


def test_a_decided_candidate_is_no_longer_judged() -> None:
    w = Watch(holders=1)
    w.beat("edge-1", 400, 400)
    w.beat("edge-1", 800, 0)  # counts still arriving for a manifest re-issued meanwhile
    assert w.decided == [("promoted", INT8)] and len(w.events) == 1


def test_counts_of_another_artifact_or_the_served_one_are_not_a_candidates() -> None:
    w = Watch(holders=1)
    w.beat("edge-1", 400, 400, candidate="int8-invented")
    assert w.decided == [] and w.watch.report("m", "1") == {}
