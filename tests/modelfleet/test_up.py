"""``modelfleet up`` as a user runs it: a real subprocess that starts a broker, central and
three edges, pushes the digits model, classifies held-out digits through the gateway and
stops every child when done (``--once``) or on Ctrl-C. The main test runs it twice on one
directory: once on Mosquitto, then warm (nothing pushed again) on the embedded amqtt
broker until SIGINT. ``--secure`` runs the same fleet hardened (TLS, tokens, MQTT logins
and ACL) and is probed from outside. A failing child gives one error line; ports and the
data-directory lock are checked in process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelfleet.up.broker import start_broker
from modelfleet.up.children import ChildGroup
from modelfleet.up.datadir import DataDir
from modelfleet.up.errors import UpError
from modelfleet.up.ports import PortPlan, available, concrete
from modelfleet.up.secure import ACL_RULES, prepare
from modelfleet.zoo.digits import INPUT_NAME
from support.processes import ctrl_c_able

pytestmark = pytest.mark.fleet  # `modelfleet up`: a broker, central and edges as processes

_SHIPPED_ACL = Path(__file__).parents[2] / "deploy" / "mosquitto" / "acl"
_PEER_CHUNKS = re.compile(r'^modelfleet_fetch_chunks_total\{source="peer"\} (?P<n>\S+)$', re.M)

_ACCURACY = re.compile(r"accuracy (?P<pct>\d+\.\d)% \((?P<correct>\d+)/(?P<total>\d+) held-out digits")


def _up_argv(data_dir: Path, status: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "modelfleet", "up", "--data-dir", str(data_dir), "--json-status", str(status),
        "--base-port", "0", *extra,
    ]  # fmt: skip


def _run_once(data_dir: Path, status: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = subprocess.run(
        _up_argv(data_dir, status, "--once", *extra), capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(status.read_text())


def _pids(status: dict[str, Any]) -> list[int]:
    return [status["broker"]["pid"], status["central"]["pid"], *(e["pid"] for e in status["edges"])]


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and _running(int(entry.name)):
                found.append(int(entry.name))
    return found


def _assert_nothing_left(status: dict[str, Any], data_dir: Path) -> None:
    assert [pid for pid in _pids(status) if _running(pid)] == []
    assert _processes_mentioning(str(data_dir)) == []


def _wait_for_file(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"modelfleet up exited with {proc.returncode}: {proc.communicate()[0]}"
        assert time.monotonic() < deadline, "no status file"
        time.sleep(0.1)
    return dict(json.loads(path.read_text()))


@contextlib.contextmanager
def _up_running(argv: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """``modelfleet up`` in the background, its output on ``stdout``; killed if still
    running when the block ends (a failed assertion before ``_ctrl_c``)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=ctrl_c_able)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _ctrl_c(proc: subprocess.Popen[str]) -> str:
    """SIGINT, as Ctrl-C sends it; the whole output once it has exited."""
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    return output


def test_up_once_on_mosquitto_then_warm_on_amqtt_until_ctrl_c_leaving_nothing_behind(tmp_path: Path) -> None:
    data_dir, status_path = tmp_path / "fleet", tmp_path / "status.json"
    first, status = _run_once(data_dir, status_path, "--broker", "mosquitto")

    assert status["broker"]["kind"] == "mosquitto"
    assert [e["node_id"] for e in status["edges"]] == ["edge-1", "edge-2", "edge-3"]
    central = status["central"]
    assert central["dashboard_url"] == f"{central['http_url']}/dashboard"
    assert central["http_url"].endswith(f":{central['http_port']}")
    for url in (central["dashboard_url"], central["gateway_url"], *(e["http_url"] for e in status["edges"])):
        assert url in first.stdout
    assert status["model"]["artifact"].startswith("int8-")  # the INT8 recipe central chose for its CPU
    assert status["model"] == {
        "name": "digits",
        "version": "1",
        "artifact": status["model"]["artifact"],
        "pushed": True,
    }
    line = _ACCURACY.search(first.stdout)
    assert line is not None, first.stdout
    assert int(line["correct"]) == status["demo"]["correct"] and int(line["total"]) == status["demo"]["total"] == 450
    assert status["demo"]["accuracy"] >= 0.9 and set(status["demo"]["nodes"]) <= {"edge-1", "edge-2", "edge-3"}
    _assert_nothing_left(status, data_dir)

    # Again on the same directory, now without Mosquitto and running until Ctrl-C: it
    # starts warm (the version is there, not pushed twice) and heartbeats flow over amqtt.
    status_path.unlink()
    with _up_running(_up_argv(data_dir, status_path, "--broker", "amqtt")) as proc:
        again = _wait_for_file(status_path, proc, timeout=100)
        assert again["broker"]["kind"] == "amqtt"
        assert again["model"] == {**status["model"], "pushed": False}
        assert again["demo"]["correct"] == status["demo"]["correct"]
        membership = httpx.get(f"{again['central']['http_url']}/api/v1/membership", timeout=10).json()
        assert {n["node_id"]: n["state"] for n in membership["nodes"]} == {f"edge-{i}": "alive" for i in (1, 2, 3)}
        assert proc.poll() is None and all(_running(pid) for pid in _pids(again))  # it keeps running

        output = _ctrl_c(proc)
    assert proc.returncode == 0, output
    assert "not pushed again" in output and "stop the fleet — 5 processes stopped" in output
    _assert_nothing_left(again, data_dir)


