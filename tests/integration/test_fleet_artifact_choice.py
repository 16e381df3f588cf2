"""Each edge serves the fastest artifact on its own hardware: a real central, real edges and a
real Mosquitto. The artifacts differ in speed tenfold and more (``artifact_models``), and
central's default is the slow one, so a node that served the default would be caught.

The first node of a hardware class times all three and serves the fast one; central hears
its verdict in the heartbeat, and the next node of that class fetches and serves only the
chosen artifact; a node of another class (simulated with ``inference.cpu_flags``) times them
itself. A pin (the manifest label ``modelfleet.artifact``) is served whatever the timings."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from central.registry.pipeline import ChunkStep, ManifestStep, PushContext
from central.registry.signing import ManifestSigner
from central.server import CentralServer
from edge_node.inference.artifact_timer import ArtifactChoice
from edge_node.server import EdgeServer
from modelfleet.cli import app
from support.artifact_models import IN, build_fast, build_fp32, build_slow
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for

#: Two simulated CPU classes (the chooser reads these flags instead of /proc/cpuinfo).
VNNI_FLAGS = "fpu avx2 avx512f avx512_vnni"
AVX2_FLAGS = "fpu avx2"
#: Quick timing: speeds differ tenfold, a few rounds decide.
QUICK_CHOICE = {"budget_s": 1.0, "min_rounds": 3, "max_rounds": 6}


class OfferArtifacts:
    """Stands in for the quantize step: the version gets given INT8 artifacts, and central's
    default is ``served`` (the step before chunking, where quantization runs)."""

    name = "offer-artifacts"

    def __init__(self, files: dict[str, Path], served: str) -> None:
        self._files = files
        self._served = served

    def run(self, ctx: PushContext) -> None:
        ctx.artifacts = {"fp32": ctx.upload, **self._files}
        ctx.served_artifact = self._served
        ctx.alternatives = [a for a in ctx.artifacts if a != self._served]


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


def offer_artifacts(server: CentralServer, files: dict[str, Path], served: str) -> None:
    """Make every push to ``server`` carry ``files`` as artifacts, ``served`` the default."""
    steps = server.central.registry.pipeline.steps
    steps.insert(next(i for i, s in enumerate(steps) if isinstance(s, ChunkStep)), OfferArtifacts(files, served))
    steps.insert(
        next(i for i, s in enumerate(steps) if isinstance(s, ManifestStep)) + 1,
        AttachAlternatives(server.central.signer),
    )


@pytest.fixture(scope="module")
def artifact_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("artifacts")
    return {
        "fp32": build_fp32(d / "fp32.onnx"),
        "int8-fast": build_fast(d / "fast.onnx"),
        "int8-slow": build_slow(d / "slow.onnx"),
    }


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    # One owner per chunk: a node then seeds only part of what it does not serve.
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, placement={"replicas": 1}))
    await server.start()
    yield server
    await server.stop()


def _edge_options(broker: MosquittoBroker | None, cpu_flags: str) -> dict[str, Any]:
    options: dict[str, Any] = {"inference": {"cpu_flags": cpu_flags, "choice": QUICK_CHOICE}}
    if broker is not None:
        options["heartbeat"] = {"enabled": True, "interval_s": 0.3}
        options["broker"] = {"host": broker.host, "port": broker.port}
    return options


def _choice(edge: EdgeServer, version: str = "1") -> ArtifactChoice | None:
    """The choice the edge's status document (``/api/v1/status``) reports for ``m:version``."""
    found = edge.edge.status()["artifacts"].get(f"m:{version}")
    return None if found is None else ArtifactChoice.from_json(found)


async def _serving(edge: EdgeServer, version: str = "1") -> ArtifactChoice:
    def ready() -> bool:
        try:
            return edge.edge.repository.get("m", version) is not None
        except Exception:
            return False

    await wait_for(ready, 60, f"m:{version} served on {edge.node_id}")
    choice = _choice(edge, version)
    assert choice is not None
    assert edge.edge.repository.get("m", version).manifest.artifact == choice.artifact  # what really runs
    return choice


