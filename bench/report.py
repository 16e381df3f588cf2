"""The benchmark report: one Markdown table from the JSON files ``make bench`` writes.

Usage: ``python -m bench.report [--results bench/out] [--output docs/benchmarks.md]``

Every figure, its target and whether it was met come from the JSON files themselves
(``targets`` and ``met`` in each); ``FIGURES`` below only says which key holds the
measured value of each target, which way the comparison goes and which of the run's own
figures is the baseline it was measured beside. A target this table does not know yet
still gets a row (value under the same key, verdict from ``met``), and a benchmark
whose JSON is missing gets a "not run" row, so the report never hides a gap."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["BENCHES", "FIGURES", "Figure", "machine", "main", "render", "rows"]

#: The benchmarks in report order: each writes ``bench/out/<name>.json``.
BENCHES = (
    "placement", "distribution", "delta", "quantization", "zoo", "serving", "warm_start", "failover", "heartbeat_scale",
    "central_ha", "placement_sites", "sites", "autonomy", "rollout", "generate_fleet",
)  # fmt: skip


@dataclass(frozen=True)
class Figure:
    """How to read one target of one benchmark's JSON."""

    value: str
    """Key of the measured figure."""
    compare: str
    """``<=`` or ``>=``: which side of the target passes."""
    title: str
    """The figure in words."""
    baseline: str = ""
    """``str.format`` template over the JSON's keys: the baseline measured beside it."""


