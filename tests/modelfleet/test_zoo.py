"""The zoo's cached models: real digits classifier, benchmark MLP, atomic cache."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelfleet.zoo import build_bench_model, build_digits, zoo_cache_dir
from modelfleet.zoo.cache import CACHE_ENV, cached_entry, entry_key
from modelfleet.zoo.digits import DigitsModel, onnx_accuracy


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the whole session (other test files use the same path)."""
    return tmp_path_factory.getbasetemp() / "zoo-cache"


@pytest.fixture(scope="session")
def digits(zoo_dir: Path) -> DigitsModel:
    return build_digits(zoo_dir)


def test_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "z"))
    assert zoo_cache_dir() == tmp_path / "z"
    monkeypatch.delenv(CACHE_ENV)
    assert zoo_cache_dir() == Path.home() / ".cache" / "modelfleet" / "zoo"


def test_cached_entry_builds_once_per_version(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(directory: Path) -> None:
        calls.append(directory)
        (directory / "f").write_text(str(len(calls)))

    first = cached_entry("m", "v1", build, tmp_path)
    assert cached_entry("m", "v1", build, tmp_path) == first
    assert len(calls) == 1 and (first / "f").read_text() == "1"
    second = cached_entry("m", "v2", build, tmp_path)
    assert second != first and (second / "f").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([entry_key("m", "v1"), entry_key("m", "v2")])


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def build(directory: Path) -> None:
        (directory / "half").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cached_entry("m", "v1", build, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_entry_key_is_path_safe() -> None:
    assert "/" not in entry_key("a/b", "1.0 beta/2")


def test_digits_is_a_real_classifier(digits: DigitsModel) -> None:
    assert digits.input_name == "input"
    assert digits.test_x.dtype == np.float32 and digits.test_x.shape == (450, 64)
    assert digits.test_y.dtype == np.int64 and digits.test_y.shape == (450,)
    assert digits.test_x.min() >= 0.0 and digits.test_x.max() <= 1.0
    assert digits.fp32_test_accuracy >= 0.95
    assert onnx_accuracy(digits.onnx_path, digits.test_x, digits.test_y) == digits.fp32_test_accuracy


def test_digits_onnx_signature(digits: DigitsModel) -> None:
    model = onnx.load(str(digits.onnx_path))
    onnx.checker.check_model(model)
    (inp,) = model.graph.input
    assert inp.name == "input" and inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim] == [0, 64]
    assert [o.name for o in model.graph.output] == ["label", "probabilities"]
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= 17


def test_digits_calibration_is_the_train_split(digits: DigitsModel) -> None:
    with np.load(digits.calibration_path) as npz:
        assert npz.files == ["input"]
        train = npz["input"]
    assert train.dtype == np.float32 and train.shape == (1347, 64)
    test_rows = {row.tobytes() for row in digits.test_x}
    assert sum(row.tobytes() in test_rows for row in train) < 20  # only duplicate images can collide


def test_digits_cache_hit_and_determinism(digits: DigitsModel, zoo_dir: Path, tmp_path: Path) -> None:
    before = digits.onnx_path.stat().st_mtime_ns
    again = build_digits(zoo_dir)
    assert again.onnx_path == digits.onnx_path and again.onnx_path.stat().st_mtime_ns == before
    fresh = build_digits(tmp_path)
    digest = [hashlib.sha256(p.read_bytes()).hexdigest() for p in (fresh.onnx_path, digits.onnx_path)]
    assert digest[0] == digest[1]
    assert fresh.fp32_test_accuracy == digits.fp32_test_accuracy


def test_a_digits_cache_hit_imports_neither_scikit_learn_nor_skl2onnx(digits: DigitsModel, zoo_dir: Path) -> None:
    """Importing them takes seconds, paid by every ``modelfleet up`` start, bench and test
    that finds the model already built; a fresh interpreter shows what a hit imports."""
    probe = (
        "import sys; from pathlib import Path; from modelfleet.zoo import build_digits;"
        f"model = build_digits(Path({str(zoo_dir)!r}));"
        "print(model.onnx_path, sorted({m.split('.')[0] for m in sys.modules} & {'sklearn', 'skl2onnx'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(digits.onnx_path), "[]"]


def test_bench_model_tiny(tmp_path: Path) -> None:
    model = build_bench_model(tmp_path, width=64, hidden_layers=2)
    assert model.width == 64 and model.input_name == "input"
    with np.load(model.calibration_path) as npz:
        samples = npz["input"]
    assert samples.dtype == np.float32 and samples.shape == (256, 64)
    assert abs(float(samples.mean())) < 0.05 and 0.95 < float(samples.std()) < 1.05
    again = build_bench_model(tmp_path, width=64, hidden_layers=2)
    assert again.onnx_path == model.onnx_path
    bigger = build_bench_model(tmp_path, width=96, hidden_layers=2)
    assert bigger.onnx_path != model.onnx_path and bigger.onnx_path.stat().st_size > model.onnx_path.stat().st_size


def test_default_bench_model_is_over_100_mb() -> None:
    from modelfleet.zoo import mlp_bytes

    assert mlp_bytes(2048, 7) >= 100 * 1000 * 1000
