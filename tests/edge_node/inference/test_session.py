"""SessionFactory: ENABLE_ALL optimization cached per host and provider set."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edge_node.errors import InvalidInputs
from edge_node.inference.inputs import check_inputs
from edge_node.inference.session import SessionFactory, dummy_inputs, host_fingerprint, session_specs
from fleetwire.manifest import TensorSpec
from modelfleet.zoo import build_mlp

CPU = ["CPUExecutionProvider"]
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mlp(tmp_path_factory.mktemp("m") / "mlp.onnx", width=24, hidden_layers=2)


def logits(session: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    return np.asarray(session.run(None, {"input": x})[0])


def test_cache_miss_then_hit_across_restart(tmp_path: Path, mlp: Path) -> None:
    x = np.random.default_rng(1).standard_normal((5, 24), dtype=np.float32)
    first = SessionFactory(tmp_path / "cache", CPU).create_with_info(mlp, "sha-abc")
    assert not first.cache_hit
    assert first.cache_path is not None and first.cache_path.is_file()

    restarted = SessionFactory(tmp_path / "cache", CPU)  # a new process would build this
    session = restarted.create(mlp, "sha-abc")
    assert restarted.last_cache_hit is True
    assert np.array_equal(logits(session, x), logits(first.session, x))
    plain = ort.InferenceSession(str(mlp), providers=CPU)
    np.testing.assert_allclose(logits(session, x), logits(plain, x), rtol=1e-5, atol=1e-6)


def test_cache_name_carries_key_providers_version_and_host(tmp_path: Path) -> None:
    path = SessionFactory(tmp_path, CPU).cache_path("deadbeef")
    assert path.name.startswith("deadbeef.cpu.")
    assert f"ort{ort.__version__}" in path.name
    assert host_fingerprint() in path.name
    assert path.suffix == ".onnx"
    other = SessionFactory(tmp_path, ["CUDAExecutionProvider", *CPU]).cache_path("deadbeef")
    assert other != path
    assert SessionFactory(tmp_path, CPU).cache_path("a/../b").parent == tmp_path  # no escaping


def test_cache_written_atomically_no_temp_left(tmp_path: Path, mlp: Path) -> None:
    SessionFactory(tmp_path, CPU).create(mlp, "k1")
    assert [p.name for p in tmp_path.iterdir()] == [SessionFactory(tmp_path, CPU).cache_path("k1").name]


def test_corrupt_cache_is_discarded_and_rebuilt(tmp_path: Path, mlp: Path) -> None:
    factory = SessionFactory(tmp_path, CPU)
    factory.cache_path("k2").write_bytes(b"not a model")
    created = factory.create_with_info(mlp, "k2")
    assert not created.cache_hit
    assert SessionFactory(tmp_path, CPU).create_with_info(mlp, "k2").cache_hit


def test_bad_model_raises_and_leaves_no_cache(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(Exception, match=r"(?i)protobuf|invalid|load"):
        SessionFactory(tmp_path / "c", CPU).create(bad, "k3")
    assert list((tmp_path / "c").iterdir()) == []


def test_normal_loads_print_nothing(tmp_path: Path, mlp: Path) -> None:
    """Miss (which serializes an ENABLE_ALL model, normally a warning) and hit: silent."""
    code = f"""
        from pathlib import Path
        from edge_node.inference.session import SessionFactory
        for _ in range(2):
            f = SessionFactory(Path({str(tmp_path)!r}), ["CPUExecutionProvider"])
            f.create(Path({str(mlp)!r}), "quiet")
            print(f.last_cache_hit)
        """
    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True, timeout=90
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["False", "True"]
    assert child.stderr == ""


def test_specs_dummy_inputs_and_checks(mlp: Path) -> None:
    session = ort.InferenceSession(str(mlp), providers=CPU)
    inputs, outputs = session_specs(session)
    assert inputs == [TensorSpec(name="input", dtype="float32", shape=[-1, 24])]
    assert outputs == [TensorSpec(name="logits", dtype="float32", shape=[-1, 10])]
    dummy = dummy_inputs(inputs)
    assert dummy["input"].shape == (1, 24)
    check_inputs(dummy, inputs)
    with pytest.raises(InvalidInputs, match="'input' has datatype FP64; the model expects FP32"):
        check_inputs({"input": dummy["input"].astype(np.float64)}, inputs)
    with pytest.raises(InvalidInputs, match="'input' dimension 1 is 23; the model expects 24"):
        check_inputs({"input": np.zeros((1, 23), np.float32)}, inputs)
    with pytest.raises(InvalidInputs, match="the model has no input 'x'; its inputs are: input"):
        check_inputs({"x": dummy["input"]}, inputs)
