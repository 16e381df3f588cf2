"""Three replicas of a replicated central in one process, on a private PostgreSQL, a real S3
server and a real Mosquitto: one leader, partitions split, a push on any replica seen by
all, the leader's placement served by every follower, the gateway routing on every replica
from the shared liveness, and the leadership moving when the leader stops."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from central.server import CentralServer
from modelfleet.up.s3server import S3Server
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for

PARTITIONS = 8
ReplicaFactory = Callable[[str], Awaitable[CentralServer]]


@pytest.fixture
async def start_replica(
    tmp_path: Path, postgres_url: str, s3_server: S3Server, mosquitto: MosquittoBroker
) -> AsyncIterator[ReplicaFactory]:
    """Start replicas of one replicated central (shared store, bucket and broker)."""
    bucket = s3_server.new_bucket()
    started: list[CentralServer] = []

    async def factory(replica_id: str) -> CentralServer:
        settings = central_settings(
            tmp_path / replica_id,
            store={"url": postgres_url},
            blobs=s3_server.blob_settings(bucket),
            mqtt={"enabled": True, "default_interval_s": 0.3},
            broker={"host": mosquitto.host, "port": mosquitto.port},
            ha={"replica_id": replica_id, "partitions": PARTITIONS, "tick_s": 0.2},
        )
        server = CentralServer(settings)
        await server.start()
        started.append(server)
        return server

    yield factory
    for server in reversed(started):
        if not getattr(server, "_stopped", False):
            await server.stop()


def _heartbeat(broker: MosquittoBroker) -> dict[str, Any]:
    return {"heartbeat": {"enabled": True, "interval_s": 0.3}, "broker": {"host": broker.host, "port": broker.port}}


def _replica(server: CentralServer) -> dict[str, Any]:
    """What ``/readyz`` says about the replica (leadership, epoch, partitions)."""
    return dict(server.central.mode.readiness()[1]["replica"])


def _leaders(replicas: list[CentralServer]) -> list[str]:
    return [r.settings.ha.replica_id or "" for r in replicas if _replica(r)["leader"]]


def _owned(replica: CentralServer) -> set[int]:
    return set(_replica(replica)["partitions"])


def _alive(replica: CentralServer, node_id: str) -> bool:
    row = replica.central.mode.shared_liveness().get(node_id)
    return row is not None and row.state == "alive"


async def test_replicas_share_one_fleet(
    start_replica: ReplicaFactory, make_edge: EdgeFactory, mosquitto: MosquittoBroker, small_model_file: Path
) -> None:
    replicas = [await start_replica(f"r{i}") for i in range(3)]
    await wait_for(lambda: len(_leaders(replicas)) == 1, 10, "one leader")
    await wait_for(
        lambda: sorted(k for r in replicas for k in _owned(r)) == list(range(PARTITIONS)), 10, "partitions split"
    )
    leader = next(r for r in replicas if _replica(r)["leader"])
    followers = [r for r in replicas if r is not leader]

    async with httpx.AsyncClient(timeout=30) as api:
        ready = (await api.get(f"{followers[0].http_url}/readyz")).json()
        assert ready["ready"] and ready["replica"]["leader_id"] == leader.settings.ha.replica_id
        listed = (await api.get(f"{followers[1].http_url}/api/v1/replicas")).json()
        assert {r["replica_id"] for r in listed["replicas"]} == {"r0", "r1", "r2"}

        # A push on a follower: every replica lists it.
        api.base_url = httpx.URL(followers[0].http_url)
        assert (await push(api, "tiny", small_model_file)).status_code == 201
        for r in replicas:
            versions = (await api.get(f"{r.http_url}/api/v1/models/tiny/versions")).json()
            assert [v["version"] for v in versions] == ["1"]

        # Edges on different replicas; every replica routes to both from the shared liveness.
        edges = [await make_edge(f"edge-{i}", replicas[i], **_heartbeat(mosquitto)) for i in range(2)]
        ids = {e.node_id for e in edges}

        def routed_everywhere() -> bool:
            return all(
                {c.node_id for c in r.central.gateway.router.source.candidates("tiny", "1")} == ids for r in replicas
            )

        await wait_for(routed_everywhere, 30, "both edges ready in every replica's view")
        for r in replicas:  # every replica's dashboard shows the replicas, and every node, tracked here or not
            dash = (await api.get(f"{r.http_url}/api/v1/dashboard")).json()
            assert dash["central"]["replicas"]["leader_id"] == leader.settings.ha.replica_id
            assert len(dash["central"]["replicas"]["replicas"]) == 3
            rows = {n["node_id"]: n for n in dash["nodes"]}
            assert all(rows[i]["state"] == "alive" for i in ids), rows
        metrics = (await api.get(f"{leader.http_url}/metrics")).text
        assert "modelfleet_replica_leader 1.0" in metrics and "modelfleet_replicas_live 3.0" in metrics
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": np.ones(32).tolist()}]}
        for r in replicas:
            response = await api.post(f"{r.http_url}/v2/models/tiny/infer", json=body)
            assert response.status_code == 200, response.text

        # Followers hand out the leader's placement.
        def same_placement() -> bool:
            exported = leader.central.placement.export()
            owners = exported.get("tiny/1", {})
            return (
                bool(owners)
                and all(f.central.placement.export() == exported for f in followers)
                and all(set(o) <= ids for o in owners.values())
            )

        await wait_for(same_placement, 15, "one placement on every replica")

        # The leader stops: another leads with a higher epoch, partitions move, routing goes on.
        epoch = _replica(leader)["leader_epoch"]
        await leader.stop()
        leader._stopped = True  # type: ignore[attr-defined]
        await wait_for(lambda: len(_leaders(followers)) == 1, 10, "a new leader")
        new_epoch = next(_replica(f)["leader_epoch"] for f in followers if _replica(f)["leader"])
        assert epoch is not None and new_epoch is not None and new_epoch > epoch
        await wait_for(
            lambda: sorted(k for r in followers for k in _owned(r)) == list(range(PARTITIONS)),
            10,
            "the leader's partitions taken over",
        )
        for r in followers:
            response = await api.post(f"{r.http_url}/v2/models/tiny/infer", json=body)
            assert response.status_code == 200, response.text
        for r in followers:
            assert _alive(r, "edge-0") and _alive(r, "edge-1")


async def test_a_single_central_keeps_plain_topics_and_no_replica_block(tmp_path: Path) -> None:
    server = CentralServer(central_settings(tmp_path / "c"))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url) as api:
            ready = (await api.get("/readyz")).json()
            assert ready["ready"] and "replica" not in ready
            assert (await api.get("/api/v1/replicas")).json()["replicated"] is False
    finally:
        await server.stop()


async def test_a_node_its_new_owner_never_hears_is_declared_dead(
    start_replica: ReplicaFactory, postgres_url: str
) -> None:
    from central.ha.fleet_store import FleetStore, LivenessRow
    from fleetwire.mqtt.topics import partition_of

    first, second = await start_replica("r0"), await start_replica("r1")
    await wait_for(lambda: bool(_owned(first)) and bool(_owned(second)), 10, "partitions split")
    partition = min(_owned(first))
    ghost = next(f"ghost-{i}" for i in range(10_000) if partition_of(f"ghost-{i}", PARTITIONS) == partition)
    # The shared liveness says alive (its owner saw it last), but the node is gone and left no
    # retained birth: a dead node whose partition changes hands must not stay alive for everyone.
    fleet = FleetStore(postgres_url)
    try:
        with fleet.connection() as conn:
            row = conn.execute("SELECT epoch FROM ha_partitions WHERE partition = %s", (partition,)).fetchone()
        assert row is not None
        fleet.put_liveness(partition, int(row[0]), [LivenessRow(ghost, partition, "alive", "", ())])
    finally:
        fleet.close()
    await first.stop()
    first._stopped = True  # type: ignore[attr-defined]
    await wait_for(lambda: partition in _owned(second), 10, "the partition taken over")

    def ghost_dead() -> bool:
        row = second.central.mode.shared_liveness().get(ghost)
        return row is not None and row.state == "dead"

    await wait_for(ghost_dead, 10, "the ghost dead")
