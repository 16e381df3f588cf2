"""The Kubernetes manifests validate offline against the Kubernetes schemas (strict: an
unknown field fails) and hold what deploy/README.md promises: secure by default, with
every Secret made by make-secrets.sh (run here, with the project's CLI) and read where
the pods mount it; the broker's config and ACL run in a real Mosquitto."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

import kubernetes_validate
import paho.mqtt.client as mqtt
import pytest
import yaml
from deploy_checks import CONTAINER_SECRETS, DEPLOY, assert_secure_broker, assert_settings_apply, run_script
from paho.mqtt.enums import CallbackAPIVersion

from central.settings import CentralSettings
from central.storage.files.tokens import TokenStore
from edge_node.settings import EdgeSettings
from fleetwire.mqtt.tls import MqttTlsSettings
from fleetwire.peer_identity import node_of_uris
from modelfleet.up.secure import ACL_RULES
from support.brokers import (
    BrokerTls,
    Login,
    MosquittoBroker,
    Subscriber,
    close_wakeup_pair,
    connect_once,
    takeover_closes_session,
)

#: A Kubernetes version kubernetes-validate ships schemas for.
K8S_VERSION = "1.33.0"
K8S = DEPLOY / "k8s"
#: Replicated central: an overlay of ``K8S`` (tests in test_k8s_replicated.py).
K8S_HA = DEPLOY / "k8s-ha"
#: Kubernetes node names: each runs an edge with that node id and MQTT user name.
NODES = ("node-1", "node-2")


def _documents() -> list[tuple[str, dict[str, Any]]]:
    """Every manifest of ``deploy/k8s`` and ``deploy/k8s-ha``, as (``dir/file``, document)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")) + sorted(K8S_HA.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            name = f"{path.parent.name}/{path.name}"
            docs += [(name, d) for d in yaml.safe_load_all(path.read_text()) if d]
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
    assert ports == {"http": 8080, "grpc": 50051, "infer-grpc": 8001}  # infer-grpc: the gateway over KServe v2 gRPC
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert _find("ConfigMap", "central-settings")["data"]["MODELFLEET_BROKER__HOST"] == "mosquitto"


