"""The Compose file and the Dockerfiles, checked offline (no Docker engine needed):
services, images, ports, healthchecks and volumes; multi-stage builds that run as a
non-root user; settings that name real fields."""

from __future__ import annotations

import re
from typing import Any

import yaml
from deploy_checks import DEPLOY, assert_settings_apply

from central.settings import CentralSettings
from edge_node.settings import EdgeSettings

EDGES = ("edge-a", "edge-b", "edge-c")


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return doc


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port → host port."""
    return {int(p.split(":")[1]): int(p.split(":")[0]) for p in service.get("ports", [])}


def test_compose_runs_a_broker_a_central_and_three_edges_with_healthchecks() -> None:
    services = _compose()["services"]
    assert {"mosquitto", "central", *EDGES} <= set(services)
    assert services["mosquitto"]["image"].startswith("eclipse-mosquitto:")
    conf = services["mosquitto"]["volumes"][0].split(":")[0]
    assert (DEPLOY / conf).is_file()
    assert services["central"]["build"]["dockerfile"] == "deploy/docker/central.Dockerfile"
    assert _published(services["central"]) == {8080: 8080, 50051: 50051}
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
        mounts = dict(v.split(":")[:2][::-1] for v in compose["services"][name]["volumes"])
        assert set(mounts.values()) <= declared, name
        assert "/var/lib/modelfleet" in mounts, name
        if name in EDGES:
            assert "/var/cache/modelfleet" in mounts, name


def test_compose_settings_are_real_and_edges_find_central_and_the_broker() -> None:
    services = _compose()["services"]
    assert_settings_apply(CentralSettings, services["central"]["environment"])
    for name in EDGES:
        env = services[name]["environment"]
        assert_settings_apply(EdgeSettings, env)
        assert env["MODELFLEET_NODE_ID"] == env["MODELFLEET_ADVERTISE_HOST"] == name
        host, port = env["MODELFLEET_CENTRAL"].split(":")
        assert host == "central" and int(port) in _published(services["central"])
        assert env["MODELFLEET_HEARTBEAT__BROKER_HOST"] == "mosquitto"


def _stages(dockerfile: str) -> list[list[str]]:
    """Instructions per stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "docker" / dockerfile).read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def test_dockerfiles_are_multi_stage_and_run_as_a_non_root_user() -> None:
    for dockerfile, port in (("central.Dockerfile", 8080), ("edge.Dockerfile", 8081)):
        stages = _stages(dockerfile)
        assert len(stages) >= 2, dockerfile
        final = stages[-1]
        assert any(i.startswith("COPY --from=") for i in final), dockerfile
        users = [i.split()[1] for i in final if i.upper().startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("root", "0"), dockerfile
        assert any(i.startswith("HEALTHCHECK") and f":{port}/healthz" in i for i in final), dockerfile
        env = dict(re.findall(r"(MODELFLEET_\w+)=(\S+)", " ".join(i for i in final if i.startswith("ENV "))))
        assert env["MODELFLEET_HTTP_PORT"] == str(port)
        assert_settings_apply(CentralSettings if dockerfile.startswith("central") else EdgeSettings, env)


def test_the_build_context_leaves_out_the_virtualenv_and_git() -> None:
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert {".venv", ".git", "bench/out"} <= set(ignored)
