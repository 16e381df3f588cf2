"""The quantization options of a push over REST, on a real central: ``threshold``,
``dim`` and the ``eval`` file; a refusal's text and the streamed progress show the
guard failing, not the quantize step."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from quant_models import bert, digits_model, fragile

from central.server import CentralServer
from modelfleet.zoo.digits import DigitsModel
from support.fleet import central_settings

URL = "/api/v1/models/{}/versions"


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    return digits_model(tmp_path_factory)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client on a started central that quantizes (default recipes, guard, threshold)."""
    server = CentralServer(central_settings(tmp_path / "central", quantize={"enabled": True}))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as client:
            yield client
    finally:
        await server.stop()


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"threshold": "1.5"}, "threshold must be between 0 and 1 (0.97 means 97 %), got '1.5'"),
        ({"threshold": "high"}, "threshold must be a number between 0 and 1, got 'high'"),
        ({"dim": "seq"}, "dim 'seq' is not of the form name=size (a positive integer)"),
        ({"dim": "seq=0"}, "dim 'seq=0': the size must be between 1 and 1048576"),
    ],
)
async def test_bad_options_are_400_before_the_body(
    api: httpx.AsyncClient, tmp_path: Path, params: dict[str, str], error: str
) -> None:
    model = bert(tmp_path / "bert.onnx")
    response = await api.post(URL.format("m"), params=params, content=model.read_bytes())
    assert response.status_code == 400 and response.json() == {"error": error}
    assert (await api.get("/api/v1/models")).json() == []


async def test_dim_and_threshold_reach_the_guard(api: httpx.AsyncClient, tmp_path: Path) -> None:
    model = bert(tmp_path / "bert.onnx", vocab=300)
    params = [("dim", "sequence=40"), ("threshold", "0.9")]
    response = await api.post(URL.format("bert"), params=params, content=model.read_bytes())
    assert response.status_code == 201, response.text
    report = response.json()["report"]["quantization"]
    assert report["generated_shapes"] == {"input_ids": [40], "attention_mask": [40]}
    assert report["threshold"] == 0.9 and report["family"] == "transformer" and report["served"] == "int8-dynamic"
    unknown = await api.post(URL.format("bert"), params={"dim": "length=40"}, content=model.read_bytes())
    assert unknown.status_code == 400
    assert unknown.json()["error"] == "--dim length=40: the model has no dynamic dimension 'length' (it has: sequence)"


async def test_eval_file_in_the_multipart_gives_task_accuracy(
    api: httpx.AsyncClient, tmp_path: Path, digits: DigitsModel
) -> None:
    np.savez(tmp_path / "eval.npz", input=digits.test_x, label=digits.test_y)
    files = {
        "file": digits.onnx_path.read_bytes(),
        "calibration": digits.calibration_path.read_bytes(),
        "eval": (tmp_path / "eval.npz").read_bytes(),
    }
    response = await api.post(URL.format("digits"), files=files)
    assert response.status_code == 201, response.text
    manifest, report = response.json()["manifest"], response.json()["report"]["quantization"]
    assert report["samples_source"] == "eval" and report["samples"] == 450
    assert report["fp32_accuracy"] == pytest.approx(digits.fp32_test_accuracy)
    assert abs(report["accuracy_delta_pp"]) <= 0.5
    assert manifest["artifact"] == report["served"] and manifest["artifact"].startswith("int8-")


async def test_refusal_names_the_fp32_flag_and_progress_shows_the_guard_failing(
    api: httpx.AsyncClient, tmp_path: Path
) -> None:
    model, calibration = fragile(tmp_path, samples=1000)
    files = {"file": model.read_bytes(), "calibration": calibration.read_bytes()}
    plain = await api.post(URL.format("fragile"), params={"require_int8": "true"}, files=files)
    assert plain.status_code == 422
    assert "push again with --fp32 (REST: keep_fp32=true) to serve FP32" in plain.json()["error"]
    assert (await api.get("/api/v1/models")).json() == []

    params = {"progress": "ndjson", "require_int8": "true"}
    streamed = await api.post(URL.format("fragile"), params=params, files=files)
    events = [json.loads(line) for line in streamed.text.splitlines() if line.strip()]
    steps = [(e["step"], e["phase"]) for e in events if e["event"] == "step"]
    started = [step for step, phase in steps if phase == "start"]
    ended = [step for step, phase in steps if phase == "end"]
    assert started == ["validate", "quantize", "guard"] and ended == ["validate", "quantize"]
    assert events[-1]["event"] == "error" and events[-1]["status"] == 422
    assert events[-1]["error"].startswith("INT8 top-1 agreement") and "--fp32" in events[-1]["error"]


async def test_int8_too_few_samples_can_prove_is_served_fp32_and_listed_with_why(
    api: httpx.AsyncClient, tmp_path: Path, digits: DigitsModel
) -> None:
    """32 calibration rows: 16 held out, all agree, yet 16 cannot prove 97 %. The version is
    stored and served as FP32; the report, the versions and the models list say why."""
    with np.load(digits.calibration_path) as data:
        np.savez(tmp_path / "few.npz", **{name: data[name][:32] for name in data.files})
    files = {"file": digits.onnx_path.read_bytes(), "calibration": (tmp_path / "few.npz").read_bytes()}
    required = await api.post(URL.format("digits"), params={"require_int8": "true"}, files=files)
    assert required.status_code == 422 and "16 samples cannot prove more than 85.5%" in required.json()["error"]

    pushed = await api.post(URL.format("digits"), files=files)
    assert pushed.status_code == 201, pushed.text
    manifest, report = pushed.json()["manifest"], pushed.json()["report"]["quantization"]
    assert manifest["artifact"] == "fp32" and report["served"] == "fp32"
    int8 = report["int8"]
    assert int8["status"] == "unproven" and "16 samples cannot prove more than 85.5%" in int8["reason"]
    [candidate] = int8["unproven"]
    assert (candidate["agreement"], candidate["samples"], candidate["threshold"]) == (1.0, 16, 0.97)
    assert candidate["lower_bound"] == pytest.approx(0.8554, abs=1e-3)

    why = f"INT8 unproven: {int8['reason']}"
    [version] = (await api.get(URL.format("digits"))).json()
    assert version["artifact"] == "fp32" and version["served_reason"] == why
    assert candidate["artifact"] in version["artifacts"]
    [model] = (await api.get("/api/v1/models")).json()
    assert (model["latest"], model["artifact"], model["served_reason"]) == (manifest["version"], "fp32", why)


async def test_require_int8_must_be_a_flag(api: httpx.AsyncClient, tmp_path: Path) -> None:
    model = bert(tmp_path / "bert.onnx")
    response = await api.post(URL.format("m"), params={"require_int8": "maybe"}, content=model.read_bytes())
    assert response.status_code == 400 and "require_int8" in response.json()["error"]
