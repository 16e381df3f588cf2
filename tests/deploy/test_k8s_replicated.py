"""The replicated Kubernetes layout (``deploy/k8s-ha``, an overlay of ``deploy/k8s``) holds
what deploy/README.md promises: three replicas on three nodes with a budget of two, probes,
limits and a locked-down pod, PostgreSQL and S3 outside, every Secret made by its
make-secrets.sh (run here against a real PostgreSQL, where the tokens go) and read where the
pods use it, and each replica advertising a name its certificate carries. Every manifest is
validated against the Kubernetes schemas with the others (test_k8s_manifests.py); the
overlay's patches are applied here by hand, as kustomize would, to check its references."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_checks import CONTAINER_SECRETS, assert_settings_apply, run_script
from test_k8s_manifests import K8S, K8S_HA, NODES, _env_file, _find, _handshake, _pod, _secret_mounts

from central.registry.signing import KEY_FILE, ManifestSigner
from central.settings import CentralSettings
from central.storage.postgres.tokens import PostgresTokenStore
from modelfleet.up.postgres import PostgresInstance

_S3_KEYS = {"MODELFLEET_BLOBS__ACCESS_KEY": "fleet-access", "MODELFLEET_BLOBS__SECRET_KEY": "fleet-secret"}


def _overlay() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S_HA / "kustomization.yaml").read_text())
    return doc


def _deleted() -> set[tuple[str, str]]:
    """(kind, name) of what the overlay's ``$patch: delete`` patches remove from the base."""
    found = set()
    for entry in _overlay()["patches"]:
        patch = yaml.safe_load(entry["patch"])
        assert patch["$patch"] == "delete"
        found.add((patch["kind"], patch["metadata"]["name"]))
    return found


