"""The Kubernetes manifests validate offline against the Kubernetes schemas (strict: an
unknown field fails) and hold what deploy/README.md promises."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from deploy_checks import DEPLOY, assert_settings_apply

from central.settings import CentralSettings
from edge_node.settings import EdgeSettings

#: A Kubernetes version kubernetes-validate ships schemas for.
K8S_VERSION = "1.33.0"
K8S = DEPLOY / "k8s"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _find(kind: str, name: str) -> dict[str, Any]:
    found = [d for _, d in _documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize(("file", "doc"), _documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_every_manifest_is_valid_kubernetes(file: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_is_strict_about_unknown_fields() -> None:
    broken = {**_find("Service", "central"), "spec": {**_find("Service", "central")["spec"], "portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kustomization_applies_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert kustomization["namespace"] == "modelfleet"


def _pod(kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = _find(kind, name)["spec"]["template"]["spec"]
    return spec


def _volume_of(pod: dict[str, Any], mount_path: str) -> dict[str, Any]:
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == mount_path]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume


def test_central_is_one_deployment_on_its_claim_behind_a_service() -> None:
    deployment = _find("Deployment", "central")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = _pod("Deployment", "central")
    claim = _volume_of(pod, "/var/lib/modelfleet")["persistentVolumeClaim"]["claimName"]
    assert _find("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    ports = {p["name"]: p["port"] for p in _find("Service", "central")["spec"]["ports"]}
    assert ports == {"http": 8080, "grpc": 50051}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert _find("ConfigMap", "central-settings")["data"]["MODELFLEET_MQTT__HOST"] == "mosquitto"


def test_edges_are_a_daemonset_with_their_cache_on_the_host() -> None:
    pod = _pod("DaemonSet", "edge")
    settings = _find("ConfigMap", "edge-settings")["data"]
    cache = _volume_of(pod, settings["MODELFLEET_CACHE_DIR"])
    assert cache["hostPath"]["type"] == "DirectoryOrCreate"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in pod["containers"][0]["env"]}
    assert env == {"MODELFLEET_NODE_ID": "spec.nodeName", "MODELFLEET_ADVERTISE_HOST": "status.podIP"}
    assert settings["MODELFLEET_CENTRAL"] == "central:50051"
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_mosquitto_runs_with_its_config_from_a_configmap() -> None:
    pod = _pod("Deployment", "mosquitto")
    config = _volume_of(pod, "/mosquitto/config")["configMap"]["name"]
    text = _find("ConfigMap", config)["data"]["mosquitto.conf"]
    assert "listener 1883 0.0.0.0" in text
    assert _find("Service", "mosquitto")["spec"]["ports"][0]["port"] == 1883


def test_settings_configmaps_name_real_settings_with_valid_values() -> None:
    assert_settings_apply(CentralSettings, _find("ConfigMap", "central-settings")["data"])
    assert_settings_apply(EdgeSettings, _find("ConfigMap", "edge-settings")["data"])
