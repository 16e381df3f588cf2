"""The benchmark report turns the benches' JSON into one table: figures, targets,
verdicts and baselines read from the files, a "not run" row for a missing one."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from bench.report import BENCHES, main, render

_CPUINFO = (
    "processor\t: 0\nmodel name\t: Test CPU 9000 @ 3.0GHz\n\nprocessor\t: 1\nmodel name\t: Test CPU 9000 @ 3.0GHz\n"
)


def _table(text: str) -> dict[tuple[str, str], list[str]]:
    """(benchmark, figure) → the row's cells."""
    out = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| benchmark") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[(cells[0], cells[1])] = cells
    return out


def _write(results: Path, name: str, doc: dict[str, object]) -> None:
    (results / f"{name}.json").write_text(json.dumps(doc))


def test_report_reads_figures_targets_verdicts_and_baselines(tmp_path: Path) -> None:
    results = tmp_path / "out"
    results.mkdir()
    _write(results, "placement", {
        "worst_max_over_mean": 1.2, "worst_unbounded_max_over_mean": 1.9, "worst_moved_over_ideal": 1.31,
        "worst_moved_over_ideal_max": 1.5, "targets": {"max_over_mean": 1.25, "moved_over_ideal": 1.2},
        "met": {"max_over_mean": True, "moved_over_ideal": False},
    })  # fmt: skip
    _write(results, "warm_start", {
        "ratio": None, "cold_ready_s": 3.0, "warm_ready_s": None, "targets": {"ratio": 0.2}, "met": {"ratio": False},
    })  # fmt: skip
    _write(results, "delta", {
        "delta_ratio": 0.05, "fixed_chunk_delta_ratio": 0.8, "shifted_fixed_chunk_delta_ratio": 1.0,
        "shifted_cdc_delta_ratio": 0.02, "new_figure": 7, "targets": {"delta_ratio": 0.15,
        "new_figure": 10}, "met": {"delta_ratio": True, "new_figure": True, "file_verified": True},
    })  # fmt: skip
    (results / "serving.json").write_text("{not json")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(_CPUINFO)

    text = render(results, cpuinfo=cpuinfo, now=datetime(2030, 1, 2, 3, 4, tzinfo=UTC))
    assert "Test CPU 9000 @ 3.0GHz, 2 logical CPUs" in text and "2030-01-02 03:04 UTC" in text
    assert sum(line.startswith("| benchmark") for line in text.splitlines()) == 1  # one table
    rows = _table(text)
    mom = rows[("placement", "most chunks on one node / mean (bounded load)")]
    assert mom[2:6] == ["1.2", "≤ 1.25", "met", "unbounded consistent hashing: 1.900"]
    moved = rows[("placement", "chunks moved when a node leaves / ideal 1/N")]
    assert moved[2:5] == ["1.31", "≤ 1.2", "**missed**"]
    warm = rows[("warm_start", "warm restart to ready / cold start")]
    assert warm[2:6] == ["—", "≤ 0.2", "**missed**", "—"]  # a null figure shows as a dash, not a crash
    assert rows[("delta", "bytes fetched for a new version / model size")][5] == (
        "fixed 1 MiB blocks: 0.8000; after a header shift: fixed blocks 1.0000, CDC 0.0200"
    )
    assert rows[("delta", "new_figure")][2:5] == ["7", "10", "met"]  # a target the report does not know yet
    assert rows[("delta", "file verified")][2:5] == ["yes", "yes", "met"]
    assert rows[("serving", "unreadable: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)")]
    for bench in set(BENCHES) - {"placement", "warm_start", "delta", "serving"}:
        assert rows[(bench, "not run")]
    assert all(cells[6].endswith("UTC") for (b, f), cells in rows.items() if b == "placement")


def test_main_writes_the_markdown_file(tmp_path: Path) -> None:
    results = tmp_path / "out"
    results.mkdir()
    _write(results, "failover", {
        "kill_detect_s": 0.4, "freeze_detect_s": 3.1, "gateway_errors": 0, "gateway_requests": 900,
        "heartbeat_interval_s": 1.0, "freeze_suspect_s": 2.1,
        "targets": {"kill_detect_s": 1.0, "freeze_detect_s": 3.5, "gateway_errors": 0},
        "met": {"kill_detect_s": True, "freeze_detect_s": True, "gateway_errors": True, "all": True},
    })  # fmt: skip
    output = tmp_path / "docs" / "benchmarks.md"
    assert main(["--results", str(results), "--output", str(output)]) == 0
    rows = _table(output.read_text())
    assert rows[("failover", "gateway errors through the failures")][2:6] == ["0", "≤ 0", "met", "900 requests sent"]
    assert rows[("failover", "killed edge marked dead (s)")][2:4] == ["0.4", "≤ 1"]
    assert not any(f == "all" for _, f in rows)  # the summary flag is not a figure


def test_the_warm_start_size_figure_shows_the_rehash_baseline_beside_it(tmp_path: Path) -> None:
    results = tmp_path / "out"
    results.mkdir()
    _write(results, "warm_start", {
        "big_mb": 2048, "big_over_small": 1.1, "big_over_small_rehash": 4.5, "big_warm_ready_s": 1.0,
        "small_warm_ready_s": 0.9, "big_warm_rehash_ready_s": 4.0, "big_warm_bytes_rehashed": 0,
        "big_warm_rehash_bytes_rehashed": 2147483876, "targets": {"big_over_small": 1.5},
        "met": {"big_over_small": True},
    })  # fmt: skip
    row = _table(render(results))[("warm_start", "warm restart to ready: big model / digits model")]
    assert row[2:6] == [
        "1.1", "≤ 1.5", "met",
        "big model 2048 MiB: 1.00 s (0 B re-hashed), digits 0.90 s; re-hashing every start (before): 4.50"
        " (4.00 s, 2,147,483,876 B)",
    ]  # fmt: skip
