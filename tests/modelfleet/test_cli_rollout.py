"""``rollout``/``promote``/``rollback`` against central's real rollout API, watched by a
real ``modelfleet events --follow`` process that Ctrl-C ends cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from cli_harness import Cli, one_error_line

from central.server import CentralServer
from support.fleet import EdgeFactory
from support.processes import ctrl_c_able
from support.wait import wait_for


async def _next_event(stream: asyncio.StreamReader, wanted: str) -> dict[str, object]:
    """Read ``events --follow --json`` lines until one of type ``wanted``."""
    while True:
        line = await asyncio.wait_for(stream.readline(), 30)
        assert line, f"events --follow ended before a {wanted} event"
        event = json.loads(line)
        if event["type"] == wanted:
            return dict(event)


async def test_rollout_promote_rollback_seen_by_events_follow(
    tmp_path: Path, central: CentralServer, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    await make_edge("edge-0", central, labels={"zone": "a"})
    await wait_for(lambda: len(central.central.directory.nodes()) == 1, 20, "edge-0 registered")
    cli = Cli(tmp_path, central.http_url)
    assert (await cli("push", str(small_model_file), "--name", "m")).exit_code == 0
    stored = await cli("push", str(small_model_file), "--name", "m", "--version", "2", "--no-activate")
    assert "stored only" in stored.stdout

    follow = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "modelfleet", "events", "--follow", "--json", "--interval", "0.2",
        env={**os.environ, **cli.env, "PYTHONPATH": str(Path(__file__).parents[2])},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=ctrl_c_able,
    )  # fmt: skip
    try:
        assert follow.stdout is not None
        started = json.loads(
            (await cli("rollout", "m", "2", "--canary", "50%", "--selector", "zone=a", "--json")).stdout
        )
        assert (started["state"], started["canary_nodes"], started["selector"]) == ("canary", ["edge-0"], {"zone": "a"})
        assert (await _next_event(follow.stdout, "rollout_started"))["detail"] == {
            "model": "m", "version": "2", "rollout_id": started["id"]
        }  # fmt: skip

        promoted = await cli("promote", "m")
        assert promoted.exit_code == 0 and "rolling" in promoted.stdout
        await _next_event(follow.stdout, "rollout_promoted")
        again = await cli("promote", "m")
        assert again.exit_code == 1 and "not canary" in one_error_line(again)

        rolled_back = await cli("rollback", "m")
        assert rolled_back.exit_code == 0 and "rolled_back" in rolled_back.stdout and "(from 1)" in rolled_back.stdout
        await _next_event(follow.stdout, "rollout_rolled_back")
        listed = json.loads((await cli("rollouts", "--json")).stdout)
        assert [(r["version"], r["state"]) for r in listed] == [("2", "rolled_back")]
        shown = json.loads((await cli("models", "show", "m", "--json")).stdout)
        assert shown["rollout"]["state"] == "rolled_back"

        follow.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(follow.communicate(), 30)
        assert follow.returncode == 0, stderr.decode()
        assert b"Traceback" not in stderr
    finally:
        if follow.returncode is None:
            follow.kill()
            await follow.wait()