FIGURES: dict[tuple[str, str], Figure] = {
    ("placement", "max_over_mean"): Figure(
        "worst_max_over_mean", "<=", "most chunks on one node / mean (bounded load)",
        "unbounded consistent hashing: {worst_unbounded_max_over_mean:.3f}",
    ),
    ("placement", "moved_over_ideal"): Figure(
        "worst_moved_over_ideal", "<=", "chunks moved when a node leaves / ideal 1/N",
        "ideal: 1/N of the chunks move; worst single leave {worst_moved_over_ideal_max:.3f}",
    ),
    ("distribution", "origin_ratio"): Figure(
        "origin_ratio", "<=", "bytes out of central / model size",
        "{edges} edges; naive (every edge from central): {naive_origin_ratio:.2f}",
    ),
    ("distribution", "rollout_over_single"): Figure(
        "rollout_over_single", "<=", "fleet rollout time / one edge alone",
        "one edge alone: {single_edge_rollout_s:.2f} s; the fleet: {rollout_s:.2f} s",
    ),
    ("delta", "delta_ratio"): Figure(
        "delta_ratio", "<=", "bytes fetched for a new version / model size",
        "fixed 1 MiB blocks: {fixed_chunk_delta_ratio:.4f}; after a header shift: fixed blocks"
        " {shifted_fixed_chunk_delta_ratio:.4f}, CDC {shifted_cdc_delta_ratio:.4f}",
    ),
    ("quantization", "size_ratio"): Figure(
        "size_ratio", "<=", "INT8 size / FP32 size", "FP32: {fp32_bytes:,} B; INT8: {int8_bytes:,} B"
    ),
    ("quantization", "accuracy_delta_pp"): Figure(
        "accuracy_delta_pp", "<=", "digits accuracy lost to INT8 (points)",
        "FP32 accuracy {fp32_accuracy:.4f}; INT8 {int8_accuracy:.4f}",
    ),
    ("quantization", "speedup_b32"): Figure(
        "speedup_b32", ">=", "INT8 speed-up over FP32, batch 32",
        "FP32: {fp32_ms_b32:.3f} ms per batch; INT8 {int8_ms_b32:.3f} ms",
    ),
    ("zoo", "min_speedup"): Figure(
        "min_speedup", ">=", "slowest served artifact / FP32, any zoo model, batch 1 or 8",
        "FP32 of the same model in the same run",
    ),
    ("zoo", "cnn_speedup_b8"): Figure(
        "cnn_speedup_b8", ">=", "CNN: served artifact's speed-up over FP32, batch 8", "FP32 {cnn_model}, same run"
    ),
    ("zoo", "transformer_speedup_b8"): Figure(
        "transformer_speedup_b8", ">=", "transformer: served artifact's speed-up over FP32, batch 8",
        "FP32 {transformer_model}, same run",
    ),
    ("zoo", "max_accuracy_delta_pp"): Figure(
        "max_accuracy_delta_pp", "<=", "accuracy lost by the served artifact, trained zoo models (points)",
        "FP32 on the same eval split",
    ),
    ("serving", "speedup"): Figure(
        "speedup", ">=", "dynamic batching speed-up (req/s)",
        "unbatched: {unbatched_rps:.0f} req/s; batched {batched_rps:.0f} req/s",
    ),
    ("serving", "ceiling_ratio"): Figure(
        "ceiling_ratio", ">=", "digits req/s / HTTP no-op req/s",
        "no-op endpoint: {noop_rps:.0f} req/s; digits {digits_rps:.0f} req/s",
    ),
    ("serving", "errors"): Figure("errors", "<=", "failed requests under load", "{clients} clients"),
    ("serving", "compute_ratio"): Figure(
        "compute_ratio", ">=", "batched req/s / ONNX Runtime in-process rows/s (batch 32)",
        "ONNX Runtime alone: {compute_limit_rps:.0f} rows/s; edge {batched_rps:.0f} req/s",
    ),
    ("serving", "grpc_over_rest"): Figure(
        "grpc_over_rest", ">=", "gRPC req/s / REST req/s (batched model)",
        "REST {batched_rps:.0f} req/s; gRPC {grpc_batched_rps:.0f} req/s",
    ),
    ("warm_start", "ratio"): Figure(
        "ratio", "<=", "warm restart to ready / cold start", "cold: {cold_ready_s:.2f} s; warm {warm_ready_s:.2f} s"
    ),
    ("warm_start", "overhead_ratio"): Figure(
        "overhead_ratio", "<=", "warm restart to ready / bare interpreter importing onnxruntime and numpy",
        "floor: {floor_s:.3f} s; warm {warm_ready_s:.2f} s",
    ),
    ("warm_start", "big_over_small"): Figure(
        "big_over_small", "<=", "warm restart to ready: big model / digits model",
        "big model {big_mb} MiB: {big_warm_ready_s:.2f} s ({big_warm_bytes_rehashed:,} B re-hashed), digits"
        " {small_warm_ready_s:.2f} s; re-hashing every start (before): {big_over_small_rehash:.2f}"
        " ({big_warm_rehash_ready_s:.2f} s, {big_warm_rehash_bytes_rehashed:,} B)",
    ),
    ("failover", "kill_detect_s"): Figure(
        "kill_detect_s", "<=", "killed edge marked dead (s)", "heartbeat interval {heartbeat_interval_s} s"
    ),
    ("failover", "freeze_detect_s"): Figure(
        "freeze_detect_s", "<=", "frozen edge marked dead (s)",
        "heartbeat interval {heartbeat_interval_s} s; suspect after {freeze_suspect_s} s",
    ),
    ("failover", "gateway_errors"): Figure(
        "gateway_errors", "<=", "gateway errors through the failures", "{gateway_requests} requests sent"
    ),
    ("heartbeat_scale", "processed_ratio"): Figure(
        "processed_ratio", ">=", "heartbeats processed / expected",
        "{nodes} nodes offered {offered_per_s:.0f}/s; processed {processed_per_s:.0f}/s",
    ),
    ("heartbeat_scale", "false_deaths"): Figure(
        "false_deaths", "<=", "live nodes wrongly declared dead", "{false_suspects} false suspects"
    ),
    ("heartbeat_scale", "missed_deaths"): Figure(
        "missed_deaths", "<=", "silenced nodes never declared dead", "{silenced} nodes silenced"
    ),
    ("heartbeat_scale", "detect_p99_s"): Figure(
        "detect_p99_s", "<=", "silence to death, p99 (s)", "interval {interval_s} s; p50 {detect_p50_s:.3f} s"
    ),
    ("central_ha", "pushes_lost"): Figure(
        "pushes_lost", "<=", "acked pushes missing after replica kills", "{pushes_acked} pushes acked"
    ),
    ("central_ha", "gateway_errors"): Figure(
        "gateway_errors", "<=", "gateway errors through replica kills", "{gateway_requests} requests sent"
    ),
    ("central_ha", "false_deaths"): Figure(
        "false_deaths", "<=", "live nodes declared dead (replicas)", "{nodes} nodes, {replicas} replicas"
    ),
    ("central_ha", "missed_deaths"): Figure(
        "missed_deaths", "<=", "silenced nodes never declared dead (replicas)", "{silenced} nodes silenced"
    ),
    ("central_ha", "leader_takeover_s"): Figure(
        "leader_takeover_s", "<=", "leader SIGKILL to a new leader (s)", "edge reattach p99 {edge_reattach_s_p99} s"
    ),
    ("central_ha", "heartbeat_share_max_over_mean"): Figure(
        "heartbeat_share_max_over_mean", "<=", "heartbeats per replica, max / mean", "{partitions} partitions"
    ),
    ("central_ha", "healthz_p99_ms_during_pg_restart"): Figure(
        "healthz_p99_ms_during_pg_restart", "<=", "/healthz p99 while PostgreSQL restarts (ms)",
        "store calls on the event loop (before): {healthz_p99_ms_before} ms",
    ),
    ("sites", "wan_ratio_max"): Figure(
        "wan_ratio_max", "<=", "worst site's WAN bytes in / model size",
        "sites ignored (one ring): {baseline_wan_ratio_max:.2f}",
    ),
    ("sites", "origin_ratio"): Figure(
        "origin_ratio", "<=", "bytes out of central / model size, over WAN links",
        "{sites} sites × {edges_per_site} edges; sites ignored: {baseline_origin_ratio:.2f}",
    ),
    ("sites", "rollout_over_single"): Figure(
        "rollout_over_single", "<=", "fleet rollout / one edge's over the same links",
        "{rollout_s:.2f} s vs {single_edge_rollout_s:.2f} s; sites ignored: {baseline_rollout_s:.2f} s",
    ),
    ("autonomy", "all_ready"): Figure(
        "all_ready", "", "every edge ready after a power cycle, central and broker down",
        "cold boot p99 {cold_boot_ready_s_p99} s over {edges} edges",
    ),
    ("autonomy", "errors"): Figure(
        "errors", "<=", "failed requests to edges through the outage", "{requests} requests sent",
    ),
    ("autonomy", "resync_s"): Figure(
        "resync_s", "<=", "central back to every edge synced (s)", "outage {outage_s} s",
    ),
    ("rollout", "flip_skew_s"): Figure(
        "flip_skew_s", "<=", "staged flip: last edge's switch − first's (s)",
        "{edges} edges; worst |switch − instant| {flip_error_s} s, bracket ± {flip_resolution_s} s;"
        " clock offsets ≤ {clock_offset_abs_max_ms} ms",
    ),
    ("rollout", "preview_error"): Figure(
        "preview_error", "<=", "rollout preview vs bytes each edge fetched, worst relative error",
        "new version {preview_error_full}; delta version {preview_error_delta}",
    ),
    ("rollout", "shadow_detect_requests"): Figure(
        "shadow_detect_requests", "<=", "drifted live requests until central raises int8_drift",
        "live INT8/FP32 agreement {shadow_live_agreement}; shadow sample {settings[shadow_sample]}",
    ),
    ("rollout", "fallback_s"): Figure(
        "fallback_s", "<=", "int8_drift to every edge serving FP32 (s)", "{edges} edges",
    ),
    ("generate_fleet", "llm_origin_ratio"): Figure(
        "llm_origin_ratio", "<=", "bytes out of central / language model size (graph, data, tokenizer, config)",
        "{distribution[model_bytes]} B staged on {distribution[edges]} edges; files byte-identical:"
        " {distribution[all_files_verified]}",
    ),
    ("generate_fleet", "finetune_delta_ratio"): Figure(
        "finetune_delta_ratio", "<=", "bytes the worst edge fetched for 2 of 16 layers changed / model size",
        "changed tensors alone {finetune[changed_tensor_ratio]:.4f}; fixed 1 MiB blocks"
        " {finetune[fixed_block_new_bytes_ratio]:.4f}; mean edge {finetune[finetune_delta_ratio_mean]:.4f}",
    ),
}  # fmt: skip

