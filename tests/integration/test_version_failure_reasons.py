"""Why a node could not make a rollout's version ready, end to end (central, Mosquitto, real
edges): a manifest its pinned key did not sign fails with reason ``signature``, chunks no
source can deliver fail with reason ``network`` after ``fetch.fail_after_s`` and recover once
the source returns. The reason travels in the heartbeat and shows in the rollout's nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.server import CentralServer
from edge_node.server import EdgeServer
from fleetwire.signing import sign_manifest
from modelfleet.cli.rollout import describe
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, push, wait_rollout
from support.wait import wait_for


async def _edge(make_edge: EdgeFactory, central: CentralServer, mosquitto: MosquittoBroker, **fetch: Any) -> EdgeServer:
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    return await make_edge("edge-0", central, heartbeat=heartbeat, broker=broker, fetch=fetch)


def _heartbeat_entry(central: CentralServer, version: str) -> Any:
    """``tiny:version`` as edge-0's last heartbeat (as central read it) reports it, or None."""
    view = central.central.liveness.get("edge-0")
    models = view.models if view is not None and view.last_heartbeat_at is not None else []
    return next((m for m in models if (m.name, m.version) == ("tiny", version)), None)


async def _stored_v1_then_v2(api: httpx.AsyncClient, tmp_path: Path, central: CentralServer) -> dict[str, Any]:
    v1 = build_mlp(tmp_path / "v1.onnx", width=32, hidden_layers=1)
    v2 = build_mlp(tmp_path / "v2.onnx", width=32, hidden_layers=1, seed=1)
    assert (await push(api, "tiny", v1, version="1")).status_code == 201
    await wait_for(lambda: len(central.central.liveness.ready_endpoints("tiny", "1")) == 1, 30, "v1 ready")
    response = await push(api, "tiny", v2, version="2", activate="false")
    assert response.status_code == 201, response.text
    manifest: dict[str, Any] = response.json()["manifest"]
    return manifest


async def test_a_manifest_signed_by_another_key_fails_with_reason_signature(
    fleet_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    await _edge(make_edge, fleet_central, mosquitto)
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30) as api:
        await _stored_v1_then_v2(api, tmp_path, fleet_central)
        # Central's store holds v2 signed by a key outside its chain (central leaves such a
        # manifest alone); the desired state is still sealed by central's own key.
        store = fleet_central.central.store
        record = store.get_version("tiny", "2")
        assert record is not None
        foreign = Ed25519PrivateKey.generate()
        store.replace_manifests(
            sign_manifest(record.manifest, foreign), {k: sign_manifest(m, foreign) for k, m in record.artifacts.items()}
        )
        body = {"version": "2", "canary": 1.0, "failure_threshold": 1.0}
        assert (await api.post("/api/v1/models/tiny/rollouts", json=body)).status_code == 201
        rollout = await wait_rollout(api, "a failed node", lambda r: r["nodes"].get("edge-0") == "failed")
        failure = rollout["failures"]["edge-0"]
        assert failure["reason"] == "signature" and "manifest refused" in failure["error"], failure
        entry = _heartbeat_entry(fleet_central, "2")
        assert entry is not None and entry.state == "failed" and entry.reason == "signature"
        text = describe(rollout).plain
        assert "edge-0: failed (signature: manifest refused" in text, text


async def test_chunks_no_source_delivers_fail_with_reason_network_then_recover(
    fleet_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edge = await _edge(
        make_edge, fleet_central, mosquitto, attempts=1, backoff_s=0.05, backoff_max_s=0.1, fail_after_s=0.5
    )
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30) as api:
        manifest = await _stored_v1_then_v2(api, tmp_path, fleet_central)
        # Central (the only source: no peers) cannot deliver v2's new chunks: their blobs are away.
        blobs = fleet_central.central.blobs
        held = edge.edge.store
        away = [blobs.path(c["digest"]) for c in manifest["chunks"] if not held.has(c["digest"])]
        assert away
        for path in away:
            path.rename(path.with_name(path.name + ".away"))
        body = {"version": "2", "canary": 1.0, "soak_s": 0, "failure_threshold": 1.0}
        assert (await api.post("/api/v1/models/tiny/rollouts", json=body)).status_code == 201
        rollout = await wait_rollout(api, "a failed node", lambda r: r["nodes"].get("edge-0") == "failed")
        assert rollout["failures"]["edge-0"]["reason"] == "network", rollout
        assert "no owner and not the origin" in rollout["failures"]["edge-0"]["error"]
        entry = _heartbeat_entry(fleet_central, "2")
        assert entry is not None and entry.reason == "network"
        progress = edge.edge.materializer.progress[("tiny", "2")]
        assert (progress.state, progress.reason) == ("failed", "network")

        for path in away:  # the source returns: the edge's retries complete v2, the node counts again
            path.with_name(path.name + ".away").rename(path)
        rollout = await wait_rollout(api, "complete", lambda r: r["state"] == "complete")
        assert rollout["nodes"] == {"edge-0": "ready"} and rollout["failures"] == {}
        assert progress.state == "complete" and progress.reason is None
        await wait_for(lambda: getattr(_heartbeat_entry(fleet_central, "2"), "state", None) == "ready", 30, "ready")
        assert _heartbeat_entry(fleet_central, "2").reason is None