def test_up_once_fails_with_one_clear_line_when_an_edge_cannot_start(tmp_path: Path) -> None:
    data_dir, status_path = tmp_path / "fleet", tmp_path / "status.json"
    env = {**os.environ, "MODELFLEET_CACHE_BYTES": "1"}  # below the edge's minimum: it refuses to start
    argv = _up_argv(data_dir, status_path, "--once", "--edges", "1")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=110, check=False, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: edge-1 exited with 2 before it was ready: "), done.stderr
    assert "cache_bytes" in errors[0] and str(data_dir / "logs" / "edge-1.log") in errors[0]
    assert not status_path.exists()
    assert _processes_mentioning(str(data_dir)) == []


def test_taken_ports_fall_back_to_free_ones() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert available(port) == 0  # central and edges then bind port 0 and report theirs
        other = concrete(port)  # the broker needs a number up front
        assert other != port and available(other) == other
    plan = PortPlan.build(3, None)
    assert (plan.central_http, plan.edge_http, plan.central_grpc, plan.broker) == (
        8080,
        (8081, 8082, 8083),
        50051,
        1883,
    )
    block = PortPlan.build(2, 20000)
    assert (block.central_http, block.edge_http, block.central_grpc, block.broker) == (
        20000,
        (20001, 20002),
        20010,
        20020,
    )
    with pytest.raises(ValueError, match="base port"):
        PortPlan.build(3, 80)


def test_a_second_up_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    with DataDir(tmp_path / "fleet"), pytest.raises(UpError, match=r"another modelfleet up \(pid \d+\) is running"):
        DataDir(tmp_path / "fleet").__enter__()
    with DataDir(tmp_path / "fleet") as again:  # released when the first one ends
        assert (again.root / ".gitignore").read_text().endswith("*\n")


def _peer_chunks(metrics: str) -> float:
    match = _PEER_CHUNKS.search(metrics)
    assert match is not None, metrics
    return float(match["n"])


