"""Scheduled rollouts on the controller (real SQLite, node directory, membership tracker and
heartbeat payloads): waves with a health gate, the abort rule rolling back what switched, a
maintenance window closed then open, the rate, and retrying failed nodes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError
from rollout_harness import RolloutHarness, failed, ready

from central.errors import Conflict
from central.rollout import RolloutRequest
from central.rollout.waves import order_targets
from fleetwire.mqtt.payloads import ModelInfo

NODES = [f"n{i}" for i in range(4)]


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[RolloutHarness]:
    h = RolloutHarness(tmp_path)
    h.store_version("m", "1")
    h.store_version("m", "2", activate=False)
    yield h
    h.close()


def _request(**fields: object) -> RolloutRequest:
    return RolloutRequest.model_validate({"version": "2", **fields})


def _serving(h: RolloutHarness, nodes: list[str]) -> dict[str, str | None]:
    return {n: h.serves(n) for n in nodes}


def _staged(h: RolloutHarness, node_id: str) -> bool:
    return ("m", "2") in h.service.holding(node_id).staged


async def test_waves_go_one_after_another_through_the_health_gate(harness: RolloutHarness) -> None:
    harness.add_nodes(NODES)
    ranked = order_targets("m", "2", NODES)
    r = harness.service.start("m", _request(waves=["1", "50%"], soak_s=0))
    assert r.state == "canary" and r.wave_sizes == [1, 2, 4] and list(r.switch_at) == ranked[:1]
    assert _serving(harness, NODES) == {n: "2" if n == ranked[0] else "1" for n in NODES}
    assert r.nodes[ranked[1]] == "pending" and r.reason is not None and "wave 1 of 3" in r.reason
    assert not _staged(harness, ranked[1])  # without windows, later waves do not download early

    harness.report(ranked[0], ready("2"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.state == "rolling" and r.wave == 1 and sorted(r.switch_at) == sorted(ranked[:2])
    harness.report(ranked[1], ready("2"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.wave == 2 and sorted(r.switch_at) == sorted(NODES)
    for node in ranked[2:]:
        harness.report(node, ready("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").state == "complete"
    assert harness.event_types() == ["rollout_started", "rollout_promoted", "rollout_promoted", "rollout_completed"]


async def test_a_manual_gate_waits_for_promote_and_the_last_wave_cannot_be_promoted(harness: RolloutHarness) -> None:
    harness.add_nodes(NODES)
    ranked = order_targets("m", "2", NODES)
    harness.service.start("m", _request(waves=["25%"]))
    harness.report(ranked[0], ready("2"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.wave == 0 and r.reason is not None and "manual promote" in r.reason
    r = harness.service.promote("m")
    assert r.wave == 1 and sorted(r.switch_at) == sorted(NODES)
    with pytest.raises(Conflict, match="last wave"):
        harness.service.promote("m")


async def test_the_abort_rule_rolls_back_every_switched_node(harness: RolloutHarness) -> None:
    harness.add_nodes(NODES)
    ranked = order_targets("m", "2", NODES)
    harness.service.start("m", _request(waves=["50%"], failure_threshold=0.4, min_nodes=2))
    harness.report(ranked[0], ready("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").state == "canary"  # one report: below min_nodes
    harness.report(ranked[1], failed("2"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.state == "rolled_back" and r.reason is not None and "1 of 2 nodes failed" in r.reason
    assert _serving(harness, NODES) == dict.fromkeys(NODES, "1")


def _window_in(seconds: float, duration_s: float, zone: str) -> dict[str, object]:
    """A daily window opening ``seconds`` from now (to the minute), in UTC, for ``zone``."""
    opens = datetime.fromtimestamp(time.time() + seconds, UTC)
    cron = f"{opens.minute} {opens.hour} * * *"
    return {"selector": {"zone": zone}, "cron": cron, "duration_s": duration_s, "tz": "UTC"}


async def test_nodes_stage_while_their_window_is_closed_and_switch_when_it_opens(harness: RolloutHarness) -> None:
    harness.add_nodes(["a0", "a1"], zone="a")
    harness.add_nodes(["b0"], zone="b")
    window = _window_in(2 * 3600, 600, "a")
    r = harness.service.start("m", _request(waves=["100%"], windows=[window]))
    assert list(r.switch_at) == ["b0"]  # no window selects b0: it switches at once
    assert _serving(harness, ["a0", "a1", "b0"]) == {"a0": "1", "a1": "1", "b0": "2"}
    assert _staged(harness, "a0") and _staged(harness, "a1") and not _staged(harness, "b0")
    assert r.reason is not None and "2 outside their maintenance window" in r.reason and "zone=a" in r.reason

    harness.report("a0", ModelInfo(name="m", version="2", state="staged"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").nodes["a0"] == "staged"

    opened = time.time() + 2 * 3600 + 30
    harness.controller.evaluate_all(now=opened)
    r = harness.service.get("m")
    assert sorted(r.switch_at) == ["a0", "a1", "b0"]
    assert _serving(harness, ["a0", "a1", "b0"]) == dict.fromkeys(["a0", "a1", "b0"], "2")
    assert not _staged(harness, "a0")


async def test_the_rate_lets_so_many_nodes_in_per_minute(harness: RolloutHarness) -> None:
    nodes = [f"n{i}" for i in range(5)]
    harness.add_nodes(nodes)
    start = time.time()
    r = harness.service.start("m", _request(waves=["100%"], rate_per_min=2))
    assert len(r.switch_at) == 2 and r.reason is not None and "rate of 2/min" in r.reason
    harness.controller.evaluate_all(now=start + 30)
    assert len(harness.service.get("m").switch_at) == 2
    harness.controller.evaluate_all(now=start + 61)
    assert len(harness.service.get("m").switch_at) == 4


async def test_a_retried_node_counts_again_and_its_stale_report_is_ignored(harness: RolloutHarness) -> None:
    harness.add_nodes(NODES)
    r = harness.service.start("m", _request(waves=["100%"], failure_threshold=1.0))
    harness.report("n0", ModelInfo(name="m", version="2", state="failed", reason="load", error="no session"))
    harness.controller.evaluate_all()
    r = harness.service.get("m")
    assert r.nodes["n0"] == "failed" and r.failures["n0"].reason == "load"
    changes = harness.changes
    r = harness.service.retry("m")
    assert r.nodes["n0"] == "loading" and "n0" not in r.failures and harness.changes > changes
    harness.controller.evaluate_all()  # the edge has not reported again yet: its old report does not count
    assert harness.service.get("m").nodes["n0"] == "loading"
    harness.report("n0", ready("2"))
    harness.controller.evaluate_all()
    assert harness.service.get("m").nodes["n0"] == "ready"
    with pytest.raises(Conflict, match="no failed node"):
        harness.service.retry("m")
    assert "rollout_retried" in harness.event_types()


def test_bad_schedules_are_refused_with_a_message() -> None:
    with pytest.raises(ValidationError, match="one or the other"):
        _request(stage=True, waves=["10%"])
    with pytest.raises(ValidationError, match="time zone"):
        _request(windows=[{"cron": "0 2 * * *", "duration_s": 60, "tz": "Mars/Olympus"}])
    with pytest.raises(ValidationError, match="5 fields"):
        _request(windows=[{"cron": "0 2 * *", "duration_s": 60}])
    with pytest.raises(ValidationError, match="more than 100%"):
        _request(waves=["150%"])
