"""Which recipes a push produces, and which one an edge of unknown hardware gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from central.quantize.cpu import cpu_flags, cpu_kind, reported_flags
from central.quantize.recipes import DEFAULT_RECIPES, DYNAMIC, S8S8_QDQ, U8S8_QDQ, U8S8_QOP, by_preference, candidates

AVX2 = frozenset({"sse4_2", "avx2", "fma"})
VNNI = AVX2 | {"avx512f", "avx512_vnni"}
ARM = frozenset({"fp", "asimd", "asimddp"})


def _names(**kwargs: object) -> list[str]:
    return [r.name for r in candidates(configured=DEFAULT_RECIPES, **kwargs)]  # type: ignore[arg-type]


def test_cnn_gets_three_static_recipes_with_or_without_calibration() -> None:
    expected = [U8S8_QDQ, S8S8_QDQ, U8S8_QOP]
    assert _names(family="cnn", calibrated=True, limit=3, flags=AVX2) == expected
    assert _names(family="cnn", calibrated=False, limit=3, flags=AVX2) == expected  # generated images, never dynamic
    assert _names(family="cnn", calibrated=True, limit=2, flags=AVX2) == expected[:2]


def test_mlp_and_transformer_without_calibration_are_dynamic() -> None:
    assert _names(family="mlp", calibrated=False, limit=3, flags=AVX2) == [DYNAMIC]
    assert _names(family="mlp", calibrated=True, limit=3, flags=AVX2) == [U8S8_QDQ, S8S8_QDQ, DYNAMIC]
    assert _names(family="transformer", calibrated=True, limit=3, flags=AVX2) == [DYNAMIC]


def test_one_candidate_is_the_fastest_for_the_cpu() -> None:
    assert _names(family="mlp", calibrated=True, limit=1, flags=AVX2) == [U8S8_QDQ]
    assert _names(family="mlp", calibrated=True, limit=1, flags=VNNI) == [S8S8_QDQ]
    assert _names(family="cnn", calibrated=True, limit=1, flags=VNNI) == [U8S8_QDQ]  # measured: U8S8 convs win
    assert _names(family="cnn", calibrated=True, limit=1, flags=ARM) == [S8S8_QDQ]


def test_preference_orders_what_passed() -> None:
    passed = [U8S8_QOP, S8S8_QDQ, U8S8_QDQ]
    assert by_preference(passed, AVX2, "cnn") == [U8S8_QDQ, U8S8_QOP, S8S8_QDQ]
    assert by_preference(passed, ARM, "cnn")[0] == S8S8_QDQ
    assert by_preference(["unknown", U8S8_QOP], AVX2, "cnn") == [U8S8_QOP, "unknown"]


@pytest.mark.parametrize(
    ("flags", "kind"), [(AVX2, "x86"), (VNNI, "x86-vnni"), (AVX2 | {"avx_vnni"}, "x86-vnni"), (ARM, "arm-dot")]
)
def test_cpu_kinds(flags: frozenset[str], kind: str) -> None:
    assert cpu_kind(flags) == kind


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni sse\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(info) == frozenset({"fpu", "avx2", "avx512_vnni", "sse"})
    assert reported_flags(cpu_flags(info)) == ["avx2", "avx512_vnni"]
    assert cpu_flags(tmp_path / "absent") == frozenset()