def _rendered() -> list[dict[str, Any]]:
    """The base's manifests without the deleted ones, plus the overlay's (no generators)."""
    base = [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml" for d in _load(p)]
    ha = [d for p in sorted(K8S_HA.glob("*.yaml")) if p.name != "kustomization.yaml" for d in _load(p)]
    return [d for d in base if (d["kind"], d["metadata"]["name"]) not in _deleted()] + ha


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_overlay_replaces_the_single_central_and_its_volume_and_adds_the_rest() -> None:
    overlay = _overlay()
    files = {p.name for p in K8S_HA.glob("*.yaml")} - {"kustomization.yaml"}
    assert overlay["resources"] == ["../k8s", *sorted(files)] and overlay["namespace"] == "modelfleet"
    assert _deleted() == {("Deployment", "central"), ("PersistentVolumeClaim", "central-data")}
    rendered = _rendered()
    assert not any(d["kind"] == "PersistentVolumeClaim" for d in rendered)  # nothing pins a replica to a disk
    deployments = [d["metadata"]["name"] for d in rendered if d["kind"] == "Deployment"]
    assert sorted(deployments) == ["central-ha", "mosquitto"]
    assert "secrets/" in (K8S_HA / ".gitignore").read_text().split()


def test_every_secret_and_configmap_the_replicas_use_is_made_by_one_of_the_kustomizations() -> None:
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    secrets = {g["name"] for k in (base, _overlay()) for g in k["secretGenerator"]}
    configmaps = {d["metadata"]["name"] for d in _rendered() if d["kind"] == "ConfigMap"}
    pod = _pod("Deployment", "central-ha")
    used = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for container in pod["containers"] + pod["initContainers"]:
        refs = [e["valueFrom"] for e in container.get("env", []) if "valueFrom" in e]
        used |= {ref["secretKeyRef"]["name"] for ref in refs if "secretKeyRef" in ref}
        assert {e["configMapRef"]["name"] for e in container.get("envFrom", [])} <= configmaps
    assert used <= secrets and {"central-store", "central-s3", "central-signing-key", "central-tls"} <= used


def test_three_replicas_on_three_nodes_keep_two_through_disruptions() -> None:
    deployment = _find("Deployment", "central-ha")
    assert deployment["spec"]["replicas"] == 3
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    pod = _pod("Deployment", "central-ha")
    (rule,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname" and rule["labelSelector"]["matchLabels"].items() <= (
        pod_labels.items()
    )
    budget = _find("PodDisruptionBudget", "central")["spec"]
    assert budget["minAvailable"] == 2 and budget["selector"]["matchLabels"].items() <= pod_labels.items()
    # the base's Service spreads clients over the replicas; the headless one names each
    assert _find("Service", "central")["spec"]["selector"].items() <= pod_labels.items()
    headless = _find("Service", "central-replicas")["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    external = {name: _find("Service", name)["spec"] for name in ("postgres", "s3")}
    assert {spec["type"] for spec in external.values()} == {"ExternalName"}


def test_the_replicas_are_locked_down_limited_and_probed() -> None:
    pod = _pod("Deployment", "central-ha")
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for container in pod["containers"] + pod["initContainers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= container["resources"]["limits"].keys(), container["name"]
    central = pod["containers"][0]
    probes = {kind: central[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert {kind: (p["path"], p["scheme"]) for kind, p in probes.items()} == {
        "startupProbe": ("/healthz", "HTTPS"),
        "readinessProbe": ("/readyz", "HTTPS"),
        "livenessProbe": ("/healthz", "HTTPS"),
    }
    settings = _find("ConfigMap", "central-ha-settings")["data"]
    assert settings["MODELFLEET_BLOBS__S3_ENDPOINT"].startswith("https://")


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresInstance) -> tuple[Path, Path, str]:
    """k8s-ha/make-secrets.sh run for two nodes against a fresh database: (the base's secrets,
    the overlay's secrets, the store URL)."""
    root = tmp_path_factory.mktemp("k8s-ha-secrets")
    url = postgres.fresh_database()
    env = {"SECRETS_DIR": str(root / "base"), "HA_SECRETS_DIR": str(root / "ha"), "MODELFLEET_STORE__URL": url}
    run_script(K8S_HA / "make-secrets.sh", root / "bin", {**env, **_S3_KEYS}, *NODES)
    return root / "base", root / "ha", url


def test_make_secrets_puts_the_tokens_in_postgres_and_makes_every_file_the_overlay_names(
    made: tuple[Path, Path, str],
) -> None:
    base, ha, url = made
    for generator in _overlay()["secretGenerator"]:
        for source in generator.get("envs", []) + [f.rpartition("=")[2] for f in generator.get("files", [])]:
            path = ha / Path(source).relative_to("secrets")
            assert path.is_file() and path.stat().st_size > 0, path
    assert _env_file(ha / "store.env") == {"url": url}
    assert _env_file(ha / "s3.env") == {"access_key": "fleet-access", "secret_key": "fleet-secret"}
    operators, nodes = PostgresTokenStore(url, "operator"), PostgresTokenStore(url, "node")
    try:
        admin = operators.verify((base / "admin.token").read_text().strip())
        assert admin is not None and admin.role == "admin"
        for node, token in _env_file(base / "edge-node-tokens.env").items():
            record = nodes.verify(token)
            assert record is not None and record.node_id == node
    finally:
        operators.close()
        nodes.close()


def test_a_replica_reads_its_settings_signs_with_the_shared_key_and_advertises_a_name_its_certificate_has(
    made: tuple[Path, Path, str], tmp_path: Path
) -> None:
    base, ha, _ = made
    pod = _pod("Deployment", "central-ha")
    central = pod["containers"][0]

    # the init container's copy of the signing key is the key central then loads
    (init,) = pod["initContainers"]
    data = tmp_path / "data"
    script = init["args"][0].replace("/key/", f"{ha}/").replace("/var/lib/modelfleet/", f"{data}/")
    subprocess.run(["sh", "-ec", script], check=True)
    assert (data / "central" / KEY_FILE).stat().st_mode & 0o077 == 0
    copied = ManifestSigner.load_or_create(data / "central").public_key
    assert copied == ManifestSigner.load_or_create(_key_dir(ha, tmp_path)).public_key

    # its start line: the advertised addresses, under the headless Service
    settings = {
        **_find("ConfigMap", "central-settings")["data"],
        **_find("ConfigMap", "central-ha-settings")["data"],
    }
    start = central["args"][0].replace("exec modelfleet central", 'echo "$MODELFLEET_HA__ADVERTISE_GRPC"')
    env = {**os.environ, **settings, "POD_IP": "10.1.2.3", "POD_NAMESPACE": "modelfleet"}
    grpc = subprocess.run(["sh", "-ec", start], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert grpc == "10-1-2-3.central-replicas.modelfleet.svc.cluster.local:50051"
    mounts = _secret_mounts(pod, central, base)
    tls = mounts[f"{CONTAINER_SECRETS}/tls"]
    assert _handshake(tls / "cert.pem", tls / "key.pem", tls / "ca.pem", grpc.rsplit(":", 1)[0])

    # and every variable is a real setting that takes effect, the Secrets' values included
    env_vars = {
        **settings,
        "MODELFLEET_HA__REPLICA_ID": "central-ha-7d9f8c6b5-x2x4z",  # a pod's name
        "MODELFLEET_HA__ADVERTISE_GRPC": grpc,
        "MODELFLEET_STORE__URL": _env_file(ha / "store.env")["url"],
        **_S3_KEYS,
    }
    assert_settings_apply(CentralSettings, env_vars, mounts)


def _key_dir(ha: Path, tmp_path: Path) -> Path:
    """A data dir holding the Secret's signing key, as central keeps it."""
    target = tmp_path / "secret-key"
    target.mkdir()
    (target / KEY_FILE).write_bytes((ha / "manifest-signing.key").read_bytes())
    (target / KEY_FILE).chmod(0o600)
    return target
