"""A pending INT8 candidate promoted on live traffic, measured without a fleet: how many live
requests an edge serves, at a 1 % shadow sample, before central promotes the candidate.

The parts are the ones a fleet runs: the edge's ``ShadowSampler`` (the candidate's session run
on each sampled request and compared with what FP32 served) and central's ``PromotionWatch``
(the sampler's counts arrive as a decoded heartbeat, as from one edge that alone serves the
version). Requests are drawn at the sample rate; only the sampled ones are computed (an
unsampled request changes nothing the judge sees), so the count is the one a real edge would
reach, without serving thousands of FP32 requests here."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from central.quantize.synthetic import Sizes, generated_samples, input_hints
from central.registry.pipeline import PushContext
from central.rollout.promotion import PromotionWatch
from edge_node.inference.shadow import ShadowSampler, reference_session
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.mqtt.fast import decode_heartbeat
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, Event, Heartbeat, ModelInfo

#: The share of live requests an edge runs on the candidate too (``inference.shadow_sample``).
SAMPLE = 0.01
_seq = itertools.count()


def _pending_manifest(ctx: PushContext, candidate: str) -> Manifest:
    """The served FP32 manifest as central stores it: the candidate pending, with its guard report."""
    chunk = [ChunkRef(digest="0" * 64, size=1)]
    ref = ArtifactRef(artifact=candidate, sha256="1" * 64, size=1, chunks=chunk,
                      quantization=ctx.artifact_reports[candidate])  # fmt: skip
    return Manifest(name=ctx.name, version=ctx.version, sha256="0" * 64, size=1, chunks=chunk,
                    created_at="2026-12-05T00:00:00Z", pending=[ref])  # fmt: skip


def _heartbeat(ctx: PushContext, sampler: ShadowSampler) -> Any:
    model = ModelInfo(name=ctx.name, version=ctx.version, state="ready", shadow=sampler.info(),
                      choice=ArtifactChoiceInfo(artifact="fp32", source="only"))  # fmt: skip
    hb = Heartbeat(node_id="edge-1", bdseq=0, seq=next(_seq), ts=int(time.time() * 1000), interval_s=1.0,
                   models=[model])  # fmt: skip
    return decode_heartbeat(hb.model_dump_json().encode())


def live_promotion(
    ctx: PushContext, fp32: Path, *, batch: int, free_dim: int, sample: float = SAMPLE, max_requests: int = 50_000
) -> dict[str, Any]:
    """Live requests of ``batch`` generated rows until ``ctx``'s first pending candidate is
    promoted or rejected (or ``max_requests``): the count, the decision and its evidence."""
    candidate = ctx.pending[0]
    manifest = _pending_manifest(ctx, candidate)
    decided: list[Event] = []
    watch = PromotionWatch(
        lambda n, v: manifest if not decided else None,
        promote=lambda *_: True,
        reject=lambda *_: True,
        emit=decided.append,
        holders=lambda key: 1,
    )
    served = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    sampler = ShadowSampler(reference_session(ctx.artifacts[candidate]), ctx.outputs, sample=1.0, cpu_share=0.0,
                            candidate=candidate, gather_s=0.0)  # fmt: skip
    hints, sizes = input_hints(onnx.load(str(fp32), load_external_data=False)), Sizes(sequence=free_dim)
    rng = np.random.default_rng(7)
    names = [o.name for o in ctx.outputs]
    requests = sampled = 0
    started = time.perf_counter()
    loop = asyncio.new_event_loop()  # the watch's pass is a coroutine (its store calls are awaited)
    try:
        while not decided and requests < max_requests:
            requests += 1
            if rng.random() >= sample:
                continue
            sampled += 1
            inputs = generated_samples(ctx.inputs, batch, seed=1000 + sampled, hints=hints, sizes=sizes)
            outputs = dict(zip(names, served.run(names, inputs), strict=True))
            sampler.offer(inputs, outputs)
            sampler.join()
            watch.harvest("edge-1", _heartbeat(ctx, sampler))
            loop.run_until_complete(watch.judge())
    finally:
        loop.close()
        sampler.close()
    event = decided[0] if decided else None
    return {
        "candidate": candidate,
        "decision": event.type if event else None,
        "promotion_requests": requests if event and event.type == "int8_promoted" else None,
        "requests": requests,
        "sampled_requests": sampled,
        "live_rows": sampler.info().samples,
        "sample": sample,
        "batch": batch,
        "evidence": event.detail if event else watch.report(ctx.name, ctx.version).get(candidate),
        "seconds": round(time.perf_counter() - started, 2),
    }
