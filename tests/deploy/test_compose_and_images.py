"""The Compose file and the Dockerfiles, checked offline (no Docker engine needed):
services, images, ports, healthchecks and volumes; multi-stage builds that run as a
non-root user; settings that name real fields; and secure defaults: tokens, TLS and
broker logins on, with the certificates and tokens the Compose ``secrets`` service
makes (its script runs here, with the project's CLI) where each service reads them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from deploy_checks import (
    CONTAINER_SECRETS,
    DEPLOY,
    assert_secure_broker,
    assert_settings_apply,
    dockerfile_stages,
    image_env,
    run_script,
)

from central.settings import CentralSettings
from central.storage.files.tokens import TokenStore
from edge_node.settings import EdgeSettings
from fleetwire.peer_identity import node_of_uris

EDGES = ("edge-a", "edge-b", "edge-c")
SCRIPT = DEPLOY / "docker" / "compose-secrets.sh"
TRUE = "true"


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return doc


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port → host port."""
    return {int(p.split(":")[-1]): int(p.split(":")[-2]) for p in service.get("ports", [])}


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path → volume (or host path) of a service's short-syntax volumes."""
    return {v.split(":")[1]: v.split(":")[0] for v in service.get("volumes", [])}


def _env(name: str) -> dict[str, str]:
    """What a Compose service runs with: its image's environment, then its own."""
    service = _compose()["services"][name]
    dockerfile = service["build"]["dockerfile"].rsplit("/", 1)[-1]
    return {**image_env(dockerfile), **{k: str(v) for k, v in service.get("environment", {}).items()}}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``secrets`` service's script, run as in its container (paths under this root)."""
    root = tmp_path_factory.mktemp("compose-secrets")
    run_script(SCRIPT, root / "bin", {"SECRETS_ROOT": str(root), "SKIP_CHOWN": "1"})
    return root


def _secrets_of(name: str, root: Path) -> dict[str, Path]:
    """Where service ``name``'s secrets volume is on this machine: the volume it mounts at
    /run/modelfleet/secrets, found where the ``secrets`` service writes into it."""
    services = _compose()["services"]
    volume = _mounts(services[name])[CONTAINER_SECRETS]
    written = {v: path for path, v in _mounts(services["secrets"]).items()}[volume]
    return {CONTAINER_SECRETS: root / written.lstrip("/")}


def test_compose_runs_a_broker_a_central_and_three_edges_with_healthchecks() -> None:
    services = _compose()["services"]
    assert {"mosquitto", "central", *EDGES} <= set(services)
    assert services["mosquitto"]["image"].startswith("eclipse-mosquitto:")
    conf = services["mosquitto"]["volumes"][0].split(":")[0]
    assert (DEPLOY / conf).is_file()
    assert services["central"]["build"]["dockerfile"] == "deploy/docker/central.Dockerfile"
    assert _published(services["central"]) == {8080: 8080, 50051: 50051, 8001: 8001}  # 8001: gateway over gRPC
    host_ports = set()
    for name in ("mosquitto", "central", *EDGES):
        service = services[name]
        assert service["healthcheck"]["test"][0] == "CMD", name
        if name in EDGES:
            assert service["build"]["dockerfile"] == "deploy/docker/edge.Dockerfile"
            assert service["depends_on"]["central"]["condition"] == "service_healthy"
            host_ports |= set(_published(service).values())
    assert len(host_ports) == 3  # each edge reachable on its own host port


def test_compose_volumes_are_declared_and_edges_keep_cache_and_data_apart() -> None:
    compose = _compose()
    declared = set(compose["volumes"])
    for name in ("central", *EDGES):
        mounts = _mounts(compose["services"][name])
        assert set(mounts.values()) <= declared, name
        assert "/var/lib/modelfleet" in mounts, name
        if name in EDGES:
            assert "/var/cache/modelfleet" in mounts, name
    # one secrets volume per process: none reads another's key
    secrets = [_mounts(compose["services"][n])[CONTAINER_SECRETS] for n in ("central", *EDGES)]
    assert len(set(secrets)) == len(secrets)


def test_compose_settings_are_real_and_edges_find_central_and_the_broker(made: Path) -> None:
    assert_settings_apply(CentralSettings, _env("central"), _secrets_of("central", made))
    central_ports = _published(_compose()["services"]["central"])
    for name in EDGES:
        env = _env(name)
        assert_settings_apply(EdgeSettings, env, _secrets_of(name, made))
        assert env["MODELFLEET_NODE_ID"] == env["MODELFLEET_ADVERTISE_HOST"] == name
        host, port = env["MODELFLEET_CENTRAL"].split(":")
        assert host == "central" and int(port) in central_ports
        assert env["MODELFLEET_BROKER__HOST"] == "mosquitto"


