"""The fleet-sized language-model bench runs end to end at a tiny size (Mosquitto, central and
three edges as processes; a 16-layer random Llama of a few MB): a staged language model reaches
every edge with its tokenizer and config byte for byte, each chunk leaving central once, and a
fine-tune of 2 of its 16 layers moves only a fraction of it. Served (the tiny Llama as int4),
conversations through central stick to their nodes, streams whose edge is SIGKILLed go on
elsewhere token for token, and the gateway's throughput is measured beside the edges'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.generate_fleet import TARGETS, main


@pytest.mark.timeout(300)  # two fleets of real processes writing a 16-layer model
def test_generate_fleet_bench_measures_distribution_and_finetune(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "generate_fleet.json"
    args = ["--json", str(out), "--sections", "distribution,finetune", "--shape", "tiny", "--layers", "16",
            "--edges", "3", "--finetune-edges", "3",
            "--chunk-avg-kb", "32", "--timeout-s", "60", "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    distribution = {"llm_origin_ratio", "finetune_delta_ratio"}
    assert all(key in printed for key in distribution)
    data = json.loads(out.read_text())
    assert data["cpu_flags"] and data["sections"] == ["distribution", "finetune"]
    assert set(data["met"]) == distribution and data["errors"] == 0
    dist = data["distribution"]
    assert dist["kind"] == "decoder" and dist["all_files_verified"]
    assert {"model.onnx.data", "tokenizer.json", "genai_config.json"} <= set(dist["files"])
    # placement and peers: about one copy of each chunk leaves central for three edges
    assert data["llm_origin_ratio"] == pytest.approx(dist["origin_bytes"] / dist["model_bytes"])
    assert 0.9 < data["llm_origin_ratio"] <= TARGETS["llm_origin_ratio"]
    ft = data["finetune"]
    assert ft["all_files_verified"] and ft["changed_layers"] == [3, 9] and ft["layers"] == 16
    assert len(ft["per_edge_bytes"]) == 3 and all(b > 0 for b in ft["per_edge_bytes"].values())
    # what moved is the changed layers and their boundary chunks, no more than the manifests differ by
    assert ft["changed_tensor_ratio"] <= ft["finetune_delta_ratio"] <= ft["cdc_new_bytes_ratio"] + 0.01
    assert data["finetune_delta_ratio"] < 0.3
    assert not any((tmp_path / "work").iterdir())  # fleets and models removed


def test_generate_fleet_bench_measures_routing_failover_and_the_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "generate_fleet.json"
    args = ["--json", str(out), "--sections", "affinity,midstream,gateway", "--serve-shape", "tiny",
            "--conversations", "6", "--turns", "3", "--system-tokens", "150", "--user-tokens", "30",
            "--reply-tokens", "16", "--kills", "2", "--kill-streams", "3", "--stream-tokens", "440",
            "--kill-after", "1",
            "--clients", "6", "--gateway-tokens", "32", "--timeout-s", "60",
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    serving = {"affinity_ttft_ratio", "load_max_over_mean", "midstream_kills", "broken_streams",
               "token_mismatches", "gateway_ratio"}  # fmt: skip
    assert set(data["met"]) == serving and all(key in printed for key in serving)
    affinity = data["affinity"]
    for policy in ("prefix", "least_outstanding"):
        run = affinity[policy]
        assert run["errors"] == [] and sum(run["streams_per_node"].values()) == 6 * 3
        assert sum(run["generated_per_node"].values()) == 6 * 3 * 16
        # the edges' breakdown of the time to first token counts the same streams and prompts
        edge = run["edge"]
        assert edge["streams"] == 6 * 3 and edge["prompt_tokens"] == run["prompt_tokens"]
        assert 0 < edge["prefilled_tokens"] < edge["prompt_tokens"] and edge["prefill_run_s"] > 0
        assert sum(t["streams"] for t in run["edge_by_turn"].values()) == 6 * 3
    # later turns follow their conversation's prefix; least-outstanding never looks at it
    assert affinity["prefix"]["routed"].get("prefix", 0) > 0 and "prefix" not in affinity["least_outstanding"]["routed"]
    assert data["affinity_ttft_ratio"] > 0 and data["load_max_over_mean"] >= 1.0
    # the kills hit streams mid-way (a tiny model may finish some before the kill lands); those
    # went on elsewhere, token for token as undisturbed
    mid = data["midstream"]
    assert data["midstream_kills"] == 2 and mid["resumed"] >= 1
    assert data["broken_streams"] == 0 and data["token_mismatches"] == 0 and mid["reference_broken"] == 0
    gateway = data["gateway"]
    assert gateway["errors"] == 0 and data["gateway_ratio"] > 0
    assert all(r["tokens"] == 6 * 32 for runs in gateway["runs"].values() for r in runs)
    assert not any((tmp_path / "work").iterdir())