_SYMBOL = {"<=": "≤", ">=": "≥"}
_NONE = "—"


def fmt(value: Any) -> str:
    """A figure as the table shows it."""
    if value is None:
        return _NONE
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _fill(template: str, doc: Mapping[str, Any]) -> str:
    """``template`` over ``doc``; a dash when a key is missing or null."""
    if not template:
        return _NONE
    try:
        return template.format_map(doc)
    except (KeyError, TypeError, ValueError, IndexError):
        return _NONE


def _figure(bench: str, key: str, doc: Mapping[str, Any]) -> Figure:
    known = FIGURES.get((bench, key))
    if known is not None:
        return known
    value = key if key in doc else f"worst_{key}"
    return Figure(value, "", key)


def _verdict(met: Any) -> str:
    return _NONE if met is None else ("met" if met else "**missed**")


def rows(bench: str, doc: Mapping[str, Any], date: str) -> Iterator[list[str]]:
    """The table rows of one benchmark's JSON: one per target, then one per other check in ``met``."""
    targets: Mapping[str, Any] = doc.get("targets") or {}
    met: Mapping[str, Any] = doc.get("met") or {}
    for key, target in targets.items():
        f = _figure(bench, key, doc)
        shown_target = f"{_SYMBOL.get(f.compare, f.compare)} {fmt(target)}".strip()
        yield [
            bench,
            f.title,
            fmt(doc.get(f.value)),
            shown_target,
            _verdict(met.get(key)),
            _fill(f.baseline, doc),
            date,
        ]
    for key, ok in met.items():
        if key not in targets and key != "all":
            yield [bench, key.replace("_", " "), fmt(ok), "yes", _verdict(ok), _NONE, date]


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """CPU model and logical CPUs from ``cpuinfo`` (else what Python knows)."""
    model, cpus = "", 0
    try:
        for line in cpuinfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == "processor":
                cpus += 1
            elif name.strip() == "model name" and not model:
                model = value.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return f"{model}, {cpus or os.cpu_count() or '?'} logical CPUs"