def test_compose_is_secure_by_default() -> None:
    """Tokens for every write and read, node tokens, TLS (client certificates on gRPC and
    on the edges' API), MQTT over TLS with a login per process; no password defaults."""
    central = _env("central")
    for key in ("AUTH__ENABLED", "AUTH__PROTECT_READS", "AUTH__NODES_REQUIRED", "TLS__ENABLED"):
        assert central[f"MODELFLEET_{key}"] == TRUE, key
    assert central["MODELFLEET_TLS__REQUIRE_CLIENT_CERT"] == central["MODELFLEET_BROKER__TLS__ENABLED"] == TRUE
    assert central["MODELFLEET_BROKER__USERNAME"] == "central" and central["MODELFLEET_BROKER__PORT"] == "8883"
    for name in EDGES:
        env = _env(name)
        assert env["MODELFLEET_TLS__ENABLED"] == env["MODELFLEET_TLS__REQUIRE_CLIENT_CERT"] == TRUE, name
        assert env["MODELFLEET_BROKER__TLS__ENABLED"] == TRUE and env["MODELFLEET_BROKER__PORT"] == "8883"
        assert env["MODELFLEET_BROKER__USERNAME"] == name  # the ACL's user = node id
        assert env["MODELFLEET_NODE_TOKEN_FILE"].startswith(CONTAINER_SECRETS)
    # every password comes from deploy/.env; none has a default to fall back on
    text = (DEPLOY / "docker-compose.yml").read_text()
    passwords = re.findall(r"\$\{(MODELFLEET_MQTT_PASSWORD_\w+)(:?[-?])?([^}]*)\}", text)
    assert passwords and all(form == ":?" for _, form, _ in passwords), passwords
    assert "change-me" not in text
    # the broker: TLS only from outside, client ids bound to logins on every listener
    services = _compose()["services"]
    assert _published(services["mosquitto"]) == {8883: 8883}
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
    assert_secure_broker(conf)
    for name in ("prometheus", "grafana"):  # no logins of their own: this machine only
        assert all(p.startswith("127.0.0.1:") for p in services[name]["ports"]), name


def test_the_secrets_service_makes_what_every_service_reads_and_keeps_it(made: Path, tmp_path: Path) -> None:
    central_data = made / "var/lib/modelfleet/central"
    nodes = TokenStore(central_data / "node_tokens.json")
    for name in EDGES:
        token = (made / "secrets" / name / "node" / "node-token").read_text().strip()
        record = nodes.verify(token)
        assert record is not None and record.node_id == name
        cert = x509.load_pem_x509_certificate((made / "secrets" / name / "tls" / "cert.pem").read_bytes())
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert node_of_uris(uris.get_values_for_type(x509.UniformResourceIdentifier)) == name  # peers check it
    scrape = (made / "secrets" / "operator" / "prometheus.token").read_text().strip()
    viewer = TokenStore(central_data / "tokens.json").verify(scrape)
    assert viewer is not None and viewer.role == "viewer"
    assert not (made / "secrets" / "central" / "tls" / "ca-key.pem").exists()  # the CA key stays in /pki
    # what Prometheus and the broker mount is where they look
    services = _compose()["services"]
    assert _mounts(services["mosquitto"])["/mosquitto/certs"] == "mosquitto-secrets"
    assert {"cert.pem", "key.pem", "ca.pem"} <= {p.name for p in (made / "secrets" / "mosquitto").iterdir()}
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    operator = {CONTAINER_SECRETS: made / "secrets" / "operator"}
    assert _mounts(services["prometheus"])[CONTAINER_SECRETS] == "operator-secrets"
    for job in prometheus["scrape_configs"]:
        files = [*job["tls_config"].values(), *job.get("authorization", {}).values()]
        for path in files:
            assert Path(str(path).replace(CONTAINER_SECRETS, str(operator[CONTAINER_SECRETS]))).is_file(), path

    # a second "up": nothing changes
    before = {p: p.read_bytes() for p in made.rglob("*") if p.is_file() and "bin" not in p.parts}
    run_script(SCRIPT, made / "bin", {"SECRETS_ROOT": str(made), "SKIP_CHOWN": "1"})
    after = {p: p.read_bytes() for p in made.rglob("*") if p.is_file() and "bin" not in p.parts}
    assert after == before


def test_dockerfiles_are_multi_stage_and_run_as_a_non_root_user(made: Path) -> None:
    for dockerfile, port in (("central.Dockerfile", 8080), ("edge.Dockerfile", 8081)):
        stages = dockerfile_stages(dockerfile)
        assert len(stages) >= 2, dockerfile
        final = stages[-1]
        assert any(i.startswith("COPY --from=") for i in final), dockerfile
        users = [i.split()[1] for i in final if i.upper().startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("root", "0"), dockerfile
        assert any(i.startswith("HEALTHCHECK") and "modelfleet.healthcheck" in i for i in final), dockerfile
        env = image_env(dockerfile)
        assert env["MODELFLEET_HTTP_PORT"] == str(port)  # the port the healthcheck asks
        which = "central" if dockerfile.startswith("central") else "edge-a"
        settings = CentralSettings if which == "central" else EdgeSettings
        assert_settings_apply(settings, env, {CONTAINER_SECRETS: made / "secrets" / which})


def test_images_are_secure_by_default() -> None:
    """Both bind every interface, so both refuse what is not authenticated unless told otherwise."""
    central, edge = image_env("central.Dockerfile"), image_env("edge.Dockerfile")
    assert central["MODELFLEET_HTTP_HOST"] == edge["MODELFLEET_HTTP_HOST"] == "0.0.0.0"
    for key in ("AUTH__ENABLED", "AUTH__PROTECT_READS", "AUTH__NODES_REQUIRED", "TLS__ENABLED", "BROKER__TLS__ENABLED"):
        assert central[f"MODELFLEET_{key}"] == TRUE, key
    assert central["MODELFLEET_TLS__REQUIRE_CLIENT_CERT"] == TRUE
    for key in ("TLS__ENABLED", "TLS__REQUIRE_CLIENT_CERT", "BROKER__TLS__ENABLED"):
        assert edge[f"MODELFLEET_{key}"] == TRUE, key
    assert "MODELFLEET_NODE_TOKEN_FILE" in edge
    for env in (central, edge):
        assert {v for k, v in env.items() if k.endswith("_FILE")} <= {
            f"{CONTAINER_SECRETS}/{f}" for f in ("tls/cert.pem", "tls/key.pem", "tls/ca.pem", "node/node-token")
        }


def test_the_build_context_leaves_out_the_virtualenv_and_git() -> None:
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert {".venv", ".git", "bench/out"} <= set(ignored)
    assert ".env" in (DEPLOY / ".gitignore").read_text().split()  # the broker passwords
