"""``modelfleet doctor`` on this host: every line ok/warn/fail, real provider probe,
broker and central reachability, exit 1 when something fails."""

from __future__ import annotations

import json
from pathlib import Path

from cli_harness import Cli, closed_port

from brokers import MosquittoBroker
from central.server import CentralServer
from modelfleet.cli.gpu_libs import cpu_flags


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
    }
    assert all(c["status"] in ("ok", "warn") for c in checks.values())
    assert "CPUExecutionProvider" in checks["providers"]["detail"]
    assert checks["broker"]["status"] == checks["central"]["status"] == "ok"
    flags = cpu_flags() or set()
    assert ("avx512_vnni" in checks["cpu"]["detail"]) == ("avx512_vnni" in flags)


async def test_doctor_fails_with_a_fix_when_broker_and_central_are_down(tmp_path: Path) -> None:
    port = closed_port()
    result = await Cli(tmp_path)("doctor", "--broker", f"127.0.0.1:{port}", "--central", f"http://127.0.0.1:{port}")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    broker = next(i for i, line in enumerate(lines) if line.split()[1:2] == ["broker"])
    assert lines[broker].startswith("fail") and "unreachable (connection refused)" in lines[broker]
    assert "fix: start one (mosquitto" in lines[broker + 1]
    assert any(line.startswith("fail") and "central at" in line for line in lines)
    assert any(line.startswith("ok") and "onnxruntime" in line for line in lines)