def _date_of(path: Path, doc: Mapping[str, Any]) -> str:
    stamp = datetime.fromtimestamp(path.stat().st_mtime, UTC)
    return str(doc.get("date") or stamp.strftime("%Y-%m-%d %H:%M UTC"))


def render(results: Path, cpuinfo: Path = Path("/proc/cpuinfo"), now: datetime | None = None) -> str:
    """The Markdown report over ``results/<bench>.json``."""
    header = ["benchmark", "figure", "measured", "target", "verdict", "baseline measured beside it", "run on"]
    table = [header, ["---"] * len(header)]
    for bench in BENCHES:
        path = results / f"{bench}.json"
        if not path.is_file():
            table.append([bench, "not run", _NONE, _NONE, _NONE, _NONE, _NONE])
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            table.append([bench, f"unreadable: {exc}", _NONE, _NONE, _NONE, _NONE, _NONE])
            continue
        table.extend(rows(bench, doc, _date_of(path, doc)))
    when = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        "Written by `python -m bench.report` (the last step of `make bench`) from the JSON files in",
        "`bench/out/`; do not edit by hand. Each benchmark's own docstring says how it measures.",
        "",
        f"- Machine: {machine(cpuinfo)}; Python {platform.python_version()}, {platform.system()} {platform.release()}",
        f"- Report written: {when}",
        "",
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in table),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Write the report. Exits 0 whatever the verdicts: the table says what was missed."""
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=Path("bench/out"), help="where the benchmark JSON files are")
    p.add_argument("--output", type=Path, default=Path("docs/benchmarks.md"), help="the Markdown file to write")
    args = p.parse_args(argv)
    text = render(args.results)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
