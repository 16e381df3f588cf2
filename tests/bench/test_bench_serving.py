"""The serving bench runs end to end at a tiny size (with wrk or the python client, FP32 or INT8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.loadgen import LoadGenError, parse_wrk_output, percentile, run_load, wrk_path
from bench.serving import TARGETS, main
from modelfleet.zoo.cache import CACHE_ENV


def test_serving_bench_writes_sane_json(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))
    out = tmp_path / "serving.json"
    argv = [
        "--json", str(out), "--clients", "4", "--width", "64", "--layers", "2", "--duration-s", "1",
        "--warmup-s", "0.5", "--requests-per-client", "25", "--work-dir", str(tmp_path / "fleets"),
        "--timeout-s", "60", "--shadow",
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "speedup" in printed and "ceiling_ratio" in printed and "compute_ratio" in printed
    data = json.loads(out.read_text())
    for key in (
        "batched_rps", "unbatched_rps", "speedup", "p50_ms", "p99_ms", "mean_batch_size", "digits_rps", "noop_rps",
        "ceiling_ratio", "compute_limit_rps", "compute_ratio", "clients", "errors", "load_generator", "artifacts",
        "targets", "met",
    ):  # fmt: skip
        assert key in data, key
    assert data["clients"] == 4
    assert data["load_generator"] in ("wrk", "python")
    assert data["errors"] == 0 and data["warmup_errors"] == 0
    assert data["targets"] == TARGETS == {
        "speedup": 3.0, "ceiling_ratio": 0.6, "compute_ratio": 0.6, "grpc_over_rest": 1.0, "errors": 0
    }  # fmt: skip
    assert set(data["met"]) == set(TARGETS) and all(isinstance(v, bool) for v in data["met"].values())
    assert data["met"]["errors"] is True
    for key in ("batched_rps", "unbatched_rps", "digits_rps", "noop_rps", "p50_ms", "p99_ms"):
        assert data[key] > 0, key
    assert data["p99_ms"] >= data["p50_ms"]
    assert data["speedup"] == pytest.approx(data["batched_rps"] / data["unbatched_rps"])
    assert data["ceiling_ratio"] == pytest.approx(data["digits_rps"] / data["noop_rps"])
    # ONNX Runtime alone on the served file, at the edge's largest batch, for about 2 s.
    compute = data["compute"]
    assert compute["batch"] == 32 and compute["runs"] > 0 and compute["model_bytes"] > 0
    assert data["compute_limit_rps"] == pytest.approx(compute["rows_per_s"]) and data["compute_limit_rps"] > 0
    assert data["compute_ratio"] == pytest.approx(data["batched_rps"] / data["compute_limit_rps"])
    for key in ("grpc_batched_rps", "grpc_digits_rps"):
        assert data[key] > 0, key
    assert data["grpc_over_rest"] == pytest.approx(data["grpc_batched_rps"] / data["batched_rps"])
    for label in ("grpc_batched", "grpc_digits"):
        run = data["runs"][label]
        assert run["transport"] == "grpc" and run["tool"] == "grpc" and run["errors"] == 0, run
        assert run["mean_batch_size"] >= 1, run
    assert set(data["artifacts"]) == {"bench-mlp", "digits"}
    assert all(a == "fp32" or a.startswith("int8-") for a in data["artifacts"].values())
    # Batching on: at most 32 rows (4 clients here); off: exactly one row per run.
    assert 1.0 <= data["mean_batch_size"] <= 4.0
    assert data["unbatched_mean_batch_size"] == 1.0
    runs = data["runs"]
    assert set(runs) == {"batched", "digits", "noop", "grpc_batched", "grpc_digits", "unbatched"}
    for run in runs.values():
        assert run["requests"] > 0 and run["errors"] == 0 and run["edge_cpu_ms_per_request"] >= 0
    # --shadow: sampling at the default 1 % against none, on fresh edges serving bench-mlp.
    assert data["shadow_sample"] == 0.01 and data["shadow_target"] == 0.03 and isinstance(data["shadow_met"], bool)
    assert data["shadow_rps"] > 0 and data["shadow_off_rps"] > 0
    assert data["shadow_cost"] == pytest.approx(1 - data["shadow_rps"] / data["shadow_off_rps"])
    cpu = data["shadow_cpu_ms_per_request"] / data["shadow_off_cpu_ms_per_request"] - 1
    assert data["shadow_cpu_cost"] == pytest.approx(cpu)
    assert [len(data["shadow_runs"][k]) for k in ("on", "off")] == [1, 1] and "shadow_cost" in printed
    if data["artifacts"]["bench-mlp"].startswith("int8-"):
        assert data["shadow"]["reference"] == "fp32" and data["shadow"]["samples"] >= 0
    # The fleet cleaned up after itself.
    assert not list((tmp_path / "fleets").iterdir())


def test_require_int8_fails_loudly_without_int8(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(CACHE_ENV, str(tmp_path_factory.getbasetemp() / "zoo-cache"))
    out = tmp_path / "serving.json"
    argv = [
        "--json", str(out), "--clients", "2", "--width", "64", "--layers", "2", "--duration-s", "1",
        "--warmup-s", "0", "--requests-per-client", "5", "--require-int8", "--central-env",
        "MODELFLEET_QUANTIZE__ENABLED=false", "--work-dir", str(tmp_path / "fleets"),
    ]  # fmt: skip
    assert main(argv) == 3
    assert "--require-int8" in capsys.readouterr().err
    assert not out.exists()


def test_python_load_generator_counts_requests_and_errors() -> None:
    """The fallback client against a dead port: every request is an error, none hangs."""
    result = run_load(
        "http://127.0.0.1:9/none", b"{}", connections=2, duration_s=2, requests_per_connection=3, tool="python"
    )
    assert result["tool"] == "python"
    assert result["requests"] == 0 and result["errors"] == 6 and result["rps"] == 0


@pytest.mark.skipif(wrk_path() is None, reason="wrk is not installed")
def test_wrk_refuses_a_dead_server_loudly() -> None:
    with pytest.raises(LoadGenError, match="unable to connect"):
        run_load("http://127.0.0.1:9/none", b"{}", connections=2, duration_s=1, tool="wrk")


def test_parse_wrk_output() -> None:
    line = (
        'LOADGEN_JSON {"requests":100,"duration_us":2000000,"bytes":1,"bad_status":3,"status":3,"connect":0,'
        '"read":1,"write":0,"timeout":0,"p50_us":1500.0,"p90_us":2000.0,"p99_us":4000.0,"max_us":5000.0,'
        '"mean_us":1600.0}'
    )
    r = parse_wrk_output("Running 2s test\n" + line + "\n")
    assert (r["requests"], r["errors"], r["seconds"], r["rps"]) == (100, 4, 2.0, 50.0)
    assert (r["p50_ms"], r["p99_ms"]) == (1.5, 4.0)
    text = (
        "  Latency Distribution\n     50%  1.20ms\n     75%    2.00ms\n     90%  3.00ms\n     99%   10.50ms\n"
        "  1200 requests in 2.00s, 1.00MB read\n  Non-2xx or 3xx responses: 2\n"
    )
    r = parse_wrk_output(text)
    assert (r["requests"], r["errors"], r["p50_ms"], r["p99_ms"]) == (1200, 2, 1.2, 10.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([], 99) == 0.0