def test_edges_are_a_daemonset_with_their_cache_on_the_host() -> None:
    pod = _pod("DaemonSet", "edge")
    settings = _find("ConfigMap", "edge-settings")["data"]
    cache = _volume_of(pod, settings["MODELFLEET_CACHE_DIR"])
    assert cache["hostPath"]["type"] == "DirectoryOrCreate"
    env = {e["name"]: e["valueFrom"] for e in pod["containers"][0]["env"]}
    node_name = {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["MODELFLEET_NODE_ID"] == env["MODELFLEET_BROKER__USERNAME"] == node_name  # a login per node
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert settings["MODELFLEET_CENTRAL"] == "central:50051"
    assert pod["securityContext"]["runAsNonRoot"] is True
    headless = _find("Service", "edge")["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True


def test_mosquitto_runs_with_its_config_from_a_configmap() -> None:
    pod = _pod("Deployment", "mosquitto")
    config = _volume_of(pod, "/mosquitto/config")["configMap"]["name"]
    text = _find("ConfigMap", config)["data"]["mosquitto.conf"]
    assert "listener 8883 0.0.0.0" in text
    assert _find("Service", "mosquitto")["spec"]["ports"][0]["port"] == 8883
    assert _volume_of(pod, "/mosquitto/certs")["secret"]["secretName"] == "mosquitto-tls"


# ----------------------------------------------------------------- secrets and secure defaults


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """make-secrets.sh run for two Kubernetes nodes, into a directory of the test's."""
    root = tmp_path_factory.mktemp("k8s-secrets")
    run_script(K8S / "make-secrets.sh", root / "bin", {"SECRETS_DIR": str(root / "secrets")}, *NODES)
    return root / "secrets"


def _env_file(path: Path) -> dict[str, str]:
    return _env_file_text(path.read_text())


def _generated(secret: str, made: Path) -> dict[str, Path]:
    """What kustomize puts in the Secret ``secret``: key → the file make-secrets.sh wrote
    (for an env file: the file itself under the key ``*``)."""
    (generator,) = [g for g in _kustomization()["secretGenerator"] if g["name"] == secret]
    files = {}
    for entry in generator.get("files", []):
        key, _, source = entry.rpartition("=")
        files[key or Path(source).name] = made / Path(source).relative_to("secrets")
    for source in generator.get("envs", []):
        files["*"] = made / Path(source).relative_to("secrets")
    return files


def _kustomization() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return doc


def _secret_mounts(pod: dict[str, Any], container: dict[str, Any], made: Path) -> dict[str, Path]:
    """Container path → a directory holding what the pod's Secret volume mounted there
    would hold (the files make-secrets.sh made for that Secret)."""
    mounts: dict[str, Path] = {}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        files = _generated(secret["secretName"], made)
        (directory,) = {p.parent for p in files.values()}
        assert {p.name for p in files.values()} == set(files), "keys named after their files"
        mounts[mount["mountPath"]] = directory
    return mounts


def test_make_secrets_makes_every_file_the_kustomization_names(made: Path) -> None:
    for generator in _kustomization()["secretGenerator"]:
        for path in _generated(generator["name"], made).values():
            assert path.is_file() and path.stat().st_size > 0, path
    assert "secrets/" in (K8S / ".gitignore").read_text().split()  # nothing secret gets committed
    logins = _env_file(made / "mqtt-edge-logins.env")
    tokens = _env_file(made / "edge-node-tokens.env")
    assert set(logins) == set(tokens) == set(NODES) and len(set(logins.values())) == len(NODES)
    node_store = TokenStore(made / "node_tokens.json")
    for node, token in tokens.items():
        record = node_store.verify(token)
        assert record is not None and record.node_id == node
    admin = TokenStore(made / "tokens.json").verify((made / "admin.token").read_text().strip())
    assert admin is not None and admin.role == "admin"
    # a second run with one more node adds that node and changes nothing else
    before = {p: p.read_text() for p in made.rglob("*") if p.is_file()}
    run_script(K8S / "make-secrets.sh", made.parent / "bin", {"SECRETS_DIR": str(made)}, *NODES, "node-3")
    grown = ("mqtt-edge-logins.env", "edge-node-tokens.env", "edge-certs.env", "edge-keys.env", "node_tokens.json")
    assert {p: p.read_text() for p in before if p.name not in grown} == {
        p: t for p, t in before.items() if p.name not in grown
    }
    for name in grown[:4]:
        assert _env_file(made / name).keys() == {*NODES, "node-3"}
        assert {k: v for k, v in _env_file(made / name).items() if k != "node-3"} == _env_file_text(before[made / name])
    assert {r.node_id for r in TokenStore(made / "node_tokens.json").records()} == {*NODES, "node-3"}


def _env_file_text(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_central_and_edges_read_their_settings_and_files_from_the_secrets(made: Path, tmp_path: Path) -> None:
    central_pod = _pod("Deployment", "central")
    central = central_pod["containers"][0]
    mounts = _secret_mounts(central_pod, central, made)
    assert_settings_apply(CentralSettings, _find("ConfigMap", "central-settings")["data"], mounts)

    # an edge: what its init container copies for its node, then its own container's start line
    edge_pod = _pod("DaemonSet", "edge")
    edge = edge_pod["containers"][0]
    node = tmp_path / "node"
    node.mkdir()
    tls = tmp_path / "tls"
    tls.mkdir()
    init = next(c for c in edge_pod["initContainers"] if c["name"] == "node-credentials")
    script = init["args"][0]
    for where in ("logins", "tokens", "certs", "keys", "ca", "tls", "node"):
        script = script.replace(f"/{where}/", f"{tmp_path}/{where}/")
    envs = {"mqtt-edge-logins": "logins", "edge-node-tokens": "tokens", "edge-certs": "certs", "edge-keys": "keys"}
    for secret, where in envs.items():
        (tmp_path / where).mkdir()
        for key, value in _env_file(_generated(secret, made)["*"]).items():
            (tmp_path / where / key).write_text(value)
    (tmp_path / "ca").mkdir()
    for key, path in _generated("fleet-ca", made).items():
        shutil.copyfile(path, tmp_path / "ca" / key)
    subprocess.run(["sh", "-ec", script], env={**os.environ, "NODE_NAME": NODES[0]}, check=True)
    assert (node / "node-token").read_text() == _env_file(made / "edge-node-tokens.env")[NODES[0]]
    assert (tls / "cert.pem").read_bytes() == (made / "edges" / NODES[0] / "cert.pem").read_bytes()
    assert _bound_to(tls / "cert.pem") == NODES[0]  # its own node's certificate: peers check it
    mounts = {
        **_secret_mounts(edge_pod, edge, made),
        f"{CONTAINER_SECRETS}/node": node,
        f"{CONTAINER_SECRETS}/tls": tls,
    }
    settings = _find("ConfigMap", "edge-settings")["data"]
    assert_settings_apply(EdgeSettings, {**settings, "MODELFLEET_NODE_ID": NODES[0]}, mounts)

    # the name the edge advertises is one its certificate carries (a real handshake)
    start = edge["args"][0].replace("exec modelfleet edge", 'echo "$MODELFLEET_ADVERTISE_HOST"')
    start = start.replace(f"{CONTAINER_SECRETS}/node/", f"{node}/")
    env = {**os.environ, "POD_IP": "10.1.2.3", "POD_NAMESPACE": "modelfleet", **settings}
    host = subprocess.run(["sh", "-ec", start], env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert host == "10-1-2-3.edge.modelfleet.svc.cluster.local"
    assert _handshake(tls / "cert.pem", tls / "key.pem", tls / "ca.pem", host)


def _bound_to(cert_file: Path) -> str | None:
    """The node id a certificate is bound to (``fleetwire.peer_identity``)."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return node_of_uris(sans.get_values_for_type(x509.UniformResourceIdentifier))


def _handshake(cert: Path, key: Path, ca: Path, server_name: str) -> bool:
    """A TLS server on loopback with ``cert`` verified by a client dialling ``server_name``."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(ca))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        accepted: list[BaseException | None] = []

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_context.wrap_socket(conn, server_side=True):
                    accepted.append(None)
            except (OSError, ssl.SSLError) as exc:
                accepted.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                client_context.wrap_socket(raw, server_hostname=server_name),
            ):
                pass
        finally:
            thread.join(5)
    return accepted == [None]


def test_kubernetes_is_secure_by_default() -> None:
    """Tokens for writes and reads, node tokens, TLS with client certificates, MQTT over
    TLS with one login per process and client ids bound to them."""
    central = _find("ConfigMap", "central-settings")["data"]
    for key in ("AUTH__ENABLED", "AUTH__PROTECT_READS", "AUTH__NODES_REQUIRED", "TLS__ENABLED"):
        assert central[f"MODELFLEET_{key}"] == "true", key
    assert central["MODELFLEET_TLS__REQUIRE_CLIENT_CERT"] == central["MODELFLEET_BROKER__TLS__ENABLED"] == "true"
    edge = _find("ConfigMap", "edge-settings")["data"]
    for key in ("TLS__ENABLED", "TLS__REQUIRE_CLIENT_CERT", "BROKER__TLS__ENABLED"):
        assert edge[f"MODELFLEET_{key}"] == "true", key
    assert "MODELFLEET_BROKER__USERNAME" not in edge  # no shared login: the node's own name
    # probes that need no plaintext: HTTPS for central, the edge's own certificate for edges
    central_probe = _pod("Deployment", "central")["containers"][0]["readinessProbe"]["httpGet"]
    assert central_probe["scheme"] == "HTTPS"
    edge_probe = _pod("DaemonSet", "edge")["containers"][0]["readinessProbe"]
    assert edge_probe["exec"]["command"] == ["python", "-m", "modelfleet.healthcheck"]
    conf, acl = _broker_files()
    assert_secure_broker(conf)
    rules = [line.strip() for line in acl.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert rules == list(ACL_RULES)  # the shipped ACL: each edge only under its own id


def _broker_files() -> tuple[str, str]:
    data = _find("ConfigMap", "mosquitto-config")["data"]
    return data["mosquitto.conf"], data["acl"]


def test_the_broker_requires_logins_from_the_generated_secrets(made: Path) -> None:
    conf, _ = _broker_files()
    assert "password_file /mosquitto/auth/passwd" in conf.splitlines()
    pod = _pod("Deployment", "mosquitto")
    (init,) = pod["initContainers"]
    assert "f=/mosquitto/auth/passwd" in init["args"][0]
    assert _volume_of(pod, "/mosquitto/auth") == {"name": "auth", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"]) for e in init["env"]
    } == {"PW_CENTRAL": ("mqtt-logins", "central")}
    edges = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}["/logins/edges"]
    assert {v["name"]: v for v in pod["volumes"]}[edges]["secret"]["secretName"] == "mqtt-edge-logins"
    # the init script as it runs, on the Secrets' files: every node gets a login, and the probe one
    logins = made.parent / "logins"
    logins.mkdir(exist_ok=True)
    for node, password in _env_file(made / "mqtt-edge-logins.env").items():
        (logins / node).write_text(password)
    auth = made.parent / "auth"
    auth.mkdir(exist_ok=True)
    script = init["args"][0].replace("/logins/edges/", f"{logins}/").replace("/mosquitto/auth/", f"{auth}/")
    passwd = shutil.which("mosquitto_passwd")
    assert passwd is not None, "mosquitto_passwd (Debian's mosquitto package) runs the init script"
    subprocess.run(["sh", "-ec", script], env={**os.environ, "PW_CENTRAL": "c"}, check=True, capture_output=True)
    users = {line.split(":")[0] for line in (auth / "passwd").read_text().splitlines()}
    assert users == {"central", "healthcheck", *_env_file(made / "mqtt-edge-logins.env")}


def _tls_login(made: Path, user: str, password: str) -> Login:
    settings = MqttTlsSettings(
        enabled=True,
        ca_file=made / "edges" / NODES[0] / "ca.pem",  # any fleet certificate: the broker checks the CA
        cert_file=made / "edges" / NODES[0] / "cert.pem",
        key_file=made / "edges" / NODES[0] / "key.pem",
    )
    return Login(user, password, settings.ssl_context())


@pytest.mark.fleet  # a Mosquitto on the generated config
def test_the_brokers_config_and_acl_bind_each_edge_to_its_own_topics_and_client_id(made: Path) -> None:
    conf, acl = _broker_files()
    logins = _env_file(made / "mqtt-edge-logins.env")
    users = {"central": "central-secret", "healthcheck": "health-secret", **logins}
    broker_tls = BrokerTls(
        made / "mosquitto" / "cert.pem", made / "mosquitto" / "key.pem", made / "mosquitto" / "ca.pem"
    )
    with MosquittoBroker(users=users, acl=acl, tls=broker_tls) as broker:
        broker.use_config(broker.localized(conf))
        assert broker.tls_port is not None
        assert not connect_once(broker.host, broker.port, "anonymous", Login())
        a, b = NODES
        login = {user: _tls_login(made, user, password) for user, password in users.items()}
        with Subscriber(broker, "$SYS/broker/uptime", username="healthcheck", password="health-secret") as health:
            health.wait_topic("$SYS/broker/uptime")
        # node-1's login cannot close node-2's session under node-2's client id
        for client_id in (f"edge-{b}", b):
            assert not takeover_closes_session(broker.host, broker.tls_port, client_id, login[b], login[a])
        # nor publish node-2's topics, nor central's: in order on one connection, once its
        # own heartbeat is seen the others would have been
        with Subscriber(broker, "modelfleet/v1/#", port=broker.tls_port, **_reader(login["central"])) as seen:
            published = [
                ("modelfleet/v1/central/status", b"forged"),
                ("modelfleet/v1/events", b"forged"),
                (f"modelfleet/v1/nodes/{b}/status", b"forged"),
                (f"modelfleet/v1/nodes/{a}/heartbeat", b"own"),
            ]
            assert _publish(broker.host, broker.tls_port, login[a], published)
            seen.wait_topic(f"modelfleet/v1/nodes/{a}/heartbeat")
            assert [m.topic for m in seen.messages] == [f"modelfleet/v1/nodes/{a}/heartbeat"]


def _reader(login: Login) -> dict[str, Any]:
    return {"username": login.username, "password": login.password, "context": login.context}


def _publish(host: str, port: int, login: Login, messages: list[tuple[str, bytes]]) -> bool:
    """Log in and publish ``messages`` at QoS 1, in order; False when the login is refused."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"k8s-{uuid.uuid4().hex[:8]}")
    client.username_pw_set(login.username, login.password)
    if login.context is not None:
        client.tls_set_context(login.context)
    connack: list[Any] = []
    answered = threading.Event()

    def on_connect(_c: mqtt.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        connack.append(reason)
        answered.set()

    client.on_connect = on_connect
    client.connect(host, port, keepalive=10)
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
        close_wakeup_pair(client)
