"""``modelfleet up --ha --secure`` as a user runs it: three central replicas on a private
PostgreSQL and a local S3 server, one edge given all three gRPC addresses, the digits model
pushed and served; every replica answers over HTTPS, checks tokens kept in PostgreSQL, holds
its own MQTT login (Mosquitto with TLS, passwords and the ACL) and sees the one shared
registry, and Ctrl-C stops it all, PostgreSQL included. (One fleet for both flags: ``--secure``
only adds credentials to what ``--ha`` starts, and each fleet costs a minute on two cores.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelfleet.zoo.digits import INPUT_NAME
from support.processes import ctrl_c_able

#: Three replicas and an edge start on two shared cores; PostgreSQL and SeaweedFS beside them.
pytestmark = [pytest.mark.fleet, pytest.mark.timeout(240)]


def _wait_for_status(path: Path, proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"modelfleet up --ha exited with {proc.returncode}: {proc.communicate()[0]}")
        assert time.monotonic() < deadline, "no status file"
        time.sleep(0.2)
    return dict(json.loads(path.read_text()))


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_up_ha_secure_runs_three_replicas_with_a_login_each_on_shared_postgres_and_s3_until_ctrl_c(
    tmp_path: Path,
) -> None:
    data_dir, status_path = tmp_path / "fleet", tmp_path / "status.json"
    argv = [
        sys.executable, "-m", "modelfleet", "up", "--ha", "--secure", "--edges", "1", "--base-port", "0",
        "--data-dir", str(data_dir), "--json-status", str(status_path),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
                            preexec_fn=ctrl_c_able)  # fmt: skip
    try:
        status = _wait_for_status(status_path, proc, timeout=200)
        replicas, shared, secure = status["replicas"], status["shared"], status["secure"]
        assert [r["replica_id"] for r in replicas] == ["central-1", "central-2", "central-3"]
        assert status["central"]["http_url"] == replicas[0]["http_url"]
        assert len({r["http_url"] for r in replicas}) == len({r["grpc_address"] for r in replicas}) == 3
        assert status["broker"]["url"].startswith("mqtts://")
        fleet_ca = ssl.create_default_context(cafile=secure["ca_file"])
        admin = {"Authorization": f"Bearer {Path(secure['admin_token_file']).read_text().strip()}"}
        for replica in replicas:
            assert replica["http_url"].startswith("https://")
            assert httpx.get(replica["healthz_url"], verify=fleet_ca, timeout=10).status_code == 200, replica
            # one registry in PostgreSQL, and the tokens there: every replica refuses an anonymous
            # read and lists, for the admin token, the version pushed to central-1
            url = f"{replica['http_url']}/api/v1/models/digits/versions"
            assert httpx.get(url, verify=fleet_ca, timeout=10).status_code == 401, replica
            versions = httpx.get(url, verify=fleet_ca, headers=admin, timeout=10)
            assert [v["version"] for v in versions.json()] == ["1"], replica
        assert _listening(shared["postgres_host"], shared["postgres_port"])

        # the edge, given all three replicas and its own MQTT login, heartbeated on its partition
        # (the ACL let it through), fetched the chunks over mutual TLS and serves the model
        assert status["demo"]["nodes"] == ["edge-1"] and status["demo"]["accuracy"] >= 0.9
        (edge,) = status["edges"]
        operator = ssl.create_default_context(cafile=secure["ca_file"])
        operator.load_cert_chain(secure["client_cert_file"], secure["client_key_file"])
        tensor = {"name": INPUT_NAME, "datatype": "FP32", "shape": [1, 64], "data": [0.0] * 64}
        infer = f"{edge['http_url']}/v2/models/digits/infer"
        answer = httpx.post(infer, json={"inputs": [tensor]}, verify=operator, timeout=30)
        assert answer.status_code == 200, answer.text

        # one MQTT login per replica: none closes another's session, so each stays connected
        logins = Path(data_dir / "secure" / "mosquitto" / "passwd").read_text()
        assert sorted(line.split(":")[0] for line in logins.splitlines()) == [
            "central-1", "central-2", "central-3", "edge-1",
        ]  # fmt: skip
        time.sleep(2.0)  # a shared login would have them take each other's client id by now
        for replica in replicas:
            ready = httpx.get(f"{replica['http_url']}/readyz", verify=fleet_ca, headers=admin, timeout=10)
            assert ready.json()["checks"]["broker"] is True, (replica["replica_id"], ready.text)

        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    for replica in replicas:
        assert f"{replica['replica_id']:<16} {replica['http_url']}" in output  # each replica's URL printed
    # broker, S3, three replicas, the edge; then PostgreSQL, which is no child
    assert "stop the fleet — 6 processes stopped" in output
    pids = [status["broker"]["pid"], shared["s3_pid"], *(r["pid"] for r in replicas), edge["pid"]]
    assert [pid for pid in pids if _running(pid)] == []
    assert not _listening(shared["postgres_host"], shared["postgres_port"])
