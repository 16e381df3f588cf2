"""Finding NVIDIA's libraries and asking them their versions, for ``modelfleet doctor``.

A library counts as found when ``dlopen`` loads it (so its own dependencies resolve);
the version comes from the library's own call (``cudaRuntimeGetVersion``,
``cudnnGetVersion``, ``getInferLibVersion``), which is what ONNX Runtime will meet,
not from a file name. Nothing here prints or raises."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def _cuda_runtime(lib: ctypes.CDLL) -> str:
    value = ctypes.c_int()
    if lib.cudaRuntimeGetVersion(ctypes.byref(value)) != 0:
        return ""
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


def _cudnn(lib: ctypes.CDLL) -> str:
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    v = int(lib.cudnnGetVersion())
    major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _tensorrt(lib: ctypes.CDLL) -> str:
    v = int(lib.getInferLibVersion())
    major, rest = (v // 10000, v % 10000) if v >= 100000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


@dataclass(frozen=True)
class Library:
    """One library doctor looks for."""

    label: str
    #: File name stem, e.g. ``libcudart``; any ``.so.N`` of it counts.
    stem: str
    version: Callable[[ctypes.CDLL], str]


@dataclass(frozen=True)
class Found:
    """A library that loads, and the version it reports ('' when it would not say)."""

    path: str
    version: str


LIBRARIES = (
    Library("cuda runtime", "libcudart", _cuda_runtime),
    Library("cudnn", "libcudnn", _cudnn),
    Library("tensorrt", "libnvinfer", _tensorrt),
)


def _ldconfig() -> list[str]:
    """Every library path the dynamic loader knows (``ldconfig -p``); [] without ldconfig."""
    for binary in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            listing = subprocess.run([binary, "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return [line.rpartition("=> ")[2].strip() for line in listing.splitlines() if "=> " in line]
    return []


def _wheel_paths() -> list[str]:
    """Libraries from NVIDIA's pip wheels (``nvidia/*/lib``, ``tensorrt_libs``), which
    onnxruntime-gpu can use without a system-wide CUDA install."""
    found: list[str] = []
    for entry in map(Path, sys.path):
        for pattern in ("nvidia/*/lib/lib*.so*", "tensorrt_libs/lib*.so*"):
            found += [str(p) for p in sorted(entry.glob(pattern))] if entry.is_dir() else []
    return found


def candidates(stem: str, paths: list[str] | None = None) -> list[str]:
    """Paths of ``stem.so`` / ``stem.so.N…``, newest-looking first."""
    pattern = re.compile(rf"/{re.escape(stem)}\.so((?:\.\d+)*)$")
    pool = paths if paths is not None else _ldconfig() + _wheel_paths()
    found = {p: m.group(1) for p in pool if (m := pattern.search(p))}
    return sorted(found, key=lambda p: tuple(int(n) for n in found[p].split(".") if n), reverse=True)


def find(lib: Library, paths: list[str] | None = None) -> Found | None:
    """The first candidate that loads, with its version; None when none does."""
    for path in candidates(lib.stem, paths):
        try:
            handle = ctypes.CDLL(path)
        except OSError:
            continue
        try:
            version = lib.version(handle)
        except (AttributeError, OSError, ValueError):
            version = ""
        return Found(path, version)
    return None


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str] | None:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``); None when unreadable."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()
