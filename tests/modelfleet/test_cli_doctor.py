"""``modelfleet doctor`` on this host: every line ok/warn/fail, real provider probe,
broker and central reachability, exit 1 when something fails."""

from __future__ import annotations

import json
from pathlib import Path

from cli_harness import Cli

from central.server import CentralServer
from modelfleet.cli.gpu_libs import LIBRARIES, candidates, cpu_flags, find
from support.brokers import MosquittoBroker, free_port


async def test_doctor_reports_providers_and_reachable_services(
    tmp_path: Path, central: CentralServer, mosquitto: MosquittoBroker
) -> None:
    cli = Cli(tmp_path)
    args = ("doctor", "--broker", f"{mosquitto.host}:{mosquitto.port}", "--central", central.http_url)
    result = await cli(*args, "--json")
    assert result.exit_code == 0, result.stdout
    checks = {c["check"]: c for c in json.loads(result.stdout)}
    assert set(checks) == {
        "python",
        "onnxruntime",
        "providers",
        "cuda runtime",
        "cudnn",
        "tensorrt",
        "cpu",
        "broker",
        "central",
        "central exposure",
        "edge exposure",
    }
    assert all(c["status"] in ("ok", "warn") for c in checks.values())
    assert checks["central exposure"]["status"] == checks["edge exposure"]["status"] == "ok"  # loopback defaults
    assert checks["central exposure"]["detail"].startswith("binds 127.0.0.1: loopback only")
    assert "CPUExecutionProvider" in checks["providers"]["detail"]
    assert checks["broker"]["status"] == checks["central"]["status"] == "ok"
    flags = cpu_flags() or set()
    assert ("avx512_vnni" in checks["cpu"]["detail"]) == ("avx512_vnni" in flags)


async def test_doctor_fails_with_a_fix_when_broker_and_central_are_down(tmp_path: Path) -> None:
    port = free_port()
    result = await Cli(tmp_path)("doctor", "--broker", f"127.0.0.1:{port}", "--central", f"http://127.0.0.1:{port}")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    broker = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["broker"])
    assert lines[broker].startswith("fail") and "unreachable (connection refused)" in lines[broker]
    assert "fix: start one (mosquitto" in lines[broker + 1]
    assert any(line.startswith("fail") and "central at" in line for line in lines)
    assert any(line.startswith("ok") and "onnxruntime" in line for line in lines)


async def test_doctor_warns_when_this_environment_would_open_central_or_an_edge_beyond_loopback(
    tmp_path: Path,
) -> None:
    cli = Cli(tmp_path)
    # One host, one environment: both deployables read MODELFLEET_HTTP_HOST / _GRPC_HOST.
    cli.env.update({"MODELFLEET_HTTP_HOST": "0.0.0.0", "MODELFLEET_GRPC_HOST": "127.0.0.1", "MODELFLEET_NODE_ID": "e1"})
    cli.env["MODELFLEET_AUTH__ENABLED"] = "true"
    port = free_port()
    result = await cli("doctor", "--broker", f"127.0.0.1:{port}", "--central", f"http://127.0.0.1:{port}", "--json")
    exposure = [c for c in json.loads(result.stdout) if c["check"].endswith("exposure")]
    # the REST API and the gRPC inference port beside it, of each
    assert [(c["check"], c["status"]) for c in exposure] == [
        ("central exposure", "warn"),
        ("central exposure", "warn"),
        ("edge exposure", "warn"),
        ("edge exposure", "warn"),
    ]
    central, central_inference, edge, edge_inference = exposure
    assert central_inference["detail"].startswith("WIDE OPEN: central gRPC inference gateway listens on 0.0.0.0")
    assert edge_inference["detail"].startswith("WIDE OPEN: edge e1 gRPC inference listens on 0.0.0.0")
    assert central["detail"].startswith("WIDE OPEN: central REST API listens on 0.0.0.0:8080, beyond this host")
    assert "without TLS" in central["detail"] and "authentication" not in central["detail"]  # auth is on
    assert central["fix"].startswith("set MODELFLEET_TLS__ENABLED=true")
    assert edge["detail"].startswith("WIDE OPEN: edge e1 HTTP API listens on 0.0.0.0 (any free port)")
    assert "MODELFLEET_TLS__REQUIRE_CLIENT_CERT=true" in edge["fix"]

    text = await cli("doctor", "--broker", f"127.0.0.1:{port}", "--central", f"http://127.0.0.1:{port}")
    line = next(line for line in text.stdout.splitlines() if "central exposure" in line)
    assert line.startswith("warn") and "WIDE OPEN" in line

    cli.env["MODELFLEET_TLS__ENABLED"] = "true"  # without its files: the settings cannot be read, and it says so
    broken = await cli("doctor", "--broker", f"127.0.0.1:{port}", "--central", f"http://127.0.0.1:{port}", "--json")
    central = next(c for c in json.loads(broken.stdout) if c["check"] == "central exposure")
    assert central["status"] == "warn" and "tls.cert_file is required" in central["detail"]


def test_library_candidates_and_cpu_flags_are_read_from_what_the_host_lists(tmp_path: Path) -> None:
    listed = [
        "/usr/lib/x86_64-linux-gnu/libcudnn.so.8",
        "/opt/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/lib/libcudnn_ops.so.9",  # a sibling library, not cuDNN's entry point
        "/usr/local/cuda/lib64/libcudart.so.12",
    ]
    assert candidates("libcudnn", listed) == [  # newest soname first
        "/opt/nvidia/cudnn/lib/libcudnn.so.9",
        "/usr/lib/x86_64-linux-gnu/libcudnn.so.8",
    ]
    assert find(LIBRARIES[2], listed) is None  # no TensorRT listed: "not found" is an answer
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512_vnni\n\nprocessor\t: 1\n", encoding="utf-8")
    assert cpu_flags(cpuinfo) == {"fpu", "sse", "avx2", "avx512_vnni"}
    assert cpu_flags(tmp_path / "absent") is None
