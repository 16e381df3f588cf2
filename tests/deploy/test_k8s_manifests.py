"""The Kubernetes manifests validate offline against the Kubernetes schemas (strict: an
unknown field fails) and hold what deploy/README.md promises; the broker's config and ACL
run in a real Mosquitto."""

from __future__ import annotations

import getpass
import threading
import uuid
from typing import Any

import kubernetes_validate
import paho.mqtt.client as mqtt
import pytest
import yaml
from deploy_checks import DEPLOY, assert_settings_apply
from paho.mqtt.enums import CallbackAPIVersion

from brokers import MosquittoBroker, Subscriber
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
    env = {e["name"]: e["valueFrom"] for e in pod["containers"][0]["env"]}
    assert env["MODELFLEET_NODE_ID"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["MODELFLEET_ADVERTISE_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
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


def _secret_refs(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Environment variable → (Secret name, key) of a container's secretKeyRefs."""
    refs = {}
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            refs[entry["name"]] = (ref["name"], ref["key"])
    return refs


def _broker_files() -> tuple[str, str]:
    data = _find("ConfigMap", "mosquitto-config")["data"]
    return data["mosquitto.conf"], data["acl"]


def test_the_broker_requires_logins_from_the_generated_secret_and_central_and_edges_have_theirs() -> None:
    conf, _ = _broker_files()
    assert "allow_anonymous false" in conf.splitlines() and "allow_anonymous true" not in conf
    assert "acl_file /mosquitto/config/acl" in conf.splitlines()  # the ConfigMap's "acl" key, mounted there
    # the Secret comes from kustomize (never committed): mqtt-logins.env, ignored by git
    (generator,) = yaml.safe_load((K8S / "kustomization.yaml").read_text())["secretGenerator"]
    assert generator["envs"] == ["mqtt-logins.env"] and "mqtt-logins.env" in (K8S / ".gitignore").read_text()
    secret = generator["name"]

    # the password file: written by the init container into a memory volume the broker reads
    pod = _pod("Deployment", "mosquitto")
    (init,) = pod["initContainers"]
    assert "password_file /mosquitto/auth/passwd" in conf.splitlines() and "f=/mosquitto/auth/passwd" in init["args"][0]
    assert _volume_of(pod, "/mosquitto/auth") == {"name": "auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert {m["name"] for m in init["volumeMounts"]} >= {"auth"}
    assert _secret_refs(init) == {"PW_CENTRAL": (secret, "central"), "PW_EDGE": (secret, "edge")}
    assert 'central "$PW_CENTRAL"' in init["args"][0] and 'edge "$PW_EDGE"' in init["args"][0]

    central = _pod("Deployment", "central")["containers"][0]
    assert _find("ConfigMap", "central-settings")["data"]["MODELFLEET_MQTT__USERNAME"] == "central"
    assert _secret_refs(central) == {"MODELFLEET_MQTT__PASSWORD": (secret, "central")}
    edge = _pod("DaemonSet", "edge")["containers"][0]
    assert _find("ConfigMap", "edge-settings")["data"]["MODELFLEET_HEARTBEAT__USERNAME"] == "edge"
    assert _secret_refs(edge) == {"MODELFLEET_HEARTBEAT__PASSWORD": (secret, "edge")}


def _publish(
    broker: MosquittoBroker, user: str | None, password: str | None, messages: list[tuple[str, bytes]]
) -> bool:
    """Log in and publish ``messages`` at QoS 1, in order; False when the login is refused."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"k8s-{uuid.uuid4().hex[:8]}")
    if user is not None:
        client.username_pw_set(user, password)
    connack: list[Any] = []
    answered = threading.Event()
    client.on_connect = lambda _c, _u, _f, reason, _p: (connack.append(reason), answered.set())
    client.connect(broker.host, broker.port, keepalive=10)
    client.loop_start()
    try:
        assert answered.wait(5), "no CONNACK"
        if connack[0].is_failure:
            return False
        for topic, payload in messages:
            client.publish(topic, payload, qos=1).wait_for_publish(5)
        return True
    finally:
        client.disconnect()
        client.loop_stop()


def test_the_brokers_config_and_acl_refuse_anonymous_clients_and_keep_edges_off_centrals_topics() -> None:
    conf, acl = _broker_files()
    users = {"central": "central-secret", "edge": "edge-secret"}
    with MosquittoBroker(users=users, acl=acl) as broker:
        broker.stop()  # the ConfigMap's config as it is, with a loopback port and the test's paths
        broker.conf_path.write_text(
            conf.replace("listener 1883 0.0.0.0", f"listener {broker.port} {broker.host}")
            .replace("/mosquitto/auth/passwd", str(broker.dir / "passwd"))
            .replace("/mosquitto/config/acl", str(broker.dir / "acl"))
            + f"user {getpass.getuser()}\n"
        )
        broker.start()
        assert not _publish(broker, None, None, []) and not _publish(broker, "edge", "wrong", [])
        with Subscriber(broker, "modelfleet/v1/#", username="central", password="central-secret") as central:
            # in order on one connection: once the last (allowed) one arrived, the others would have too
            assert _publish(
                broker,
                "edge",
                "edge-secret",
                [
                    ("modelfleet/v1/central/status", b"forged"),
                    ("modelfleet/v1/events", b"forged"),
                    ("modelfleet/v1/nodes/node-a/heartbeat", b"hb-a"),
                    ("modelfleet/v1/nodes/node-b/status", b"st-b"),
                ],
            )
            central.wait_topic("modelfleet/v1/nodes/node-b/status")
            # the shared edge login: any node's topics (the documented weakness), never central's
            assert [(m.topic, m.payload) for m in central.messages] == [
                ("modelfleet/v1/nodes/node-a/heartbeat", b"hb-a"),
                ("modelfleet/v1/nodes/node-b/status", b"st-b"),
            ]
