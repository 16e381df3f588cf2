"""ModelRepository: load, warm up, swap with zero failed requests, survive bad versions."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_node.errors import InvalidInputs, ModelNotFound, ModelNotReady, ModelUnavailable
from edge_node.inference.repository import ModelRepository
from edge_node.inference.session import SessionFactory
from edge_node.settings import BatchSettings
from fleetwire.manifest import Manifest, TensorSpec
from modelfleet.zoo import build_mlp

WIDTH = 32
CPU = ["CPUExecutionProvider"]


def manifest_for(path: Path, version: str, name: str = "mlp", width: int = WIDTH) -> Manifest:
    data = path.read_bytes()
    return Manifest(
        name=name,
        version=version,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        chunks=[],
        inputs=[TensorSpec(name="input", dtype="float32", shape=[-1, width])],
        outputs=[TensorSpec(name="logits", dtype="float32", shape=[-1, 10])],
        created_at="2026-01-01T00:00:00Z",
    )


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """v1 and v2 differ only in the head (head_seed), so their outputs tell them apart."""
    d = tmp_path_factory.mktemp("models")
    return {
        v: build_mlp(d / f"{v}.onnx", width=WIDTH, hidden_layers=2, head_seed=i) for i, v in enumerate(["v1", "v2"])
    }


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[ModelRepository]:
    r = ModelRepository(
        SessionFactory(tmp_path / "opt", CPU),
        batching=BatchSettings(max_batch_size=16, max_queue_delay_ms=2.0),
        retire_grace_s=0.2,
    )
    yield r
    await r.close()


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    return np.asarray(ort.InferenceSession(str(path), providers=CPU).run(None, {"input": x})[0])


async def test_load_then_ready_and_infer(repo: ModelRepository, versions: dict[str, Path]) -> None:
    assert not repo.ready()
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    model = repo.get("mlp")
    assert (model.name, model.version, model.state, model.error) == ("mlp", "v1", "ready", None)
    assert model.cache_hit is False
    assert repo.ready()
    x = np.random.default_rng(0).standard_normal((3, WIDTH), dtype=np.float32)
    out = await model.infer({"input": x})
    np.testing.assert_allclose(out["logits"], reference(versions["v1"], x), rtol=1e-5, atol=1e-6)
    assert repo.get("mlp", "v1") is model
    assert [m.version for m in repo.models()] == ["v1"]
    with pytest.raises(ModelNotFound):
        repo.get("nope")
    with pytest.raises(ModelNotFound):
        repo.get("mlp", "v9")
    with pytest.raises(InvalidInputs):
        await model.infer({"input": x.astype(np.float64)})


async def test_swap_under_load_has_zero_failures(repo: ModelRepository, versions: dict[str, Path]) -> None:
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    v1 = repo.get("mlp")
    assert v1.session is not None
    v1_session = weakref.ref(v1.session)
    x = np.random.default_rng(1).standard_normal((1, WIDTH), dtype=np.float32)
    expected = {v: reference(p, x) for v, p in versions.items()}
    assert not np.allclose(expected["v1"], expected["v2"])

    switched = asyncio.Event()

    async def client(straddle: bool = False) -> str:
        model = repo.get("mlp")
        # Like reading the request body between get and infer; a straddler resolves v1
        # and calls infer only after the switch to v2 has happened.
        await (switched.wait() if straddle else asyncio.sleep(0.005))
        out = (await model.infer({"input": x}))["logits"]
        matches = [v for v, e in expected.items() if np.allclose(out, e, rtol=1e-5, atol=1e-6)]
        assert matches == [model.version]
        return model.version

    tasks: list[asyncio.Task[str]] = []
    halfway = asyncio.Event()

    async def traffic() -> None:
        while len(tasks) < 200:
            tasks.append(asyncio.create_task(client()))
            if len(tasks) == 100:
                halfway.set()
            await asyncio.sleep(0.0005)

    producer = asyncio.create_task(traffic())
    await halfway.wait()
    straddlers = [asyncio.create_task(client(straddle=True)) for _ in range(20)]
    await asyncio.sleep(0)
    await repo.load(manifest_for(versions["v2"], "v2"), versions["v2"])
    assert repo.get("mlp").version == "v2"  # switched at once
    switched.set()
    await producer
    served = await asyncio.gather(*tasks)  # raises if any request failed
    assert len(served) == 200
    assert served.count("v1") >= 100 and served.count("v2") > 0, served
    assert await asyncio.gather(*straddlers) == ["v1"] * 20

    after = await repo.get("mlp").infer({"input": x})
    np.testing.assert_allclose(after["logits"], expected["v2"], rtol=1e-5, atol=1e-6)
    await repo.wait_retirements()
    assert v1.state == "retired" and v1.session is None
    gc.collect()
    assert v1_session() is None, "v1's session was not released"
    with pytest.raises(ModelUnavailable):
        await v1.infer({"input": x})
    with pytest.raises(ModelNotFound):
        repo.get("mlp", "v1")


async def test_old_version_serves_by_name_during_grace(repo: ModelRepository, versions: dict[str, Path]) -> None:
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    await repo.load(manifest_for(versions["v2"], "v2"), versions["v2"])
    assert repo.get("mlp", "v1").state == "ready"  # explicit version, still in grace
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])  # rollback inside grace
    assert repo.get("mlp").version == "v1"
    await repo.wait_retirements()
    assert repo.get("mlp").state == "ready"
    assert {m.version: m.state for m in repo.models()} == {"v1": "ready", "v2": "retired"}


async def test_failed_version_keeps_last_good_serving(
    repo: ModelRepository, versions: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await repo.load(manifest_for(versions["v2"], "v2"), versions["v2"])
    corrupt = tmp_path / "v3.onnx"
    corrupt.write_bytes(versions["v2"].read_bytes()[:5000])  # truncated download
    with caplog.at_level(logging.WARNING, logger="edge_node.inference.repository"):
        await repo.load(manifest_for(corrupt, "v3"), corrupt)  # must not raise
    assert "v3 failed to load" in caplog.text and "version v2 keeps serving" in caplog.text
    assert repo.get("mlp").version == "v2"
    assert repo.ready()
    with pytest.raises(ModelNotReady) as caught:
        repo.get("mlp", "v3")
    assert caught.value.state == "failed" and caught.value.reason
    states = {m.version: (m.state, m.error) for m in repo.models()}
    assert states["v2"] == ("ready", None)
    assert states["v3"][0] == "failed" and states["v3"][1]
    out = await repo.get("mlp").infer({"input": np.zeros((2, WIDTH), np.float32)})
    assert out["logits"].shape == (2, 10)


async def test_first_version_failing_means_not_ready(repo: ModelRepository, tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    await repo.load(manifest_for(bad, "v1", name="broken"), bad)
    assert not repo.ready()
    with pytest.raises(ModelNotReady, match="failed"):
        repo.get("broken")


async def test_session_signature_wins_over_manifest(repo: ModelRepository, versions: dict[str, Path]) -> None:
    wrong = manifest_for(versions["v1"], "v1", width=99)
    await repo.load(wrong, versions["v1"])
    model = repo.get("mlp")
    assert model.manifest.inputs == [TensorSpec(name="input", dtype="float32", shape=[-1, WIDTH])]


async def test_warm_up_uses_cache_on_second_repository(tmp_path: Path, versions: dict[str, Path]) -> None:
    for expected_hit in (False, True):
        r = ModelRepository(SessionFactory(tmp_path / "opt", CPU), retire_grace_s=0)
        await r.load(manifest_for(versions["v1"], "v1"), versions["v1"])
        assert r.get("mlp").cache_hit is expected_hit
        await r.close()


async def test_unload_and_close(repo: ModelRepository, versions: dict[str, Path]) -> None:
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    model = repo.get("mlp")
    await repo.unload("mlp")
    assert model.state == "retired" and model.session is None
    with pytest.raises(ModelNotFound):
        repo.get("mlp")
    assert repo.models() == []


async def test_metrics_text_has_the_counters(repo: ModelRepository, versions: dict[str, Path]) -> None:
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    model = repo.get("mlp")
    await asyncio.gather(*(model.infer({"input": np.ones((1, WIDTH), np.float32)}) for _ in range(8)))
    text = repo.render_metrics().decode()
    assert 'modelfleet_inference_requests_total{model="mlp",outcome="ok",version="v1"} 8.0' in text
    assert 'modelfleet_inference_batch_size_bucket{le="1.0",model="mlp",version="v1"}' in text
    assert "modelfleet_inference_seconds_count" in text
    assert "modelfleet_inference_queue_seconds_count" in text
    assert 'modelfleet_inference_queue_rows{model="mlp",version="v1"}' in text


async def test_batching_disabled_runs_alone(tmp_path: Path, versions: dict[str, Path]) -> None:
    r = ModelRepository(SessionFactory(tmp_path / "opt", CPU), batching=BatchSettings(enabled=False))
    await r.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    model = r.get("mlp")
    await asyncio.gather(*(model.infer({"input": np.ones((2, WIDTH), np.float32)}) for _ in range(6)))
    text = r.render_metrics().decode()
    assert 'modelfleet_inference_batch_size_sum{model="mlp",version="v1"} 12.0' in text
    assert 'modelfleet_inference_batch_size_count{model="mlp",version="v1"} 6.0' in text
    await r.close()


async def test_a_staged_version_switches_at_its_instant_and_a_moved_instant_counts(
    repo: ModelRepository, versions: dict[str, Path]
) -> None:
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    first = time.time() + 30
    loading = asyncio.create_task(repo.load(manifest_for(versions["v2"], "v2"), versions["v2"], switch_at=first))
    await asyncio.sleep(0)  # the load is under way (bringing the session up): the instant moves now
    moved = time.time() + 1.0
    await repo.load(manifest_for(versions["v2"], "v2"), versions["v2"], switch_at=moved)
    for _ in range(500):
        if any(m.version == "v2" and m.state == "staged" for m in repo.models()):
            break
        await asyncio.sleep(0.01)
    assert repo.get("mlp").version == "v1"  # loaded beside it, not serving yet
    await asyncio.wait_for(loading, 10)
    switched = next(m for m in repo.models() if m.version == "v2").switched_at
    assert switched is not None and moved <= switched < moved + 0.5
    assert repo.get("mlp").version == "v2"


async def test_a_load_cancelled_while_its_session_comes_up_leaves_nothing_behind(
    repo: ModelRepository, versions: dict[str, Path]
) -> None:
    await repo.load(manifest_for(versions["v1"], "v1"), versions["v1"])
    loading = asyncio.create_task(repo.load(manifest_for(versions["v2"], "v2"), versions["v2"]))
    await asyncio.sleep(0)
    loading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loading
    assert all(m.version != "v2" or m.state == "retired" for m in repo.models())
    await repo.load(manifest_for(versions["v2"], "v2"), versions["v2"])  # loads again, not "loading" for ever
    assert repo.get("mlp").version == "v2"
