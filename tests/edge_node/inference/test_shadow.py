"""ShadowSampler: live requests of an INT8 version run again on FP32 and counted (real sessions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_node.inference.shadow import ShadowSampler, reference_session, shadow_reference
from fleetwire.manifest import ArtifactRef, Manifest, TensorSpec
from modelfleet.zoo import build_mlp

WIDTH = 16
OUTPUTS = [TensorSpec(name="logits", dtype="float32", shape=[-1, 10])]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mlp(tmp_path_factory.mktemp("shadow") / "mlp.onnx", width=WIDTH, hidden_layers=1)


@pytest.fixture
def sampler_of(mlp: Path) -> Iterator[object]:
    made: list[ShadowSampler] = []

    def make(
        sample: float, queue_size: int = 64, path: Path = mlp, batch_rows: int = 32, cpu_share: float = 0.0
    ) -> ShadowSampler:
        sampler = ShadowSampler(
            reference_session(path), OUTPUTS, sample=sample, queue_size=queue_size, gather_s=0.2,
            batch_rows=batch_rows, cpu_share=cpu_share,
        )  # fmt: skip
        made.append(sampler)
        return sampler

    yield make
    for s in made:
        s.close()


def _request(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((rows, WIDTH)).astype(np.float32)}


def test_identical_outputs_agree_fully(mlp: Path, sampler_of) -> None:  # type: ignore[no-untyped-def]
    served = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
    sampler = sampler_of(1.0)
    for seed in range(5):  # gathered and run on FP32 as one batch of 15 rows
        inputs = _request(3, seed)
        sampler.offer(inputs, {"logits": served.run(None, inputs)[0]})
    sampler.join()
    info = sampler.info()
    assert info.samples == 15 and info.top1_samples == 15 and info.top1_agree == 15
    assert info.measure == "cosine" and info.measure_sum == pytest.approx(15.0)
    assert info.measure_sumsq == pytest.approx(15.0) and info.dropped == 0 and info.reference == "fp32"


def test_a_disagreement_is_counted(mlp: Path, sampler_of) -> None:  # type: ignore[no-untyped-def]
    served = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
    sampler = sampler_of(1.0)
    inputs = _request(4)
    logits = served.run(None, inputs)[0]
    wrong = logits.copy()
    wrong[0] = -wrong[0]  # row 0 now decides another class and points the other way
    sampler.offer(inputs, {"logits": wrong})
    sampler.join()
    info = sampler.info()
    assert info.samples == 4 and info.top1_agree == 3 and info.top1_samples == 4
    assert info.measure_sum == pytest.approx(3.0)  # cosines 1, 1, 1 and -1 floored at 0


def test_requests_of_other_shapes_are_compared_one_by_one(mlp: Path, sampler_of) -> None:  # type: ignore[no-untyped-def]
    sampler = sampler_of(1.0)
    served = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
    for rows in (1, 4, 2):
        inputs = _request(rows, rows)
        sampler.offer(inputs, {"logits": served.run(None, inputs)[0]})
    sampler.offer({"input": np.zeros((1, WIDTH + 1), dtype=np.float32)}, {"logits": np.zeros((1, 10), np.float32)})
    sampler.join()
    assert sampler.info().samples == 7 and sampler.info().top1_agree == 7  # the odd one fails alone, uncounted


def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Path, sampler_of) -> None:  # type: ignore[no-untyped-def]
    slow = _slow_model(tmp_path / "slow.onnx")
    sampler = sampler_of(1.0, queue_size=1, path=slow, batch_rows=1)  # one sample per slow run
    inputs = {"input": np.ones((1, 512), dtype=np.float32)}
    outputs = {"logits": np.ones((1, 10), dtype=np.float32)}
    for _ in range(50):
        sampler.offer(inputs, outputs)
    sampler.join()
    info = sampler.info()
    assert info.dropped > 0 and info.samples + info.dropped == 50


def test_beyond_its_cpu_budget_the_reference_rests_and_samples_are_dropped(mlp: Path, sampler_of) -> None:  # type: ignore[no-untyped-def]
    sampler = sampler_of(1.0, queue_size=1, batch_rows=1, cpu_share=1e-6)
    outputs = {"logits": np.zeros((1, 10), dtype=np.float32)}
    sampler.offer(_request(1), outputs)
    sampler.join()  # compared; the worker now rests far longer than this test runs
    for _ in range(5):
        sampler.offer(_request(1), outputs)
    info = sampler.info()
    assert info.samples == 1 and info.dropped == 4  # one waits in the queue, the rest are dropped
    sampler.close()  # a resting worker stops at once


def test_a_zero_rate_samples_nothing(mlp: Path, sampler_of) -> None:  # type: ignore[no-untyped-def]
    sampler = sampler_of(0.0)
    for _ in range(100):
        sampler.offer(_request(1), {"logits": np.zeros((1, 10), dtype=np.float32)})
    sampler.join()
    assert sampler.info().samples == 0 and sampler.info().dropped == 0


def test_only_a_quantized_artifact_with_fp32_beside_it_is_shadowed() -> None:
    def ref(name: str, quantized: bool) -> ArtifactRef:
        return ArtifactRef(artifact=name, sha256="0" * 64, size=1, chunks=[],
                           quantization={"method": "static"} if quantized else None)  # fmt: skip

    int8, fp32 = ref("int8-s8s8-qdq", True), ref("fp32", False)
    m = Manifest(
        name="m", version="1", artifact=int8.artifact, sha256=int8.sha256, size=1, chunks=[],
        quantization=int8.quantization, alternatives=[fp32], inputs=[], outputs=OUTPUTS,
        created_at="2026-01-01T00:00:00Z",
    )  # fmt: skip
    assert shadow_reference(m, "int8-s8s8-qdq", 0.01) == fp32
    assert shadow_reference(m, "fp32", 0.01) is None
    assert shadow_reference(m, "int8-s8s8-qdq", 0.0) is None
    off = m.model_copy(update={"labels": {"modelfleet.drift_policy": "off"}})
    assert shadow_reference(off, "int8-s8s8-qdq", 0.01) is None
    assert shadow_reference(m.model_copy(update={"alternatives": []}), "int8-s8s8-qdq", 0.01) is None


def _slow_model(path: Path) -> Path:
    """[1, 512] → 10 through 40 512x512 MatMuls: slow enough that a one-slot queue fills."""
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "input"
    for i in range(40):
        w = numpy_helper.from_array((rng.standard_normal((512, 512)) * 0.04).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("MatMul", [current, w.name], [f"h{i}"]))
        current = f"h{i}"
    head = numpy_helper.from_array(rng.standard_normal((512, 10)).astype(np.float32), "head")
    nodes.append(helper.make_node("MatMul", [current, "head"], ["logits"]))
    graph = helper.make_graph(
        nodes, "slow", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], initializer=[*inits, head],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path
