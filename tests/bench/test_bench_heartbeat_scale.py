"""The heartbeat-scale bench runs end to end at a tiny size: nothing lost, the silenced
nodes and only those are declared dead, within the detection target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.heartbeat_scale import heartbeat_parts, main, summarize_collapsed, targets_for
from fleetwire.mqtt.payloads import Heartbeat
from fleetwire.mqtt.topics import Topics


def test_heartbeat_template_patches_to_a_valid_heartbeat() -> None:
    head, mid, tail = heartbeat_parts(Topics(), "sim-000042", 42, 0.5, 3)
    packet = head + b"%12d" % 123456 + mid + b"%13d" % 1_700_000_000_999 + tail
    assert packet[0] == 0x30
    # Remaining length (2-byte varint here) covers exactly the rest of the packet.
    remaining = (packet[1] & 0x7F) + (packet[2] << 7)
    assert packet[2] < 0x80 and remaining == len(packet) - 3
    topic_len = int.from_bytes(packet[3:5], "big")
    assert packet[5 : 5 + topic_len] == b"modelfleet/v1/nodes/sim-000042/heartbeat"
    hb = Heartbeat.model_validate_json(packet[5 + topic_len :])
    assert (hb.node_id, hb.bdseq, hb.seq, hb.ts, hb.interval_s) == ("sim-000042", 3, 123456, 1_700_000_000_999, 0.5)
    assert [m.state for m in hb.models] == ["ready", "ready"] and hb.http_address


def test_summarize_collapsed() -> None:
    text = "thread (0x1);a (m.py:1);b (m.py:2) 3\nthread (0x1);a (m.py:1) 1\nthread (0x2);c (n.py:5) 4\n"
    s = summarize_collapsed(text)
    assert s["samples"] == 8
    assert s["threads_pct"] == [("thread (0x1)", 50.0), ("thread (0x2)", 50.0)]
    assert dict(s["inclusive_pct"])["a (m.py:1)"] == 50.0
    assert dict(s["self_pct"]) == {"c (n.py:5)": 50.0, "b (m.py:2)": 37.5, "a (m.py:1)": 12.5}


@pytest.mark.timeout(90)
def test_heartbeat_scale_bench_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hb.json"
    argv = [
        "--nodes", "200", "--rate", "5", "--duration-s", "6", "--silent-fraction", "0.02",
        "--connections", "2", "--sim-procs", "1", "--json", str(out), "--work-dir", str(tmp_path / "work"),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "processed_per_s" in printed and "detect_p99_s" in printed
    data = json.loads(out.read_text())
    for key in (
        "nodes", "offered_per_s", "processed_per_s", "processed_ratio", "false_deaths", "missed_deaths",
        "detect_p99_s", "central_cpu_percent", "simulator_cpu_percent", "targets", "met",
    ):  # fmt: skip
        assert key in data, key
    assert data["nodes"] == 200 and data["silenced"] == 4
    assert data["targets"] == targets_for(0.2)
    assert data["targets"]["detect_p99_s"] == pytest.approx(0.7)
    assert set(data["met"]) == {"processed_ratio", "false_deaths", "missed_deaths", "detect_p99_s"}
    assert data["false_deaths"] == 0, data["false_death_ids"]
    assert data["missed_deaths"] == 0, data["missed_death_ids"]
    # 196 nodes x 5/s + 4 x 5/s for half the window: ~990/s offered, all of it processed.
    assert 0.9 * data["expected_per_s"] <= data["offered_per_s"] <= 1.1 * data["expected_per_s"]
    assert data["processed_ratio"] > 0.9
    assert data["heartbeats_lost"] == 0
    # Dead after 3 intervals of silence: detection cannot beat that, and is not much later.
    assert 0.6 - 0.05 <= data["detect_p99_s"] <= 1.0
    assert data["central_cpu_percent"] is not None and data["central_cpu_percent"] > 0
    assert data["simulator_cpu_percent"] > 0
    assert data["errors"] == []
