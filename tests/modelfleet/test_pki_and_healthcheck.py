"""``modelfleet pki issue`` (the certificates of the deployment files) and
``python -m modelfleet.healthcheck`` (the images' healthcheck) against a real central and
a real edge serving TLS with those certificates."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from cryptography import x509
from typer.testing import CliRunner

from central.server import CentralServer
from fleetwire.peer_identity import node_dns_name, node_uri
from modelfleet.cli import app
from modelfleet.healthcheck import check
from support.fleet import EdgeFactory, central_settings


def issue(tmp_path: Path, name: str, *extra: str) -> tuple[int, str, Path]:
    out = tmp_path / "secrets" / name
    result = CliRunner().invoke(
        app, ["pki", "issue", name, "--ca-dir", str(tmp_path / "ca"), "--out", str(out), *extra]
    )
    return result.exit_code, result.output, out


def sans(cert_file: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n.value) for n in names]


def files(out: Path, **extra: object) -> dict[str, object]:
    """A ``tls`` settings section with the files ``pki issue`` put in ``out``."""
    return {"enabled": True, **{f"{k}_file": out / f"{k}.pem" for k in ("cert", "key", "ca")}, **extra}


def tls_env(out: Path, port: int) -> dict[str, str]:
    return {
        "MODELFLEET_HTTP_PORT": str(port),
        "MODELFLEET_TLS__ENABLED": "true",
        "MODELFLEET_TLS__CERT_FILE": str(out / "cert.pem"),
        "MODELFLEET_TLS__KEY_FILE": str(out / "key.pem"),
        "MODELFLEET_TLS__CA_FILE": str(out / "ca.pem"),
    }


def test_pki_issue_makes_the_ca_once_and_keeps_what_it_issued(tmp_path: Path) -> None:
    code, output, central = issue(tmp_path, "central", "--san", "central", "--san", "127.0.0.1")
    assert code == 0, output
    assert {p.name for p in central.iterdir()} == {"cert.pem", "key.pem", "ca.pem"}
    assert (central / "key.pem").stat().st_mode & 0o077 == 0
    assert (tmp_path / "ca" / "fleet-ca-key.pem").stat().st_mode & 0o077 == 0
    assert sans(central / "cert.pem") == ["central", "127.0.0.1"]
    first = (central / "cert.pem").read_bytes()

    code, output, edge = issue(tmp_path, "edge", "--san", "*.edge.modelfleet.svc.cluster.local")
    assert code == 0, output
    assert (edge / "ca.pem").read_bytes() == (central / "ca.pem").read_bytes()  # one CA for the fleet
    code, output, _ = issue(tmp_path, "central")  # again: kept
    assert code == 0 and "kept" in output and (central / "cert.pem").read_bytes() == first
    code, output, _ = issue(tmp_path, "central", "--renew")
    assert code == 0 and (central / "cert.pem").read_bytes() != first
    assert sans(central / "cert.pem") == ["central", "localhost", "127.0.0.1"]  # the default names

    # a certificate of another CA in --out is not silently kept
    assert issue(tmp_path / "elsewhere", "foreign")[0] == 0
    (tmp_path / "elsewhere" / "secrets" / "foreign").rename(tmp_path / "secrets" / "foreign")
    code, output, _ = issue(tmp_path, "foreign")
    assert code == 1 and "was not issued by the CA" in output and "Traceback" not in output


def test_pki_issue_node_binds_an_edges_certificate_to_its_id_and_rebinds_an_unbound_one(tmp_path: Path) -> None:
    code, output, out = issue(tmp_path, "edge-a", "--san", "edge-a")  # as Compose made them before
    assert code == 0, output
    unbound = (out / "cert.pem").read_bytes()
    code, output, _ = issue(tmp_path, "edge-a", "--node", "edge-a", "--san", "edge-a")
    assert code == 0 and "not bound to node edge-a" in output and "bound to node edge-a" in output, output
    assert (out / "cert.pem").read_bytes() != unbound
    assert sans(out / "cert.pem") == ["edge-a", node_uri("edge-a"), node_dns_name("edge-a")]
    bound = (out / "cert.pem").read_bytes()
    code, output, _ = issue(tmp_path, "edge-a", "--node", "edge-a", "--san", "edge-a")  # again: kept
    assert code == 0 and "kept" in output and (out / "cert.pem").read_bytes() == bound
    code, output, _ = issue(tmp_path, "bad", "--node", "no/such id")
    assert code == 1 and "node id" in output and "Traceback" not in output, output


async def test_the_healthcheck_speaks_tls_with_its_own_certificate(tmp_path: Path, make_edge: EdgeFactory) -> None:
    for name in ("central", "edge-0"):
        assert issue(tmp_path, name)[0] == 0
    secrets = tmp_path / "secrets"
    central = CentralServer(central_settings(tmp_path / "central", tls=files(secrets / "central")))
    await central.start()
    try:
        edge = await make_edge("edge-0", central, tls=files(secrets / "edge-0", require_client_cert=True))
        central_env = tls_env(secrets / "central", central.http_port)
        edge_env = tls_env(secrets / "edge-0", edge.http_port)
        assert await asyncio.to_thread(check, central_env) is None
        assert await asyncio.to_thread(check, edge_env) is None
        # the edge takes no client without a fleet certificate; nobody takes plain HTTP
        anonymous = {k: v for k, v in edge_env.items() if not k.endswith(("CERT_FILE", "KEY_FILE"))}
        assert await asyncio.to_thread(check, anonymous) is not None
        assert await asyncio.to_thread(check, {**central_env, "MODELFLEET_TLS__ENABLED": "false"}) is not None
        # as the images run it: a process of its own, exit status and one line
        run = {**os.environ, **edge_env}
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "modelfleet.healthcheck"], env=run, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        run["MODELFLEET_HTTP_PORT"] = str(central.grpc_port)  # nothing speaks HTTPS there
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "modelfleet.healthcheck"], env=run, capture_output=True, text=True
        )
        assert done.returncode == 1 and done.stderr.startswith("unhealthy: ") and len(done.stderr.splitlines()) == 1
    finally:
        await central.stop()
