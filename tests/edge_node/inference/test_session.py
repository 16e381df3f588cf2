"""SessionFactory: ENABLE_ALL optimization cached per host and provider set."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge_node.errors import InvalidInputs
from edge_node.inference.inputs import check_inputs
from edge_node.inference.session import STALE_TEMP_S, SessionFactory, dummy_inputs, host_fingerprint, session_specs
from fleetwire.manifest import TensorSpec
from modelfleet.zoo import build_mlp
from support.external_data import DATA_FILE, build_external_mlp

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
    entry = SessionFactory(tmp_path, CPU).entry_files("k1")
    assert [p.suffix for p in entry] == [".onnx", ".data"]  # the model file and its data file
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".lock", *(p.name for p in entry)])


def test_corrupt_cache_is_discarded_and_rebuilt(tmp_path: Path, mlp: Path) -> None:
    factory = SessionFactory(tmp_path, CPU)
    factory.cache_path("k2").write_bytes(b"not a model")
    created = factory.create_with_info(mlp, "k2")
    assert not created.cache_hit
    assert SessionFactory(tmp_path, CPU).create_with_info(mlp, "k2").cache_hit


@pytest.fixture(scope="module")
def external(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``model.onnx`` + ``model.onnx.data``, every tensor in the data file."""
    return build_external_mlp(tmp_path_factory.mktemp("ext") / "model", width=64, hidden_layers=2)


def _data_locations(model_file: Path) -> set[str]:
    model = onnx.load(str(model_file), load_external_data=False)
    return {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}


def test_external_data_model_is_a_cache_hit_across_restart(
    tmp_path: Path, external: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The optimized copy's initializers go to its own data file beside the cache entry; it
    used to reference ``model.onnx.data`` relative to the cache and be discarded at every start."""
    x = np.random.default_rng(2).standard_normal((4, 64), dtype=np.float32)
    first = SessionFactory(tmp_path / "cache", CPU).create_with_info(external, "ext", 40_000)
    assert not first.cache_hit and first.cache_path is not None
    locations = _data_locations(first.cache_path)
    assert len(locations) == 1 and DATA_FILE not in locations
    assert (first.cache_path.parent / locations.pop()).is_file()

    with caplog.at_level(logging.WARNING, logger="edge_node.inference.session"):
        again = SessionFactory(tmp_path / "cache", CPU).create_with_info(external, "ext", 40_000)
    assert again.cache_hit, caplog.text
    assert "discarding" not in caplog.text
    assert np.array_equal(logits(again.session, x), logits(first.session, x))
    plain = ort.InferenceSession(str(external), providers=CPU)
    np.testing.assert_allclose(logits(again.session, x), logits(plain, x), rtol=1e-5, atol=1e-6)


def test_concurrent_creators_leave_one_valid_entry(tmp_path: Path, external: Path) -> None:
    """Creators of one key racing (each its own factory, as separate processes would be):
    each writes its own data file; the entry left references the one data file left."""
    start = threading.Barrier(4)
    created: list[bool] = []

    def create() -> None:
        start.wait()
        created.append(SessionFactory(tmp_path, CPU).create_with_info(external, "race").cache_hit)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(created) == 4
    factory = SessionFactory(tmp_path, CPU)
    model_file, *data = factory.entry_files("race")
    assert [p.name for p in data] == list(_data_locations(model_file))
    assert not list(tmp_path.glob("*.tmp.onnx"))
    assert factory.create_with_info(external, "race").cache_hit


def test_replaced_and_crashed_data_files_are_pruned(tmp_path: Path, external: Path) -> None:
    factory = SessionFactory(tmp_path, CPU)
    cached = factory.cache_path("k")
    crashed = cached.with_name(f"{cached.name}.1-0000dead.data")  # a creation that died before the rename
    # One still writing (a live process: this one): its temp file exists.
    in_progress = cached.with_name(f"{cached.name}.{os.getpid()}-0000beef.data")
    crashed.write_bytes(b"x")
    in_progress.write_bytes(b"y")
    cached.with_name(f".{cached.stem}.{os.getpid()}-0000beef.tmp.onnx").touch()
    factory.create(external, "k")
    (live,) = _data_locations(cached)
    assert sorted(p.name for p in factory.entry_files("k")) == sorted([cached.name, live, in_progress.name])

    cached.write_bytes(b"not a model")  # a broken entry is discarded with its data file, then rebuilt
    assert not factory.create_with_info(external, "k").cache_hit
    (rebuilt,) = _data_locations(cached)
    assert rebuilt != live and not (tmp_path / live).exists() and (tmp_path / rebuilt).is_file()

    factory.discard("k")
    assert factory.entry_files("k") == [in_progress]


def test_killed_creations_leftovers_are_swept_at_first_use(tmp_path: Path, external: Path) -> None:
    """A creation killed mid-optimisation leaves its temp model file and data file; a new
    factory removes those of dead processes (and keeps a live process's) on first use."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    cached = SessionFactory(tmp_path, CPU).cache_path("k")
    leftovers = [
        cached.with_name(f".{cached.stem}.{dead}-0000dead.tmp.onnx"),
        cached.with_name(f"{cached.name}.{dead}-0000dead.data"),
    ]
    running = [
        cached.with_name(f".{cached.stem}.{os.getpid()}-0000beef.tmp.onnx"),
        cached.with_name(f"{cached.name}.{os.getpid()}-0000beef.data"),
    ]
    recent = [  # a creator in another PID namespace: its pid is unknown here, its file fresh
        cached.with_name(f".{cached.stem}.{dead}-0000f00d.tmp.onnx"),
        cached.with_name(f"{cached.name}.{dead}-0000f00d.data"),
    ]
    old = time.time() - STALE_TEMP_S - 60
    for path in leftovers + running + recent:
        path.write_bytes(b"partial")
    for path in leftovers + running:
        os.utime(path, (old, old))
    SessionFactory(tmp_path, CPU).create(external, "other")  # any key: the sweep is of the dir
    assert not any(p.exists() for p in leftovers)
    assert all(p.exists() for p in running + recent)


class _StatFailsOnce(SessionFactory):
    """A factory whose cache entry cannot be stat'ed (a symlink loop) until the exclusive
    lock is taken, when a real (broken) entry takes its place."""

    _loop: Path

    @contextlib.contextmanager
    def _lock(self, mode: int) -> Iterator[None]:
        with super()._lock(mode):
            if mode == fcntl.LOCK_EX and self._loop.is_symlink():
                self._loop.unlink()
                self._loop.write_bytes(b"not a model")
            yield


def test_entry_that_cannot_be_stat_ed_is_not_an_unbound_error(tmp_path: Path) -> None:
    factory = _StatFailsOnce(tmp_path, CPU)
    cached = factory.cache_path("k")
    factory._loop = cached
    cached.symlink_to(cached)  # stat: ELOOP, an OSError that is not FileNotFoundError
    assert factory._from_cache(cached) is None
    assert cached.read_bytes() == b"not a model"  # not removed blind: a rebuild replaces it


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
