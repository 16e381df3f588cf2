"""The operator commands against a real central (and, end to end, a real edge heartbeating
through Mosquitto): push with its steps and summary, models, nodes, events, --json,
exit codes and one-line errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cli_harness import Cli, one_error_line

from central.server import CentralServer
from modelfleet.cli.client import CentralClient, PushRequest
from modelfleet.cli.config import CliConfig
from modelfleet.zoo import DigitsModel, build_digits
from support.brokers import MosquittoBroker, free_port
from support.fleet import EdgeFactory, central_settings
from support.wait import wait_for


@pytest.fixture(scope="session")
def digits(tmp_path_factory: pytest.TempPathFactory) -> DigitsModel:
    """The zoo's digits classifier (cache shared with the zoo tests)."""
    return build_digits(tmp_path_factory.getbasetemp() / "zoo-cache")


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    """Central with quantization on and heartbeats through the test's Mosquitto."""
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker, quantize={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


async def test_push_digits_then_read_models_nodes_and_events(
    tmp_path: Path,
    mqtt_central: CentralServer,
    mosquitto: MosquittoBroker,
    make_edge: EdgeFactory,
    digits: DigitsModel,
) -> None:
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    await make_edge("edge-0", mqtt_central, heartbeat=heartbeat, broker=broker)
    tracker = mqtt_central.central.liveness
    await wait_for(lambda: [str(v.state) for v in tracker.nodes()] == ["alive"], 20, "edge-0 alive")
    cli = Cli(tmp_path, mqtt_central.http_url)

    args = ["push", str(digits.onnx_path), "--name", "digits", "--calibration", str(digits.calibration_path)]
    pushed = await cli(*args, "--labels", "team=ml")
    assert pushed.exit_code == 0, pushed.stderr
    for step in ("upload", "validate", "quantize to INT8", "accuracy guard", "chunk and store", "place chunks"):
        assert step in pushed.stdout
    assert "digits:1, serving INT8" in pushed.stdout
    assert "FP32" in pushed.stdout and "held-out samples" in pushed.stdout
    assert "edge-0" in pushed.stdout  # the owner of the chunks

    models = json.loads((await cli("models", "--json")).stdout)
    assert [(m["name"], m["latest"], m["versions"]) for m in models] == [("digits", "1", 1)]
    shown = json.loads((await cli("models", "show", "digits", "--json")).stdout)
    (version,) = shown["versions"]
    assert version["artifact"].startswith("int8-") and version["labels"] == {"team": "ml"}
    assert version["quantization"]["agreement"] >= version["quantization"]["threshold"]

    await wait_for(lambda: len(tracker.ready_endpoints("digits")) == 1, 30, "digits ready on edge-0")
    nodes = await cli("nodes", "--json")
    (node,) = json.loads(nodes.stdout)
    assert node["node_id"] == "edge-0" and node["state"] == "alive"
    assert [(m["name"], m["version"], m["state"]) for m in node["models"]] == [("digits", "1", "ready")]
    assert node["cache"]["bytes"] > 0 and node["owned_chunks"] > 0
    table = (await cli("nodes")).stdout
    assert "edge-0" in table and "alive" in table and "digits:1 ready" in table

    events = json.loads((await cli("events", "--json")).stdout)
    assert any(e["type"] == "node_alive" and e["node_id"] == "edge-0" for e in events)
    assert "node_alive edge-0" in (await cli("events")).stdout


async def test_errors_are_one_line_with_exit_codes(tmp_path: Path, central: CentralServer) -> None:
    cli = Cli(tmp_path, central.http_url)

    unknown = await cli("models", "show", "nope")
    assert unknown.exit_code == 1
    assert one_error_line(unknown) == "error: unknown model 'nope' (HTTP 404)"

    not_onnx = tmp_path / "not-a-model.onnx"
    not_onnx.write_bytes(b"definitely not protobuf")
    refused = await cli("push", str(not_onnx), "--name", "m")
    assert refused.exit_code == 1
    assert one_error_line(refused).startswith("error: not an ONNX model: ")  # from the validate step, streamed
    assert one_error_line(refused).endswith("(HTTP 400)")
    assert json.loads((await cli("models", "--json")).stdout) == []  # nothing half-stored

    url = f"http://127.0.0.1:{free_port()}"
    gone = await cli("nodes", "--central", url)
    assert gone.exit_code == 1
    assert one_error_line(gone) == f"error: central at {url} is unreachable (connection refused)"

    missing_name = await cli("push", str(not_onnx))
    assert missing_name.exit_code == 2
    no_file = await cli("push", str(tmp_path / "absent.onnx"), "--name", "m")
    assert no_file.exit_code == 2 and "is not a file" in one_error_line(no_file)
    bad_canary = await cli("rollout", "m", "2", "--canary", "150%")
    assert bad_canary.exit_code == 2 and "--canary" in one_error_line(bad_canary)
    bad_url = await cli("models", "--central", "ftp://example")
    assert bad_url.exit_code == 2 and "invalid central URL" in one_error_line(bad_url)


async def test_push_progress_arrives_step_by_step_and_counts_every_byte(
    tmp_path: Path, central: CentralServer, small_model_file: Path
) -> None:
    sent: list[int] = []

    def push_events() -> list[dict[str, object]]:
        with CentralClient(CliConfig(central_url=central.http_url)) as client:
            return list(client.push(PushRequest(model=small_model_file, name="tiny"), sent.append))

    events = await asyncio.to_thread(push_events)
    steps = [(e["step"], e["phase"]) for e in events if e["event"] == "step"]
    names = ["validate", "quantize", "chunk", "manifest", "place"]
    assert steps == [(name, phase) for name in names for phase in ("start", "end")]
    assert events[-1]["event"] == "result" and events[-1]["placement"] == {"nodes": 0, "owners": {}}
    assert sum(sent) == small_model_file.stat().st_size