def _wait_ready(api: httpx.Client, model: str, node_ids: set[str], timeout: float = 30.0) -> None:
    """Until every node in ``node_ids`` reports ``model`` ready in central's membership."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = api.get("/api/v1/membership").json()["nodes"]
        ready = {n["node_id"] for n in nodes if any(m["name"] == model and m["state"] == "ready" for m in n["models"])}
        if ready >= node_ids:
            return
        assert time.monotonic() < deadline, f"{model} ready on {ready} only"
        time.sleep(0.1)


def test_up_secure_serves_over_https_refuses_anonymous_writes_and_moves_chunks_over_mutual_tls(
    tmp_path: Path, small_model_file: Path
) -> None:
    data_dir, status_path = tmp_path / "fleet", tmp_path / "status.json"
    env = {**os.environ, "MODELFLEET_PLACEMENT__REPLICAS": "1"}  # one owner per chunk: the other edge asks a peer
    with _up_running(_up_argv(data_dir, status_path, "--secure", "--edges", "2"), env) as proc:
        status = _wait_for_file(status_path, proc, timeout=100)
        secure, central = status["secure"], status["central"]
        assert central["http_url"].startswith("https://") and status["broker"]["url"].startswith("mqtts://")
        fleet_ca = ssl.create_default_context(cafile=secure["ca_file"])
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{central['http_url']}/api/v1/membership", timeout=10)  # the system trust store says no
        with httpx.Client(base_url=central["http_url"], verify=fleet_ca, timeout=30) as api:
            tensor = {"name": INPUT_NAME, "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}
            answer = api.post("/v2/models/digits/infer", json={"inputs": [tensor]})
            assert answer.status_code == 200, answer.text  # central → edge over HTTPS with its client certificate
            assert answer.headers["x-modelfleet-node"] in {"edge-1", "edge-2"}

            pushed = api.post("/api/v1/models/digits/versions", files={"file": ("model.onnx", b"not a model")})
            assert pushed.status_code == 401, pushed.text
            # reads are closed too (auth.protect_reads): the API, metrics and the dashboard
            reads = ("/api/v1/nodes", "/api/v1/events", "/api/v1/membership", "/api/v1/models/digits/versions")
            for path in (*reads, "/metrics", "/dashboard", "/api/v1/stream"):
                assert api.get(path).status_code == 401, path
            admin_token = Path(secure["admin_token_file"]).read_text().strip()
            api.headers["Authorization"] = f"Bearer {admin_token}"
            for path in (*reads, "/metrics", "/dashboard"):
                assert api.get(path).status_code == 200, path
            assert [v["version"] for v in api.get("/api/v1/models/digits/versions").json()] == ["1"]

            # alive comes from MQTT births and heartbeats only: logins, ACL and TLS let them through
            nodes = api.get("/api/v1/membership").json()["nodes"]
            assert {n["node_id"]: n["state"] for n in nodes} == {"edge-1": "alive", "edge-2": "alive"}

            # the admin token may push; with one owner per chunk, the other edge gets it from its peer
            body, keep = small_model_file.read_bytes(), {"keep_fp32": "true"}  # it is not worth quantizing
            tiny = api.post("/api/v1/models/tiny/versions", content=body, params=keep)
            assert tiny.status_code == 201, tiny.text
            _wait_ready(api, "tiny", {"edge-1", "edge-2"})

        # a browser signs in to the dashboard once: a Secure, HttpOnly cookie, good for reads only
        with httpx.Client(base_url=central["http_url"], verify=fleet_ca, timeout=30) as browser:
            assert 'action="/dashboard/login"' in browser.get("/dashboard").text
            signed_in = browser.post("/dashboard/login", data={"token": admin_token})
            assert signed_in.status_code == 303 and "; secure" in signed_in.headers["set-cookie"].lower()
            assert browser.get("/dashboard").status_code == browser.get("/api/v1/dashboard").status_code == 200
            assert browser.delete("/api/v1/models/tiny/versions/1").status_code == 401

        # the CLI with the three printed variables (checked below) reads the closed API
        config = tmp_path / "cli.toml"
        config.write_text("")
        cli_env = {**os.environ, "MODELFLEET_CONFIG": str(config), "MODELFLEET_CENTRAL_URL": central["http_url"]}
        cli_env |= {"MODELFLEET_CA_FILE": secure["ca_file"], "MODELFLEET_TOKEN": admin_token}
        nodes_cli = subprocess.run(
            [sys.executable, "-m", "modelfleet", "nodes", "--json"], env=cli_env, capture_output=True, text=True,
            timeout=60, check=False,
        )  # fmt: skip
        assert nodes_cli.returncode == 0, nodes_cli.stderr
        assert {n["node_id"] for n in json.loads(nodes_cli.stdout)} == {"edge-1", "edge-2"}

        # an edge's API wants a fleet client certificate; a chunk moved between the edges over mutual TLS
        operator = ssl.create_default_context(cafile=secure["ca_file"])
        operator.load_cert_chain(secure["client_cert_file"], secure["client_key_file"])
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{status['edges'][0]['metrics_url']}", verify=fleet_ca, timeout=10)
        metrics = [httpx.get(e["metrics_url"], verify=operator, timeout=10).text for e in status["edges"]]
        assert sum(_peer_chunks(m) for m in metrics) >= 1, "\n".join(
            line for m in metrics for line in m.splitlines() if line.startswith(("modelfleet_fetch", "modelfleet_peer"))
        )

        output = _ctrl_c(proc)
    assert proc.returncode == 0, output
    token_file = Path(secure["admin_token_file"])
    assert f"export MODELFLEET_CA_FILE={secure['ca_file']}" in output
    assert f"export MODELFLEET_TOKEN=$(cat {token_file})" in output
    assert f"export MODELFLEET_CENTRAL_URL={central['http_url']}" in output
    assert token_file.stat().st_mode & 0o077 == 0 and token_file.read_text().startswith("mft_")
    assert token_file.read_text().strip() not in output
    _assert_nothing_left(status, data_dir)


def test_up_secure_uses_the_rules_of_the_shipped_acl() -> None:
    shipped = [line.strip() for line in _SHIPPED_ACL.read_text().splitlines()]
    assert [line for line in shipped if line and not line.startswith("#")] == list(ACL_RULES)


def test_up_secure_refuses_the_embedded_broker_with_a_clear_message(tmp_path: Path) -> None:
    secure = prepare(tmp_path / "secure", tmp_path / "central", ["edge-1"])
    group = ChildGroup(tmp_path / "logs")
    with pytest.raises(UpError, match=r"^--secure needs Mosquitto .* drop --broker amqtt$"):
        start_broker(group, "amqtt", 0, tmp_path / "broker", security=secure.broker)
    assert group.children == []  # nothing was started
