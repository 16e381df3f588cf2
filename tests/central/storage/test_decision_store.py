"""Central's decisions beyond versions and rollouts (drift fallbacks, verdicts, the transfer
policy) on both backends: kept across a reopen, first-wins where the store must pick, and on
PostgreSQL a deposed leader's late write refused by the fence, a rollout write made on a stale
read refused, and shadow counts handed from the replica that heard them to the leader."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from central.rollout.model import Rollout
from central.storage.protocols import DecisionRecords, ShadowCountRow, StaleRollout
from central.storage.sqlite.decisions import SQLiteDecisionStore

Opener = Callable[[], DecisionRecords]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.fleet)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[DecisionRecords] = []

    def open_store() -> DecisionRecords:
        if request.param == "sqlite":
            store: DecisionRecords = SQLiteDecisionStore(tmp_path / "central.sqlite3")
        else:
            from central.storage.postgres.decisions import PostgresDecisionStore

            url = request.getfixturevalue("ha_url")
            store = PostgresDecisionStore(url)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def test_decisions_are_kept_across_a_reopen_and_the_first_verdict_wins(opener: Opener) -> None:
    store = opener()
    flag = json.dumps(["m", "2", "n1"])
    store.write("drift_flag", {flag: {"artifact": "int8", "serves": "fp32"}, json.dumps(["m", "2", "n2"]): {}})
    store.write("drift_flag", {}, [json.dumps(["m", "2", "n2"])], also={"drift_baseline": {flag: {"samples": 3}}})
    assert store.add("verdict", "k", {"artifact": "a"})
    assert not store.add("verdict", "k", {"artifact": "b"}), "a second verdict for the same class is refused"
    again = opener()  # a restart (or another replica)
    assert again.load("drift_flag") == {flag: {"artifact": "int8", "serves": "fp32"}}
    assert again.load("drift_baseline") == {flag: {"samples": 3}}
    assert again.load("verdict") == {"k": {"artifact": "a"}}
    assert again.load("transfer") == {}


@pytest.mark.fleet
def test_a_deposed_leaders_decision_is_refused_by_the_fence(ha_url: str) -> None:
    import psycopg

    from central.ha.fencing import Fenced
    from central.storage.postgres.decisions import PostgresDecisionStore

    store = PostgresDecisionStore(ha_url)
    try:
        with psycopg.connect(ha_url, autocommit=True) as conn:
            old = int(conn.execute("UPDATE ha_leader SET epoch = epoch + 1 RETURNING epoch").fetchone()[0])  # type: ignore[index]
            store.write("drift_flag", {"a": {"serves": "fp32"}}, fence=old)
            conn.execute("UPDATE ha_leader SET epoch = epoch + 1")  # another replica was elected
            gen = conn.execute("SELECT gen, config_gen FROM ha_generation").fetchone()
        with pytest.raises(Fenced, match="no longer leads"):
            store.write("drift_flag", {"b": {"serves": "fp32"}}, ["a"], fence=old)
        assert store.load("drift_flag") == {"a": {"serves": "fp32"}}, "nothing of the stale write landed"
        with psycopg.connect(ha_url) as conn:
            assert conn.execute("SELECT gen, config_gen FROM ha_generation").fetchone() == gen, "nobody was woken"
        store.write("drift_flag", {"b": {"serves": "fp32"}}, fence=old + 1)  # the new leader's passes
        assert set(store.load("drift_flag")) == {"a", "b"}
    finally:
        store.close()


@pytest.mark.fleet
def test_a_rollout_write_on_a_stale_read_or_by_a_deposed_leader_is_refused(ha_url: str) -> None:
    import psycopg

    from central.ha.fencing import Fenced
    from central.storage.postgres.rollouts import PostgresRolloutStore

    leader, follower = PostgresRolloutStore(ha_url), PostgresRolloutStore(ha_url)
    try:
        with psycopg.connect(ha_url, autocommit=True) as conn:
            epoch = int(conn.execute("UPDATE ha_leader SET epoch = epoch + 1 RETURNING epoch").fetchone()[0])  # type: ignore[index]
        r = leader.insert(Rollout(model="m", version="2", previous_version="1"))
        seen = follower.all()[0]
        leader.update(r.model_copy(update={"state": "rolling"}), fence=epoch)  # the leader's step
        with pytest.raises(StaleRollout, match="changed on another replica"):
            follower.update(seen.model_copy(update={"state": "rolled_back"}))  # decided on the old state
        assert [x.state for x in follower.all()] == ["rolling"], "the later, stale write did not win"
        follower.update(follower.all()[0].model_copy(update={"state": "rolled_back"}))  # read again: it lands
        with psycopg.connect(ha_url, autocommit=True) as conn:
            conn.execute("UPDATE ha_leader SET epoch = epoch + 1")
        leader.all()
        with pytest.raises(Fenced):
            leader.update(r.model_copy(update={"state": "complete"}), fence=epoch)
        assert [x.state for x in leader.all()] == ["rolled_back"]
    finally:
        leader.close()
        follower.close()


@pytest.mark.fleet
def test_shadow_counts_written_by_one_replica_reach_another_once(ha_url: str) -> None:
    from central.storage.postgres.shadow_counts import PostgresShadowCounts

    heard, judge = PostgresShadowCounts(ha_url), PostgresShadowCounts(ha_url)
    try:
        row = ShadowCountRow("m", "2", "", "n1", "int8", {"samples": 5}, 1.0)
        heard.put("drift", [row])
        assert judge.changed("drift") == [], "nothing before the flush"
        heard.flush()
        assert judge.changed("drift") == [row]
        assert judge.changed("drift") == [], "only what changed since"
        newer = ShadowCountRow("m", "2", "", "n1", "int8", {"samples": 9}, 2.0)
        heard.put("drift", [newer])
        heard.put("promotion", [row])
        heard.flush()
        assert judge.changed("drift") == [newer]
        assert PostgresShadowCounts(ha_url).changed("drift") == [newer], "a new leader reads every node's latest"
    finally:
        heard.close()
        judge.close()
