"""``modelfleet rollout M V --dry-run`` against a real central and edge: the cost tables (or
``--json``), nothing started, and a clear error for a version that does not exist."""

from __future__ import annotations

import json
from pathlib import Path

from cli_harness import Cli, one_error_line

from central.server import CentralServer
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, version_state
from support.wait import wait_for


async def test_dry_run_shows_the_cost_and_starts_nothing(
    tmp_path: Path, central: CentralServer, make_edge: EdgeFactory
) -> None:
    edge = await make_edge("edge-0", central, site="plant-1")
    await wait_for(lambda: len(central.central.directory.nodes()) == 1, 20, "edge-0 registered")
    v1 = build_mlp(tmp_path / "v1.onnx", width=128, hidden_layers=2)
    v2 = build_mlp(tmp_path / "v2.onnx", width=128, hidden_layers=2, head_seed=1)
    cli = Cli(tmp_path, central.http_url)
    assert (await cli("push", str(v1), "--name", "m", "--version", "1")).exit_code == 0
    await wait_for(lambda: version_state(edge, "m", "1") == "complete", 30, "v1 on edge-0")
    assert (await cli("push", str(v2), "--name", "m", "--version", "2", "--no-activate")).exit_code == 0

    shown = await cli("rollout", "m", "2", "--dry-run")
    assert shown.exit_code == 0, shown.stderr
    for text in ("dry run: m:2 (from 1)", "edge-0", "plant-1", "HELD ALREADY", "INTO SITE (WAN)", "central egress"):
        assert text in shown.stdout, shown.stdout
    preview = json.loads((await cli("rollout", "m", "2", "--dry-run", "--json")).stdout)
    (node,) = preview["nodes"]
    assert node["node_id"] == "edge-0" and node["targeted"] and node["bytes_reused"] > node["bytes_total"] > 0
    assert node["bytes_from_central"] == preview["totals"]["central_egress_bytes"] == node["bytes_total"]
    assert json.loads((await cli("rollouts", "--json")).stdout) == []  # nothing was started

    missing = await cli("rollout", "m", "9", "--dry-run")
    assert missing.exit_code == 1 and "no version '9'" in one_error_line(missing)
