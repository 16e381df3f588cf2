"""``modelfleet zoo``: the project's own models written to files an operator can push."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from modelfleet.cli import app
from modelfleet.zoo.cache import CACHE_ENV


def test_mlp_writes_a_valid_model_and_another_seed_another_version(tmp_path: Path) -> None:
    runner = CliRunner()
    for seed in (0, 1):
        result = runner.invoke(
            app, ["zoo", "mlp", "--out", str(tmp_path / f"m{seed}.onnx"), "--width", "32", "--seed", str(seed)]
        )
        assert result.exit_code == 0, result.output
    onnx.checker.check_model(str(tmp_path / "m0.onnx"))
    session = ort.InferenceSession(str(tmp_path / "m0.onnx"), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: np.ones((2, 32), np.float32)})
    assert out.shape == (2, 10)
    assert (tmp_path / "m0.onnx").read_bytes() != (tmp_path / "m1.onnx").read_bytes()


def test_digits_writes_the_model_and_its_calibration(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["zoo", "digits", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    onnx.checker.check_model(str(tmp_path / "d" / "model.onnx"))
    with np.load(tmp_path / "d" / "calibration.npz") as calibration:
        assert len(calibration.files) >= 1


def test_a_bad_width_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["zoo", "mlp", "--out", str(tmp_path / "m.onnx"), "--width", "0"])
    assert result.exit_code == 2 and not (tmp_path / "m.onnx").exists()


def test_usage_errors_are_one_line_with_exit_code_two(capsys: pytest.CaptureFixture[str]) -> None:
    from modelfleet.cli import main

    assert main(["push"]) == 2
    err = capsys.readouterr().err
    assert err == "error: Missing argument 'model'. (see 'modelfleet push --help')\n"
    assert main(["models", "--bogus"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.fixture
def shared_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The session's zoo cache (``tests/modelfleet/zoo``): each model is built once per run."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))


@pytest.mark.usefixtures("shared_cache")
@pytest.mark.parametrize(
    ("command", "files"),
    [
        (["resnet"], ["model.onnx", "calibration.npz", "eval.npz"]),
        (["transformer", "--size", "small"], ["model.onnx", "calibration.npz", "eval.npz"]),
        (["external"], ["model.onnx", "model.onnx.data", "calibration.npz", "eval.npz"]),
    ],
)
def test_trained_architectures_are_written_with_their_data(
    command: list[str], files: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["zoo", *command, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(files)
    assert f"modelfleet push {out / 'model.onnx'}" in result.output
    assert f"--calibration {out / 'calibration.npz'}" in result.output and "--fp32" not in result.output
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    with np.load(out / "eval.npz") as data:
        feeds = {i.name: data[i.name][:4] for i in session.get_inputs()}
    (logits,) = session.run(None, feeds)
    assert logits.shape == (4, 10)


def test_an_unknown_size_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["zoo", "resnet", "--out", str(tmp_path / "r"), "--size", "50"])
    assert result.exit_code == 2 and not (tmp_path / "r").exists()
