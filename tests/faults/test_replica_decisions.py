"""What a replica decides, it decides from shared state: the leader of a replicated central
(real processes, a private PostgreSQL) is SIGKILLed right after it made each kind of decision,
and the next leader keeps every one: an INT8 fallback to FP32 after live drift (the edge stays
on FP32, nobody flags it again), an artifact verdict (the same one, not heard anew), an
operator's transfer caps, and rollout steps (the promotion stands and the rollout completes).

One fleet for all four (``bench._ha_decisions``, also bench.central_ha's section): the
decisions are made, the leader dies once, then each is read back from the survivor."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faults._faults import CENTRAL_ENV, EDGE_ENV, mqtt_envs, wait_until

from bench._ha_decisions import KINDS, decide_then_kill
from bench._replicas import ReplicatedFleet, replica_env
from modelfleet.up.postgres import PostgresInstance
from modelfleet.up.s3server import S3Server
from support.brokers import MosquittoBroker


@pytest.fixture
def fleet(
    tmp_path: Path, postgres: PostgresInstance, s3_server: S3Server, mosquitto: MosquittoBroker
) -> Iterator[ReplicatedFleet]:
    """Two quantizing replicas; the edges report their live INT8 agreement and their choices."""
    central_mqtt, edge_mqtt = mqtt_envs(mosquitto)
    env = replica_env(
        store_url=postgres.fresh_database(),
        blob_env=s3_server.blob_env(s3_server.new_bucket()),
        broker=(mosquitto.host, mosquitto.port),
        partitions=8,
        tick_s=0.2,
    )
    central_env = {**CENTRAL_ENV, **central_mqtt, **env, "MODELFLEET_QUANTIZE__ENABLED": "true"}
    with ReplicatedFleet(root=tmp_path, central_env=central_env, edge_env={**EDGE_ENV, **edge_mqtt}) as f:
        f.start_replicas(2)
        wait_until(lambda: f.leader() is not None, 15, "a leader")
        yield f


def test_the_next_leader_keeps_every_decision_of_the_killed_one(fleet: ReplicatedFleet, tmp_path: Path) -> None:
    section = decide_then_kill(fleet, tmp_path)
    made = section["made"]
    assert made["fallbacks"] == 1 and made["verdicts"] >= 1 and made["caps"] == 2, made
    assert made["rollout_steps"] == 2, "started and promoted by the leader"
    assert section["leader_drift_events"] == 1, "the leader flagged e0"
    assert section["lost"] == dict.fromkeys(KINDS, 0), section
    assert section["redecided"] == 0, "the new leader decided nothing of it again"
    survivor = fleet.replicas[section["survivor"]].http_url

    def completed() -> bool:
        return fleet.client.get(f"{survivor}/api/v1/models/drift/rollout").json()["state"] == "complete"

    wait_until(completed, 60, "the promoted rollout completed under the new leader")
