"""The hardware class of this node: what decides which INT8 artifact runs fastest here.

Two nodes of one class run a model at the same relative speeds, so a verdict timed on
one (``edge_node.inference.artifact_timer``) holds for the other. What matters for INT8 on a
CPU is the instruction set (VNNI and AMX multiply int8 directly; without them U8S8 with
``reduce_range`` beats S8S8, and plain AVX2 may lose to FP32 altogether), the number of
cores a session may use, and the execution provider. The class is a short stable string,
``<machine>/<isa>/<cores>c/<provider>``, e.g. ``x86_64/avx2/2c/cpu`` or
``x86_64/avx2+avx512f+avx512_vnni/8c/cpu``.

The flags come from ``/proc/cpuinfo`` unless the ``inference.cpu_flags`` setting names
them (``MODELFLEET_INFERENCE__CPU_FLAGS="avx2 avx512_vnni"``): tests simulate another
class with it, and an operator can pin a class on hosts whose cpuinfo is misleading
(some hypervisors hide flags the guest can use)."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INT8_FLAGS", "HardwareClass", "detect_hardware", "read_cpu_flags"]

#: The CPU flags that change which INT8 recipe wins, in the order the class names them.
#: x86: AVX2 (the floor), AVX-512, the VNNI forms (int8 dot products), AMX tiles;
#: ARM: NEON (``asimd``), the dot-product extension (``asimddp``) and int8 matrix multiply.
INT8_FLAGS: tuple[str, ...] = (
    "avx2",
    "avx512f",
    "avx_vnni",
    "avx512_vnni",
    "amx_int8",
    "neon",
    "dotprod",
    "i8mm",
)
#: cpuinfo spells some ARM features differently from the names used in the class.
_ALIASES = {"asimd": "neon", "asimddp": "dotprod"}
#: ONNX Runtime provider → the short tag in the class.
_PROVIDER_TAGS = {"TensorrtExecutionProvider": "trt", "CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}
_SPLIT = re.compile(r"[\s,]+")


def read_cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The raw flag list of the first CPU (x86 ``flags``, ARM ``Features``), ``""`` if unknown."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return value
    return ""


def _int8_flags(raw: str) -> tuple[str, ...]:
    present = {_ALIASES.get(f, f) for f in _SPLIT.split(raw.lower()) if f}
    return tuple(f for f in INT8_FLAGS if f in present)


@dataclass(frozen=True)
class HardwareClass:
    """Machine, INT8-relevant ISA flags, cores a session uses and execution provider."""

    machine: str
    flags: tuple[str, ...]
    cores: int
    provider: str

    def __str__(self) -> str:
        isa = "+".join(self.flags) or "base"
        return f"{self.machine}/{isa}/{self.cores}c/{self.provider}"


def detect_hardware(providers: Sequence[str], cpu_flags: str | None = None, intra_op_threads: int = 0) -> HardwareClass:
    """This node's class. ``cpu_flags`` replaces what ``/proc/cpuinfo`` says; the cores are
    those this process may run on (``sched_getaffinity``: a container's CPU set, not the
    host's), capped by ``intra_op_threads`` when a session is told to use fewer."""
    machine = platform.machine().lower() or "unknown"
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    raw = cpu_flags if cpu_flags is not None else read_cpu_flags()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if intra_op_threads > 0:
        cores = min(cores, intra_op_threads)
    first = providers[0] if providers else "CPUExecutionProvider"
    provider = _PROVIDER_TAGS.get(first, first.removesuffix("ExecutionProvider").lower())
    return HardwareClass(machine, _int8_flags(raw), max(1, cores), provider)
