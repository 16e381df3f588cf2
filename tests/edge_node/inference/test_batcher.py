"""DynamicBatcher: rows in, own rows out; bounded, prioritised, cancellable, drained."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client import CollectorRegistry

from edge_node.errors import (
    InferenceFailed,
    InvalidRequestData,
    ModelUnavailable,
    QueueFull,
)
from edge_node.inference.batcher import DynamicBatcher, Tensors
from edge_node.inference.metrics import ModelMetrics, render
from modelfleet.zoo import build_mlp

WIDTH = 16


class Recorder:
    """A ``run`` that doubles its input, records every batch and can be held."""

    def __init__(self, fail_on: float | None = None) -> None:
        self.batches: list[np.ndarray] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.fail_on = fail_on

    def __call__(self, inputs: Tensors) -> Tensors:
        self.started.set()
        self.gate.wait(10)
        x = inputs["x"]
        self.batches.append(x.copy())
        self.threads.add(threading.current_thread().name)
        if self.fail_on is not None and (x == self.fail_on).any():
            raise ValueError("poisoned batch")
        return {"y": x * 2, "rowsum": x.sum(axis=1)}

    @property
    def sizes(self) -> list[int]:
        return [len(b) for b in self.batches]


def rows(first: float, n: int = 1, width: int = 4) -> Tensors:
    return {"x": np.full((n, width), first, dtype=np.float32) + np.arange(n, dtype=np.float32)[:, None]}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    path = build_mlp(tmp_path_factory.mktemp("m") / "mlp.onnx", width=WIDTH, hidden_layers=1)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def session_run(session: ort.InferenceSession, sizes: list[int]) -> Callable[[Tensors], Tensors]:
    def run(inputs: Tensors) -> Tensors:
        sizes.append(len(inputs["input"]))
        return {"logits": session.run(None, inputs)[0]}

    return run


async def test_64_concurrent_callers_get_exactly_their_rows(session: ort.InferenceSession) -> None:
    sizes: list[int] = []
    batcher = DynamicBatcher(session_run(session, sizes), max_batch_size=32, max_queue_delay_s=0.01)
    rng = np.random.default_rng(7)
    requests = [rng.standard_normal((int(rng.integers(1, 5)), WIDTH), dtype=np.float32) for _ in range(64)]
    results = await asyncio.gather(*(batcher.submit({"input": x}) for x in requests))
    for x, out in zip(requests, results, strict=True):
        alone = session.run(None, {"input": x})[0]
        assert out["logits"].shape == alone.shape
        np.testing.assert_allclose(out["logits"], alone, rtol=1e-5, atol=1e-6)
    assert max(sizes) > 1 and max(sizes) <= 32
    assert sum(sizes) == sum(len(x) for x in requests)
    await batcher.close()


async def test_rows_come_back_exact_and_in_order() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=32, max_queue_delay_s=0.01)
    results = await asyncio.gather(*(batcher.submit(rows(100.0 * i, n=1 + i % 3)) for i in range(64)))
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], rows(100.0 * i, n=1 + i % 3)["x"] * 2)
        assert out["rowsum"].shape == (1 + i % 3,)
    assert max(run.sizes) > 1
    assert "MainThread" not in run.threads
    await batcher.close()


async def test_mixed_sizes_including_larger_than_max() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=32, max_queue_delay_s=0.01)
    sizes = [1, 3, 40, 1, 70, 3]
    results = await asyncio.gather(*(batcher.submit(rows(1000.0 * i, n)) for i, n in enumerate(sizes)))
    for i, (n, out) in enumerate(zip(sizes, results, strict=True)):
        np.testing.assert_array_equal(out["y"], rows(1000.0 * i, n)["x"] * 2)
    assert max(run.sizes) <= 32
    assert sum(run.sizes) == sum(sizes)
    await batcher.close()


async def test_different_shapes_are_never_concatenated() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=32, max_queue_delay_s=0.01)
    widths = [4, 8, 4, 8, 4, 2]
    results = await asyncio.gather(*(batcher.submit(rows(float(i), 2, width=w)) for i, w in enumerate(widths)))
    for i, (w, out) in enumerate(zip(widths, results, strict=True)):
        assert out["y"].shape == (2, w)
        np.testing.assert_array_equal(out["y"], rows(float(i), 2, width=w)["x"] * 2)
    assert len({b.shape[1] for b in run.batches}) == 3
    await batcher.close()


async def test_queue_full_is_immediate_with_retry_hint() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = DynamicBatcher(run, max_batch_size=2, max_queue_delay_s=0.0, max_queue_rows=4)
    running = asyncio.create_task(batcher.submit(rows(0.0, 2)))
    await asyncio.to_thread(run.started.wait, 5)  # the first batch holds the only slot
    queued = [asyncio.create_task(batcher.submit(rows(float(i), 2))) for i in (1, 2)]
    await asyncio.sleep(0)
    assert batcher.queued_rows == 4
    with pytest.raises(QueueFull) as caught:
        await batcher.submit(rows(9.0))
    assert caught.value.retry_after_s > 0
    run.gate.set()
    await asyncio.gather(running, *queued)
    await batcher.close()


async def test_higher_priority_runs_first_fifo_within() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = DynamicBatcher(run, max_batch_size=1, max_queue_delay_s=0.0)
    first = asyncio.create_task(batcher.submit(rows(-1.0)))
    await asyncio.to_thread(run.started.wait, 5)
    order = [(0, 10.0), (5, 20.0), (1, 30.0), (5, 21.0), (0, 11.0)]
    tasks = [asyncio.create_task(batcher.submit(rows(v), priority=p)) for p, v in order]
    await asyncio.sleep(0)
    run.gate.set()
    await asyncio.gather(first, *tasks)
    assert [float(b[0, 0]) for b in run.batches] == [-1.0, 20.0, 21.0, 30.0, 10.0, 11.0]
    await batcher.close()


async def test_a_request_that_fails_its_batch_fails_alone() -> None:
    """The batch fails as a whole; each of its requests then runs alone, and only the one
    whose data the run refused (a ValueError here) fails: a 400, counted as invalid."""
    run = Recorder(fail_on=13.0)
    registry = CollectorRegistry()
    batcher = DynamicBatcher(
        run, max_batch_size=32, max_queue_delay_s=0.05, metrics=ModelMetrics(registry, "m", "v1"), name="m"
    )
    values = (1.0, 13.0, 2.0, 3.0)
    results = await asyncio.gather(*(batcher.submit(rows(v)) for v in values), return_exceptions=True)
    assert run.sizes == [4, 1, 1, 1, 1]  # the batch, then each request alone
    assert isinstance(results[1], InvalidRequestData) and "poisoned batch" in str(results[1])
    for value, result in zip(values, results, strict=True):
        if value != 13.0:
            assert isinstance(result, dict), result
            np.testing.assert_array_equal(result["y"], rows(value)["x"] * 2)
    out = await batcher.submit(rows(4.0))  # the batcher survives
    np.testing.assert_array_equal(out["y"], rows(4.0)["x"] * 2)
    await batcher.close()
    text = render(registry).decode()
    assert 'modelfleet_inference_requests_total{model="m",outcome="invalid",version="v1"} 1.0' in text
    assert 'modelfleet_inference_requests_total{model="m",outcome="ok",version="v1"} 4.0' in text
    assert 'outcome="error"' not in text


async def test_a_failure_of_the_node_is_an_inference_failure_for_every_request() -> None:
    """A run that fails whatever the data (here a RuntimeError, as a broken device would
    raise) fails every request, each as InferenceFailed (500), counted as an error."""

    def broken(inputs: Tensors) -> Tensors:
        raise RuntimeError("device lost")

    registry = CollectorRegistry()
    batcher = DynamicBatcher(broken, max_queue_delay_s=0.05, metrics=ModelMetrics(registry, "m", "v1"), name="m")
    results = await asyncio.gather(*(batcher.submit(rows(float(v))) for v in range(3)), return_exceptions=True)
    assert all(isinstance(r, InferenceFailed) and "device lost" in str(r) for r in results), results
    await batcher.close()
    assert (
        'modelfleet_inference_requests_total{model="m",outcome="error",version="v1"} 3.0' in render(registry).decode()
    )


async def test_cancelled_caller_is_removed_from_queue() -> None:
    run = Recorder()
    run.gate.clear()
    batcher = DynamicBatcher(run, max_batch_size=1, max_queue_delay_s=0.0)
    first = asyncio.create_task(batcher.submit(rows(1.0)))
    await asyncio.to_thread(run.started.wait, 5)
    doomed = asyncio.create_task(batcher.submit(rows(666.0, 3)))
    kept = asyncio.create_task(batcher.submit(rows(2.0)))
    await asyncio.sleep(0)
    assert batcher.queued_rows == 4
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert batcher.queued_rows == 1
    run.gate.set()
    await asyncio.gather(first, kept)
    assert all(666.0 not in b for b in run.batches)
    await batcher.close()


async def test_close_drains_then_refuses() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=4, max_queue_delay_s=1.0)  # close must not wait the delay
    tasks = [asyncio.create_task(batcher.submit(rows(float(i)))) for i in range(10)]
    await asyncio.sleep(0)
    await asyncio.wait_for(batcher.close(), 5)
    assert all(t.done() and not t.exception() for t in tasks)
    with pytest.raises(ModelUnavailable):
        await batcher.submit(rows(1.0))


async def test_batch_size_one_means_no_batching() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=1, max_queue_delay_s=0.0)
    await asyncio.gather(*(batcher.submit(rows(float(i))) for i in range(20)))
    assert run.sizes == [1] * 20
    await batcher.close()


async def test_unsplit_oversized_request_runs_alone_and_whole() -> None:
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=1, max_queue_delay_s=0.0, split_oversized=False)
    results = await asyncio.gather(*(batcher.submit(rows(10.0 * i, 3)) for i in range(4)))
    assert run.sizes == [3, 3, 3, 3]
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], rows(10.0 * i, 3)["x"] * 2)
    await batcher.close()


async def test_concurrent_batches_when_configured() -> None:
    barrier = threading.Barrier(2, timeout=5)

    def run(inputs: Tensors) -> Tensors:
        barrier.wait()  # only passes if two batches run at once
        return {"y": inputs["x"]}

    batcher = DynamicBatcher(run, max_batch_size=1, max_queue_delay_s=0.0, max_concurrent_batches=2)
    await asyncio.gather(batcher.submit(rows(1.0)), batcher.submit(rows(2.0)))
    await batcher.close()


async def test_metrics_are_recorded() -> None:
    registry = CollectorRegistry()
    metrics = ModelMetrics(registry, "m", "v1")
    run = Recorder()
    run.gate.clear()
    batcher = DynamicBatcher(run, max_batch_size=2, max_queue_delay_s=0.0, max_queue_rows=2, metrics=metrics)
    first = asyncio.create_task(batcher.submit(rows(0.0, 2)))
    await asyncio.to_thread(run.started.wait, 5)
    second = asyncio.create_task(batcher.submit(rows(1.0, 2)))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        await batcher.submit(rows(2.0))
    run.gate.set()
    await asyncio.gather(first, second)
    await batcher.close()
    text = render(registry).decode()
    assert 'modelfleet_inference_requests_total{model="m",outcome="ok",version="v1"} 2.0' in text
    assert 'modelfleet_inference_requests_total{model="m",outcome="queue_full",version="v1"} 1.0' in text
    assert 'modelfleet_inference_batch_size_count{model="m",version="v1"} 2.0' in text
    assert "modelfleet_inference_queue_seconds_bucket" in text
    assert "modelfleet_inference_seconds_sum" in text
    assert 'modelfleet_inference_queue_rows{model="m",version="v1"} 0.0' in text
