"""``modelfleet push`` with the quantization options (``--eval``, ``--threshold``, ``--dim``,
``--require-int8``) against a real central that quantizes; a refusal shows the guard failing
and names ``--fp32``; INT8 that cannot be proven is served FP32 and the CLI says why;
the summary says what central converted so that ONNX Runtime loads the model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_harness import Cli, one_error_line

from central.server import CentralServer
from fleetwire.runtime_limits import runtime_limits
from modelfleet.zoo import DigitsModel, build_digits, write_random_transformer
from modelfleet.zoo.transformer import TransformerConfig
from support.fleet import central_settings
from support.onnx_versions import dense_model, save

#: A one-layer BERT-style encoder: what ``--dim`` sizes (its ``sequence`` axis is dynamic).
BERT = TransformerConfig(vocab=100, max_positions=128, hidden=32, heads=2, layers=1, ffn=128, classes=4)


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    """The zoo's digits classifier (cache shared with the zoo tests)."""
    return build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")


@pytest.fixture
async def quantizing(tmp_path: Path) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


async def test_eval_file_gives_task_accuracy_in_the_summary(
    tmp_path: Path, quantizing: CentralServer, digits: DigitsModel
) -> None:
    np.savez(tmp_path / "eval.npz", input=digits.test_x, label=digits.test_y)
    cli = Cli(tmp_path, quantizing.http_url)
    args = ["--calibration", str(digits.calibration_path), "--eval", str(tmp_path / "eval.npz")]
    pushed = await cli("push", str(digits.onnx_path), "--name", "digits", *args)
    assert pushed.exit_code == 0, pushed.stderr
    assert "serving INT8-" in pushed.stdout and "on 450 eval samples" in pushed.stdout
    assert f"FP32 {digits.fp32_test_accuracy:.2%} → INT8" in pushed.stdout and "on the eval set" in pushed.stdout


async def test_dim_and_threshold_are_sent(tmp_path: Path, quantizing: CentralServer) -> None:
    model = write_random_transformer(tmp_path / "bert.onnx", BERT)
    cli = Cli(tmp_path, quantizing.http_url)
    pushed = await cli("push", str(model), "--name", "bert", "--dim", "sequence=40", "--threshold", "0.9", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    report = json.loads(pushed.stdout)["report"]["quantization"]
    assert report["threshold"] == 0.9 and report["generated_shapes"]["input_ids"] == [40]
    bad = await cli("push", str(model), "--name", "bert", "--threshold", "2")
    assert bad.exit_code == 2 and "--threshold" in bad.stderr


async def test_a_refusal_shows_the_guard_failing_and_names_fp32(
    tmp_path: Path, quantizing: CentralServer, digits: DigitsModel
) -> None:
    cli = Cli(tmp_path, quantizing.http_url)
    args = ["--calibration", str(digits.calibration_path), "--threshold", "0.999", "--require-int8"]
    refused = await cli("push", str(digits.onnx_path), "--name", "digits", *args)
    assert refused.exit_code == 1
    error = one_error_line(refused)
    assert "below the 99.9% threshold" in error and "push again with --fp32" in error and error.endswith("(HTTP 422)")
    assert "✗ accuracy guard" in refused.stdout and "✗ quantize" not in refused.stdout


async def test_unproven_int8_is_served_fp32_and_push_and_models_say_why(
    tmp_path: Path, quantizing: CentralServer, digits: DigitsModel
) -> None:
    with np.load(digits.calibration_path) as data:
        np.savez(tmp_path / "few.npz", **{name: data[name][:32] for name in data.files})
    cli = Cli(tmp_path, quantizing.http_url)
    pushed = await cli("push", str(digits.onnx_path), "--name", "digits", "--calibration", str(tmp_path / "few.npz"))
    assert pushed.exit_code == 0, pushed.stderr
    out = " ".join(pushed.stdout.split())  # the summary wraps long lines
    assert "serving FP32" in out and "served FP32 INT8 unproven: INT8 top-1 agreement 100%" in out
    assert "16 samples cannot prove more than 85.5%" in out
    listed = await cli("models")
    assert listed.exit_code == 0, listed.stderr
    assert "digits" in listed.stdout and "FP32: INT8 unproven" in " ".join(listed.stdout.split())


async def test_the_summary_says_what_central_cleaned_in_an_exported_graph(
    tmp_path: Path, quantizing: CentralServer
) -> None:
    exported = Path(__file__).resolve().parents[1] / "fixtures" / "exported" / "bert"
    cli = Cli(tmp_path, quantizing.http_url)
    pushed = await cli("push", str(exported / "model.onnx"), "--name", "bert")
    assert pushed.exit_code == 0, pushed.stderr
    out = " ".join(pushed.stdout.split())
    assert "serving INT8-" in out and "cleaned dropped" in out and "value_info entries" in out


async def test_the_summary_says_what_central_converted_for_onnx_runtime(tmp_path: Path, central: CentralServer) -> None:
    limits = runtime_limits()
    newest = limits.max_opset("")
    opset = onnx.defs.onnx_opset_version()
    assert newest is not None and opset > newest, "onnx and ONNX Runtime agree: nothing to convert"
    model = save(dense_model(opset), tmp_path / "model.onnx")
    pushed = await Cli(tmp_path, central.http_url)("push", str(model), "--name", "m")
    assert pushed.exit_code == 0, pushed.stderr
    assert f"opset {opset} converted to {newest} with ONNX's version converter" in pushed.stdout
