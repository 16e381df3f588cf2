"""The rollout controller's rules on real SQLite and PostgreSQL and real heartbeat payloads: canary
choice, selectors, soak and promote, threshold rollback, restarts, and the 409s."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollout_harness import RolloutHarness, failed, ready

from central.errors import Conflict, NotFound
from central.rollout import RolloutRequest
from central.settings import StoreSettings
from central.storage.protocols import StaleRollout
from fleetwire.mqtt.payloads import ModelInfo


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.fleet)])
def store(request: pytest.FixtureRequest) -> StoreSettings:
    """Every test runs on both backends: SQLite files, and a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return StoreSettings()
    return StoreSettings(url=request.getfixturevalue("postgres_url"))


@pytest.fixture
async def harness(tmp_path: Path, store: StoreSettings) -> AsyncIterator[RolloutHarness]:
    """A harness with model ``m`` at version 1 (stable) and 2 (stored, not activated)."""
    h = RolloutHarness(tmp_path, store)
    h.store_version("m", "1")
    h.store_version("m", "2", activate=False)
    yield h
    h.close()


def _request(**fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate({"version": "2", **fields})


async def test_canaries_are_chosen_deterministically_among_the_selected_nodes(
    harness: RolloutHarness, tmp_path: Path
) -> None:
    harness.add_nodes([f"a{i}" for i in range(5)], zone="a")
    harness.add_nodes([f"b{i}" for i in range(5)], zone="b")
    r = harness.service.start("m", _request(canary=0.4, selector={"zone": "a"}))
    assert r.state == "canary" and r.previous_version == "1"
    assert r.targets == [f"a{i}" for i in range(5)]
    assert len(r.canary_nodes) == 2 and set(r.canary_nodes) <= set(r.targets)
    for node in r.targets + [f"b{i}" for i in range(5)]:
        assert harness.serves(node) == ("2" if node in r.canary_nodes else "1"), node
    assert r.reason == f"waiting for 2 canary nodes to load version 2: {', '.join(r.canary_nodes)}"
    assert harness.event_types() == ["rollout_started"]

    other = RolloutHarness(tmp_path / "other")  # another central, same fleet: same canaries
    other.store_version("m", "1")
    other.store_version("m", "2", activate=False)
    other.add_nodes([f"a{i}" for i in reversed(range(5))], zone="a")
    assert other.service.start("m", _request(canary=0.4, selector={"zone": "a"})).canary_nodes == r.canary_nodes
    other.close()


async def test_a_selector_no_node_matches_says_so_and_picks_canaries_when_one_joins(harness: RolloutHarness) -> None:
    harness.add_nodes(["a0"], zone="a")
    r = harness.service.start("m", _request(selector={"zone": "b"}))
    assert r.canary_nodes == [] and r.reason == "no node matches selector zone=b"
    assert harness.serves("a0") == "1"
    harness.add_nodes(["b0", "b1"], zone="b")
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert len(r.canary_nodes) == 1 and r.nodes[r.canary_nodes[0]] == "loading"
    assert harness.serves(r.canary_nodes[0]) == "2"


async def test_healthy_canaries_promote_after_the_soak_and_the_rollout_completes(harness: RolloutHarness) -> None:
    harness.add_nodes(["n0", "n1", "n2", "n3"])
    r = harness.service.start("m", _request(canary=0.25, soak_s=30))
    (canary,) = r.canary_nodes
    harness.report(canary, ready("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").reason == "canary healthy on 1 node; promoting in 30 s"
    harness.controller.evaluate_all(now=time.time() + 31)
    r = harness.service.get("m")
    assert r.state == "rolling" and all(harness.serves(n) == "2" for n in r.targets)
    for node in r.targets:
        harness.report(node, ready("2"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert (r.state, r.ready, r.failed, r.reason) == ("complete", 4, 0, None)
    assert harness.event_types() == ["rollout_started", "rollout_promoted", "rollout_completed"]
    harness.add_nodes(["late"])  # a node joining later gets the rolled-out version
    assert harness.serves("late") == "2"


async def test_failures_past_the_threshold_roll_back_every_node(harness: RolloutHarness) -> None:
    harness.add_nodes(["n0", "n1", "n2", "n3"])
    harness.service.start("m", _request(canary=1.0, failure_threshold=0.5, min_nodes=2))
    harness.report("n0", failed("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").state == "canary"  # one report is below min_nodes
    harness.report("n1", ready("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").failure_rate == 0.5  # not above the threshold
    harness.report("n2", ready("2", errors=3))  # inference errors count as a failure
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.state == "rolled_back" and r.failed == 2 and r.ready == 1
    assert r.reason is not None and "2 of 3 nodes failed" in r.reason and "cannot create session" in r.reason
    assert all(harness.serves(n) == "1" for n in r.targets)
    assert harness.events[-1].type == "rollout_rolled_back"
    assert harness.events[-1].detail == {"model": "m", "version": "2", "rollout_id": r.id, "reason": r.reason}


async def test_failed_nodes_say_why_and_only_a_network_failure_passes(harness: RolloutHarness) -> None:
    harness.add_nodes(["n0", "n1", "n2"])
    harness.service.start("m", _request(canary=1.0, failure_threshold=1.0))
    harness.report("n0", ModelInfo(name="m", version="2", state="failed", reason="signature", error="manifest refused"))
    harness.report("n1", ModelInfo(name="m", version="2", state="failed", reason="network", error="no source"))
    harness.report("n2", ready("2", errors=1))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.nodes == {"n0": "failed", "n1": "failed", "n2": "failed"}
    assert {n: (f.reason, f.error) for n, f in r.failures.items()} == {
        "n0": ("signature", "manifest refused"),
        "n1": ("network", "no source"),
        "n2": ("inference", "inference errors reported"),
    }
    public = r.public()["failures"]
    assert isinstance(public, dict) and public["n0"] == {"reason": "signature", "error": "manifest refused"}
    for node in ("n0", "n1", "n2"):  # every edge gets over it: only the network failure was passing
        harness.report(node, ready("2"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.nodes == {"n0": "failed", "n1": "ready", "n2": "failed"}
    assert set(r.failures) == {"n0", "n2"} and r.failures["n0"].reason == "signature"


async def test_rollouts_and_stable_versions_survive_a_restart(
    harness: RolloutHarness, tmp_path: Path, store: StoreSettings
) -> None:
    harness.add_nodes(["n0", "n1"])
    started = harness.service.start("m", _request(canary=0.5))
    harness.service.promote("m")
    harness.close()

    again = RolloutHarness(tmp_path, store)
    again.add_nodes(["n0", "n1"])
    r = again.service.get("m")
    assert (r.id, r.state, r.canary_nodes) == (started.id, "rolling", started.canary_nodes)
    assert again.serves("n0") == again.serves("n1") == "2"
    again.service.rollback("m")
    again.store_version("m", "3", activate=False)
    again.close()

    third = RolloutHarness(tmp_path, store)
    third.add_nodes(["n0"])
    assert third.service.get("m").state == "rolled_back"
    assert third.serves("n0") == "1"  # version 3 was stored, not activated
    third.close()


async def test_operator_conflicts(harness: RolloutHarness) -> None:
    harness.add_nodes(["n0"])
    with pytest.raises(NotFound):
        harness.service.start("m", _request(version="9"))
    with pytest.raises(Conflict, match="already serve"):
        harness.service.start("m", _request(version="1"))
    with pytest.raises(Conflict, match="no rollout"):
        harness.service.rollback("m")
    harness.service.start("m", _request())
    with pytest.raises(Conflict, match="in progress"):
        harness.service.start("m", _request())
    with pytest.raises(Conflict, match="activate=false"):
        harness.service.before_push("m", activate=True)
    with pytest.raises(Conflict, match="rollout"):
        harness.service.check_deletable("m", "2")
    harness.service.promote("m")
    with pytest.raises(Conflict, match="not canary"):
        harness.service.promote("m")
    harness.report("n0", ready("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").state == "complete"
    assert harness.service.rollback("m").state == "rolled_back"  # a completed rollout goes back too
    assert harness.serves("n0") == "1"
    with pytest.raises(Conflict):
        harness.service.rollback("m")
    harness.store_version("m", "3")  # a plain push: everyone serves it
    assert harness.serves("n0") == "3"


async def test_a_rollout_whose_nodes_stall_is_reported_stuck_once(harness: RolloutHarness) -> None:
    harness.add_nodes(["n0"])
    harness.service.start("m", _request())
    harness.controller.evaluate_all(now=time.time() + 31)
    harness.controller.evaluate_all(now=time.time() + 62)
    stuck = [e for e in harness.events if e.type == "rollout_stuck"]
    assert len(stuck) == 1 and stuck[0].detail["reason"] == "waiting for 1 canary node to load version 2: n0"


async def test_a_push_that_finishes_during_a_rollout_supersedes_it(harness: RolloutHarness) -> None:
    harness.add_nodes(["n0", "n1"])
    harness.service.start("m", _request(canary=1.0))
    harness.store_version("m", "3", activate=False)  # the registry commits the pushed version …
    harness.service.activated("m", "3")  # … of a plain push whose check ran before the rollout began
    r = harness.service.get("m")
    assert r.state == "rolled_back" and r.reason == "superseded by a push of version 3"
    assert harness.serves("n0") == harness.serves("n1") == "3"


@pytest.mark.fleet
async def test_two_replicas_writing_one_rollout_never_overwrite_each_other(tmp_path: Path, postgres_url: str) -> None:
    """The leader's controller and an operator on another replica (two books, one PostgreSQL):
    the controller's pass decided on the state it read before the operator's promotion is
    refused, not written over it; the leader's own stale promote re-reads once and says why."""
    store = StoreSettings(url=postgres_url)
    leader = RolloutHarness(tmp_path / "leader", store)
    leader.store_version("m", "1")
    leader.store_version("m", "2", activate=False)
    leader.add_nodes(["n0", "n1"])
    canary = leader.service.start("m", _request(canary=0.5, soak_s=3600)).canary_nodes[0]
    follower = RolloutHarness(tmp_path / "follower", store)
    follower.add_nodes(["n0", "n1"])
    assert follower.service.promote("m").state == "rolling"
    leader.report(canary, ready("2"))
    with pytest.raises(StaleRollout, match="changed on another replica"):
        leader.controller.evaluate_all()
    third = RolloutHarness(tmp_path / "third", store)
    assert third.service.get("m").state == "rolling", "the promotion stands"
    third.close()
    with pytest.raises(Conflict, match="not canary"):
        leader.service.promote("m")
    leader.close()
    follower.close()