async def _infer(edge: EdgeServer) -> None:
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, IN], "data": np.ones(2 * IN).tolist()}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        response = await client.post("/v2/models/m/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["shape"] == [2, 10]


def _chunks_of(server: CentralServer, artifact: str) -> set[str]:
    record = server.central.store.get_version("m", "1")
    assert record is not None
    found = record.manifest.artifact_named(artifact)
    assert found is not None
    return {c.digest for c in found.all_chunks()}


def _owned(edge: EdgeServer) -> set[str]:
    state = edge.edge.follower.state
    assert state is not None
    return {d for v in state.versions for d, owners in v.placement.items() if edge.node_id in owners}


def _cached(edge: EdgeServer, digests: set[str]) -> set[str]:
    return edge.edge.store.has_many(digests)


async def test_a_class_times_once_and_its_verdict_serves_the_next_node(
    mqtt_central: CentralServer,
    mosquitto: MosquittoBroker,
    make_edge: EdgeFactory,
    artifact_files: dict[str, Path],
    tmp_path: Path,
) -> None:
    offer_artifacts(mqtt_central, {k: v for k, v in artifact_files.items() if k != "fp32"}, served="int8-slow")
    edge_a = await make_edge("edge-a", mqtt_central, **_edge_options(mosquitto, VNNI_FLAGS))
    vnni = edge_a.edge.hardware_class
    assert "/avx2+avx512f+avx512_vnni/" in vnni
    async with httpx.AsyncClient(base_url=mqtt_central.http_url, timeout=60) as api:
        response = await push(api, "m", artifact_files["fp32"])
        assert response.status_code == 201, response.text
        assert response.json()["manifest"]["artifact"] == "int8-slow"

        # The first node of its class times all three and serves the fastest, not central's default.
        chosen = await _serving(edge_a)
        assert (chosen.artifact, chosen.source, chosen.reason) == ("int8-fast", "measured", "fastest of 3 on this node")
        assert chosen.hardware_class == vnni and chosen.speedup_b1 is not None and chosen.speedup_b1 > 1.0
        await _infer(edge_a)
        # The losers' chunks are unpinned, except those it owns to seed others.
        fast, slow, fp32 = (_chunks_of(mqtt_central, a) for a in ("int8-fast", "int8-slow", "fp32"))
        assert edge_a.edge.store.pinned() == fast | _owned(edge_a)

        verdicts = mqtt_central.central.verdicts
        await wait_for(lambda: verdicts.get(("m", "1"), vnni) is not None, 20, "central hears the verdict")

        # A second node of the class reuses it: no timing, only the chosen artifact fetched.
        edge_b = await make_edge("edge-b", mqtt_central, **_edge_options(mosquitto, VNNI_FLAGS))
        reused = await _serving(edge_b)
        assert (reused.artifact, reused.source, reused.from_node) == ("int8-fast", "verdict", "edge-a")
        assert reused.reason == f"verdict of class {vnni} from node edge-a"
        assert reused.speedup_b1 == chosen.speedup_b1
        await _infer(edge_b)
        never_needed = (slow | fp32) - fast - _owned(edge_b)
        assert never_needed, "edge-b owns every chunk: the test would prove nothing"
        assert _cached(edge_b, never_needed) == set()

        # Another class (other CPU flags) gets no verdict of the first: it times them itself.
        edge_c = await make_edge("edge-c", mqtt_central, **_edge_options(mosquitto, AVX2_FLAGS))
        avx2 = edge_c.edge.hardware_class
        assert avx2 != vnni and "/avx2/" in avx2
        own = await _serving(edge_c)
        assert (own.artifact, own.source, own.hardware_class) == ("int8-fast", "measured", avx2)
        await wait_for(lambda: verdicts.get(("m", "1"), avx2) is not None, 20, "the second class's verdict")
        listed = (await api.get("/api/v1/verdicts")).json()
        assert {(v["hardware_class"], v["node_id"], v["artifact"]) for v in listed} == {
            (vnni, "edge-a", "int8-fast"),
            (avx2, "edge-c", "int8-fast"),
        }

        # The choice, its speed-up and the reason in the nodes API and `modelfleet nodes`.
        def reported() -> bool:
            views = {v.node_id: v for v in mqtt_central.central.liveness.nodes()}
            return (
                all(
                    any(m.choice is not None for m in views[n].models)
                    for n in ("edge-a", "edge-b", "edge-c")
                    if n in views
                )
                and len(views) == 3
            )

        await wait_for(reported, 20, "choices in every heartbeat")
        nodes = {n["node_id"]: n for n in (await api.get("/api/v1/nodes")).json()}
        assert nodes["edge-b"]["hardware_class"] == vnni
        [served_b] = nodes["edge-b"]["artifacts"]
        assert (served_b["model"], served_b["artifact"], served_b["source"]) == ("m", "int8-fast", "verdict")
        assert served_b["reason"] == f"verdict of class {vnni} from node edge-a"
        assert nodes["edge-a"]["artifacts"][0]["speedup_b8"] == chosen.speedup_b8

    config = tmp_path / "cli-config.toml"
    config.write_text("", encoding="utf-8")
    env = {"MODELFLEET_CONFIG": str(config), "COLUMNS": "400", "MODELFLEET_TOKEN": ""}
    env["MODELFLEET_CENTRAL_URL"] = mqtt_central.http_url
    table = await asyncio.to_thread(CliRunner().invoke, app, ["nodes"], env=env)
    assert table.exit_code == 0, table.output
    assert "ARTIFACT" in table.output and "CLASS" in table.output
    assert "fastest of 3 on this node" in table.output and "from node edge-a" in table.output


async def test_a_pinned_artifact_is_served_even_when_slower_than_fp32(
    central: CentralServer, make_edge: EdgeFactory, artifact_files: dict[str, Path]
) -> None:
    offer_artifacts(central, {k: v for k, v in artifact_files.items() if k != "fp32"}, served="int8-fast")
    edge = await make_edge("edge-a", central, **_edge_options(None, VNNI_FLAGS))
    async with httpx.AsyncClient(base_url=central.http_url, timeout=60) as api:
        response = await push(api, "m", artifact_files["fp32"], label="modelfleet.artifact=int8-slow")
        assert response.status_code == 201, response.text
    pinned = await _serving(edge)
    assert (pinned.artifact, pinned.source, pinned.speedup_b1) == ("int8-slow", "pinned", None)
    await _infer(edge)


async def test_a_node_keeps_its_own_timing_across_a_restart(
    central: CentralServer, make_edge: EdgeFactory, artifact_files: dict[str, Path], tmp_path: Path
) -> None:
    offer_artifacts(central, {k: v for k, v in artifact_files.items() if k != "fp32"}, served="int8-slow")
    edge = await make_edge("edge-a", central, **_edge_options(None, AVX2_FLAGS))
    async with httpx.AsyncClient(base_url=central.http_url, timeout=60) as api:
        assert (await push(api, "m", artifact_files["fp32"])).status_code == 201
    first = await _serving(edge)
    assert (first.artifact, first.source) == ("int8-fast", "measured")
    await edge.stop()

    again = await make_edge("edge-a", central, data_dir=tmp_path / "edge-a", **_edge_options(None, AVX2_FLAGS))
    assert await _serving(again) == first  # served from disk as timed before, nothing re-timed
    stats = again.edge.fetcher.stats
    assert stats.chunks_from_origin == 0 and stats.chunks_from_peers == 0
