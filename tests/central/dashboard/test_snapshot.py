"""A dashboard snapshot built from the services it is given (``DashboardSources``), with
no central around them: node rows join what the tracker heard with what the directory
registered, and the two flags decide what the page shows of the broker and gateway."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from central.dashboard import DashboardSources, build_snapshot
from central.distribution import DesiredStateService
from central.fleet_mode import LocalMode
from central.gateway import StaticNodeSource, create_gateway
from central.membership import NodeDirectory, NodeRecord
from central.membership.tracker import MembershipTracker
from central.origin import EgressBucket, OriginService
from central.placement import PlacementService
from central.registry.pipeline import PushPipeline
from central.registry.service import RegistryService
from central.storage.blobs.local import BlobStore
from central.storage.sqlite.registry import SQLiteMetadataStore
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, GenerationInfo, Heartbeat, ModelInfo, NodeStatus


async def snapshot_of(tmp_path: Path, tracker: MembershipTracker, nodes: NodeDirectory | None = None) -> dict[str, Any]:
    """A snapshot of ``tracker`` (and ``nodes``) beside an empty registry, gateway and placement."""
    placement = PlacementService(replicas=1)
    blobs = BlobStore(tmp_path / "blobs")
    store = SQLiteMetadataStore(tmp_path / "registry.sqlite3")
    gateway = create_gateway(StaticNodeSource())
    try:
        sources = DashboardSources(
            liveness=tracker,
            directory=nodes if nodes is not None else NodeDirectory(placement, on_change=lambda: None),
            registry=RegistryService(store, blobs, PushPipeline([]), on_change=lambda: None),
            placement=placement,
            desired=DesiredStateService(placement, list, dict),
            origin=OriginService(blobs, placement, EgressBucket(0), 1),
            gateway=gateway,
            gateway_enabled=False,
            mqtt_enabled=False,
            shared=LocalMode().shared_liveness,
            replicas=LocalMode().replicas,
        )
        return await build_snapshot(sources, asyncio.get_running_loop().time(), None)
    finally:
        await gateway.close()
        tracker.close()
        store.close()


async def test_a_snapshot_joins_heard_and_registered_nodes_from_the_given_services(tmp_path: Path) -> None:
    placement = PlacementService(replicas=1)
    nodes = NodeDirectory(placement, on_change=lambda: None)
    nodes.register(
        NodeRecord(
            "edge-registered",
            "127.0.0.1:1",
            "127.0.0.1:2",
            capacity=3,
            labels={"zone": "a"},
            hardware_class="arm",
            site="depot-7",
        )
    )
    choice = ArtifactChoiceInfo(artifact="int8-x", source="measured", reason="fastest of 2 on this node", speedup_b1=2)
    tracker = MembershipTracker(loop=asyncio.get_running_loop())
    heartbeat = Heartbeat(
        node_id="edge-heard",
        bdseq=1,
        seq=0,
        ts=int(time.time() * 1000),
        interval_s=5.0,
        models=[ModelInfo(name="m", version="1", state="ready", choice=choice)],
        http_address="127.0.0.1:9",
        hardware_class="x86_64/avx2/2c/cpu",
        mode="autonomous",
        autonomous_since=1_765_000_000_000,
    )
    tracker.on_heartbeat("edge-heard", heartbeat)
    snap = await snapshot_of(tmp_path, tracker, nodes)

    heard, registered = snap["nodes"]
    assert (heard["node_id"], heard["state"], heard["registered"]) == ("edge-heard", "alive", False)
    assert heard["http_address"] == "127.0.0.1:9" and heard["models"][0]["name"] == "m"
    # the Artifact column: what each version is served as, its speed-up and why
    assert heard["hardware_class"] == "x86_64/avx2/2c/cpu" and heard["models"][0]["choice"]["artifact"] == "int8-x"
    # a node serving its last desired state without central says so, and since when
    assert (heard["mode"], heard["autonomous_since_ms"]) == ("autonomous", 1_765_000_000_000)
    # registered over gRPC, never heard over MQTT: no liveness, but its registration shows
    assert (registered["node_id"], registered["state"], registered["registered"]) == (
        "edge-registered",
        "unknown",
        True,
    )
    assert registered["capacity"] == 3 and registered["labels"] == {"zone": "a"}
    assert registered["hardware_class"] == "arm" and registered["site"] == "depot-7"
    assert registered["http_address"] == "127.0.0.1:2" and registered["last_heartbeat_age_s"] is None
    assert snap["central"]["mqtt_enabled"] is False and snap["central"]["broker_link_up"] is None
    assert snap["central"]["counts"]["alive"] == 1
    assert snap["gateway"]["enabled"] is False and snap["models"] == [] and snap["rollouts"] is None


def _beat(node_id: str, *models: ModelInfo) -> Heartbeat:
    return Heartbeat(node_id=node_id, bdseq=1, seq=0, ts=int(time.time() * 1000), interval_s=5.0, models=list(models))


async def test_the_language_models_panel_has_a_row_per_node_and_served_language_model(tmp_path: Path) -> None:
    """Each node's language models with their engine's figures from its last heartbeat; tensor
    models and versions still loading have no row, and a dead node's tokens/s is not counted."""
    busy = GenerationInfo(tokens_per_s=120.5, running=3, waiting=1, kv_usage=0.4, ttft_p50_ms=15.0, ttft_p99_ms=90.0)
    idle = GenerationInfo(tokens_per_s=0.0, running=0, waiting=0, kv_usage=0.0)  # no stream yet: no TTFT
    choice = ArtifactChoiceInfo(artifact="int4-rtn-b32", source="measured")
    tracker = MembershipTracker(loop=asyncio.get_running_loop())
    tracker.on_heartbeat(
        "e1",
        _beat(
            "e1",
            ModelInfo(name="chat", version="2", state="ready", choice=choice, generation=busy),
            ModelInfo(name="chat", version="3", state="loading"),
            ModelInfo(name="mlp", version="1", state="ready"),
        ),
    )
    tracker.on_heartbeat("e0", _beat("e0", ModelInfo(name="chat", version="2", state="ready", generation=idle)))
    tracker.on_heartbeat("e2", _beat("e2", ModelInfo(name="chat", version="2", state="ready", generation=busy)))
    tracker.on_status("e2", NodeStatus(state="offline", bdseq=1, ts=int(time.time() * 1000)))
    panel = (await snapshot_of(tmp_path, tracker))["language_models"]

    rows = {(r["node_id"], r["model"], r["version"]): r for r in panel["rows"]}
    assert list(rows) == [("e0", "chat", "2"), ("e1", "chat", "2"), ("e2", "chat", "2")]
    e1 = rows[("e1", "chat", "2")]
    assert (e1["node_state"], e1["kind"], e1["state"], e1["artifact"]) == ("alive", "decoder", "ready", "int4-rtn-b32")
    assert (e1["tokens_per_s"], e1["running"], e1["waiting"], e1["kv_usage"]) == (120.5, 3, 1, 0.4)
    assert (e1["ttft_p50_ms"], e1["ttft_p99_ms"]) == (15.0, 90.0)
    e0 = rows[("e0", "chat", "2")]
    assert e0["ttft_p50_ms"] is None and e0["ttft_p99_ms"] is None and e0["artifact"] is None
    assert rows[("e2", "chat", "2")]["node_state"] == "dead"
    assert panel["tokens_per_s"] == 120.5  # e1's; e2's last figure is from a dead node
    assert panel["declared"] == []  # nothing in this registry


async def test_the_language_models_panel_is_empty_without_a_language_model(tmp_path: Path) -> None:
    tracker = MembershipTracker(loop=asyncio.get_running_loop())
    tracker.on_heartbeat("e0", _beat("e0", ModelInfo(name="mlp", version="1", state="ready")))
    panel = (await snapshot_of(tmp_path, tracker))["language_models"]
    assert panel == {"rows": [], "tokens_per_s": 0, "declared": []}
