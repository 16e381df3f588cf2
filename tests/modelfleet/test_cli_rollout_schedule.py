"""``modelfleet rollout`` with waves, a rate and maintenance windows, ``flip`` and ``retry``
against a real central and edge: what the options send, how the rollout reads back, and the
409s and usage errors in words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_harness import Cli, one_error_line

from central.server import CentralServer
from modelfleet.cli.client import UsageError
from modelfleet.cli.rollout import parse_duration, parse_window
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, version_state
from support.wait import wait_for


def test_window_and_duration_shorthands() -> None:
    assert parse_window("zone=a|0 2 * * *|1h|Europe/Berlin") == {
        "selector": {"zone": "a"}, "cron": "0 2 * * *", "duration_s": 3600.0, "tz": "Europe/Berlin",
    }  # fmt: skip
    assert parse_window("|30 1 * * 6|90m") == {"selector": {}, "cron": "30 1 * * 6", "duration_s": 5400.0}
    assert parse_duration("45") == 45.0 and parse_duration("2d") == 172800.0
    for bad in ("zone=a|0 2 * * *", "a|b|c|d|e"):
        with pytest.raises(UsageError, match=r"selector\|cron\|duration"):
            parse_window(bad)
    with pytest.raises(UsageError, match="duration"):
        parse_duration("1 fortnight")


async def test_a_scheduled_rollout_from_the_cli(tmp_path: Path, central: CentralServer, make_edge: EdgeFactory) -> None:
    edge = await make_edge("edge-0", central, labels={"zone": "a"})
    await wait_for(lambda: len(central.central.directory.nodes()) == 1, 20, "edge-0 registered")
    cli = Cli(tmp_path, central.http_url)
    v1 = build_mlp(tmp_path / "v1.onnx", width=16, hidden_layers=1)
    v2 = build_mlp(tmp_path / "v2.onnx", width=16, hidden_layers=1, seed=1)
    assert (await cli("push", str(v1), "--name", "m", "--version", "1")).exit_code == 0
    await wait_for(lambda: version_state(edge, "m", "1") == "complete", 30, "v1 on edge-0")
    assert (await cli("push", str(v2), "--name", "m", "--version", "2", "--no-activate")).exit_code == 0

    bad = await cli("rollout", "m", "2", "--window", "zone=a|0 2 * * *|1h|Mars/Olympus")
    assert bad.exit_code == 1 and "time zone" in one_error_line(bad)
    started = await cli(
        "rollout",
        "m",
        "2",
        "--waves",
        "1,50%",
        "--rate",
        "6",
        "--window",
        "zone=a|0 2 * * *|1h|Europe/Berlin",
        "--json",
    )
    assert started.exit_code == 0, started.stderr
    r = json.loads(started.stdout)
    assert r["waves"] == ["1", "50%", "100%"] and r["rate_per_min"] == 6.0
    assert r["windows"] == [
        {"selector": {"zone": "a"}, "cron": "0 2 * * *", "duration_s": 3600.0, "tz": "Europe/Berlin"}
    ]
    shown = await cli("rollouts")
    assert shown.exit_code == 0 and "m" in shown.stdout

    nothing = await cli("retry", "m")
    assert nothing.exit_code == 1 and "no failed node" in one_error_line(nothing)
    not_staged = await cli("flip", "m")
    assert not_staged.exit_code == 1 and "not staged" in one_error_line(not_staged)
    assert (await cli("rollback", "m")).exit_code == 0

    staged = await cli("rollout", "m", "2", "--stage", "--json")
    assert staged.exit_code == 0, staged.stderr
    assert json.loads(staged.stdout)["state"] == "staging"
    early = await cli("flip", "m", "--at", "2001-01-01T00:00:00Z")
    assert early.exit_code == 1 and "has passed" in one_error_line(early)
    flipped = await cli("flip", "m", "--json")
    assert flipped.exit_code == 0, flipped.stderr
    assert json.loads(flipped.stdout)["flip_at"] is not None
