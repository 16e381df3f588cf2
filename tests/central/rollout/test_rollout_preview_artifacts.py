"""The cost preview of a version with two artifacts (FP32 and a pinned INT8) on a real fleet
(central, Mosquitto, three edges, one owner per chunk), rolled out to two of the three
edges: the targets fetch only the pinned artifact, and what they own of FP32 they do not
fetch (nobody asks them for it); the third edge seeds the chunks it owns of both. The
preview must say so, within 5 % per node."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from preview_harness import MAX_ERROR, preview_then_roll_out

from central.registry.pipeline import ChunkStep, ManifestStep, PushContext
from central.registry.signing import ManifestSigner
from central.server import CentralServer
from support.artifact_models import build_fast, build_fp32
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for

ZONES = {"a-1": "a", "a-2": "a", "b-1": "b"}


class OfferArtifacts:
    """Stands in for the quantize step (random weights do not pass the INT8 guard): every
    push gets ``files`` as artifacts besides its FP32, the FP32 central's default."""

    name = "offer-artifacts"

    def __init__(self, files: dict[str, Path]) -> None:
        self._files = files

    def run(self, ctx: PushContext) -> None:
        ctx.artifacts = {"fp32": ctx.upload, **self._files}
        ctx.served_artifact = "fp32"
        ctx.alternatives = list(self._files)


class AttachAlternatives:
    """The served manifest lists the other artifacts as alternatives, signed again."""

    name = "attach-alternatives"

    def __init__(self, signer: ManifestSigner) -> None:
        self._signer = signer

    def run(self, ctx: PushContext) -> None:
        served = ctx.manifests[ctx.served_artifact]
        alternatives = [ctx.manifests[a].served() for a in ctx.alternatives]
        manifest = self._signer.sign(served.model_copy(update={"alternatives": alternatives, "signature": ""}))
        ctx.manifests[ctx.served_artifact] = ctx.manifest = manifest


@pytest.fixture
async def artifact_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    settings = central_settings(
        tmp_path / "central", mqtt=mqtt, broker=broker, rollout={"interval_s": 0.2}, placement={"replicas": 1}
    )
    server = CentralServer(settings)
    steps = server.central.registry.pipeline.steps
    fast = build_fast(tmp_path / "fast.onnx")
    steps.insert(next(i for i, s in enumerate(steps) if isinstance(s, ChunkStep)), OfferArtifacts({"int8-fast": fast}))
    at = next(i for i, s in enumerate(steps) if isinstance(s, ManifestStep)) + 1
    steps.insert(at, AttachAlternatives(server.central.signer))
    await server.start()
    yield server
    await server.stop()


async def test_preview_of_a_pinned_artifact_counts_seeding_but_not_unserved_owned_chunks(
    artifact_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    options = {
        "heartbeat": {"enabled": True, "interval_s": 0.3},
        "broker": {"host": mosquitto.host, "port": mosquitto.port},
    }
    edges = {n: await make_edge(n, artifact_central, labels={"zone": z}, **options) for n, z in ZONES.items()}
    await wait_for(lambda: len(artifact_central.central.directory.nodes()) == len(ZONES), what="registered edges")
    fp32 = build_fp32(tmp_path / "fp32.onnx")
    async with httpx.AsyncClient(base_url=artifact_central.http_url, timeout=30.0) as api:
        pushed = await push(api, "m", fp32, version="1", activate="false", label="modelfleet.artifact=int8-fast")
        assert pushed.status_code == 201, pushed.text
        manifest = pushed.json()["manifest"]
        fast = {c["digest"]: c["size"] for a in manifest["alternatives"] for c in a["chunks"]}
        assert manifest["artifact"] == "fp32" and fast

        run = await preview_then_roll_out(api, edges, "m", "1", ["a-1", "a-2"], selector={"zone": "a"})
        nodes = {n["node_id"]: n for n in run.preview["nodes"]}
        for target in ("a-1", "a-2"):  # the pinned artifact only: no FP32 chunk, owned or not
            assert nodes[target]["artifacts"] == ["int8-fast"] and nodes[target]["bytes_total"] == sum(fast.values())
        seeder = nodes["b-1"]
        assert not seeder["targeted"] and seeder["bytes_total"] > 0  # a third of FP32, give or take
        assert run.worst <= MAX_ERROR, (run.preview["nodes"], run.measured)


async def test_preview_of_artifacts_that_every_node_times(
    artifact_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    options = {
        "heartbeat": {"enabled": True, "interval_s": 0.3},
        "broker": {"host": mosquitto.host, "port": mosquitto.port},
        "inference": {"choice": {"budget_s": 1.0, "min_rounds": 3, "max_rounds": 6}},
    }
    edges = {n: await make_edge(n, artifact_central, labels={"zone": z}, **options) for n, z in ZONES.items()}
    await wait_for(lambda: len(artifact_central.central.directory.nodes()) == len(ZONES), what="registered edges")
    fp32 = build_fp32(tmp_path / "fp32.onnx")
    async with httpx.AsyncClient(base_url=artifact_central.http_url, timeout=30.0) as api:
        pushed = await push(api, "m", fp32, version="1", activate="false")
        assert pushed.status_code == 201, pushed.text
        chunks = {c["digest"]: c["size"] for c in pushed.json()["manifest"]["chunks"]}
        run = await preview_then_roll_out(api, edges, "m", "1", sorted(ZONES))
        for node in run.preview["nodes"]:  # no verdict yet: every node times (so fetches) both
            assert node["artifacts"] == ["fp32", "int8-fast"] and node["bytes_total"] > sum(chunks.values())
        assert run.worst <= MAX_ERROR, (run.preview["nodes"], run.measured)


async def test_preview_after_timing_counts_the_artifacts_a_node_timed_but_does_not_serve(
    artifact_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    """A node that timed v1's artifacts fetched them all and keeps them, whichever it serves;
    v2 shares every chunk with v1 (the same graphs), so it costs nobody anything. Counting
    only the served artifact as held would predict v2's other artifact fetched in full."""
    options = {
        "heartbeat": {"enabled": True, "interval_s": 0.3},
        "broker": {"host": mosquitto.host, "port": mosquitto.port},
        "inference": {"choice": {"budget_s": 1.0, "min_rounds": 3, "max_rounds": 6}},
    }
    edges = {n: await make_edge(n, artifact_central, labels={"zone": z}, **options) for n, z in ZONES.items()}
    await wait_for(lambda: len(artifact_central.central.directory.nodes()) == len(ZONES), what="registered edges")
    fp32 = build_fp32(tmp_path / "fp32.onnx")
    async with httpx.AsyncClient(base_url=artifact_central.http_url, timeout=30.0) as api:
        assert (await push(api, "m", fp32, version="1", activate="false")).status_code == 201
        await preview_then_roll_out(api, edges, "m", "1", sorted(ZONES))
        await wait_for(
            lambda: len(artifact_central.central.liveness.ready_endpoints("m", "1")) == len(ZONES), 30, "v1 ready"
        )
        assert (await push(api, "m", fp32, version="2", activate="false")).status_code == 201
        run = await preview_then_roll_out(api, edges, "m", "2", sorted(ZONES))
        assert all(n["bytes_total"] == 0 for n in run.preview["nodes"]), run.preview["nodes"]
        assert run.worst <= MAX_ERROR, (run.preview["nodes"], run.measured)
