"""Which INT8 recipe runs fastest on a CPU, from its ISA flags.

Edges time the candidates on their own CPU (the manifest carries every artifact that
passed the guard); this table only picks the default that an edge of unknown
hardware serves, using central's own flags, or the flags an operator names in the
settings when central's CPU is not the fleet's.

What the order rests on, measured with ONNX Runtime 1.31, 2 threads, ORT_ENABLE_ALL:

* ResNet-18 body at 3x64x64 on an AVX-512 VNNI CPU: U8S8 QDQ per-channel
  ``reduce_range`` 2.2x (batch 1) / 3.1x (batch 8) FP32's speed, QOperator U8S8
  2.1x / 3.1x, S8S8 QDQ only 1.1x / 1.3x: MLAS's x86 kernels multiply unsigned by
  signed bytes (``vpmaddubsw``, VNNI's ``vpdpbusd``), so U8S8 is the native form
  with or without VNNI. Issue 12 measured the same order on AVX2 without VNNI
  (U8S8 1.86x/1.73x, S8S8 0.73-0.91x). ``reduce_range`` (7-bit weights) avoids the
  ``vpmaddubsw`` saturation of AVX2 and costs nothing measurable with VNNI.
* MLPs (width 1024) on the VNNI CPU: S8S8 QDQ 8.8x at batch 1 against U8S8's
  6.1x, U8S8 ahead from batch 8 on (5.5x vs 5.3x, 4.1x vs 3.6x at 32): S8S8 first
  where VNNI makes signed activations cheap, U8S8 first elsewhere.
* ARM with the dot-product extension (``asimddp``, ``i8mm``) multiplies signed by
  signed bytes natively (``sdot``): S8S8 first."""

from __future__ import annotations

import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"})
ARM_DOT_FLAGS = frozenset({"asimddp", "i8mm"})
#: The flags worth reporting (central's report, the benchmark).
INTERESTING = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The ISA flags of the first CPU (x86 ``flags``, ARM ``Features``); empty if unreadable."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_kind(flags: frozenset[str]) -> str:
    """``x86-vnni``, ``x86``, ``arm-dot`` or ``arm``: the classes the table tells apart."""
    if flags & ARM_DOT_FLAGS:
        return "arm-dot"
    if flags & VNNI_FLAGS:
        return "x86-vnni"
    is_arm = "asimd" in flags or platform.machine().lower() in ("aarch64", "arm64")
    return "arm" if is_arm and "avx2" not in flags else "x86"


def reported_flags(flags: frozenset[str]) -> list[str]:
    """The flags that matter for INT8, in a fixed order, for reports."""
    return [f for f in INTERESTING if f in flags]
