"""Which ONNX Runtime execution providers really work on this host, found out quietly.

``onnxruntime.get_available_providers()`` reports what the wheel was *built* with:
onnxruntime-gpu lists TensorRT and CUDA even on a host without CUDA libraries or a GPU,
and creating a session with them there logs an ``[E:onnxruntime ...] Failed to load
library`` line to stderr (written by ORT's C++ logger straight to fd 2, so Python-level
redirection does not catch it). A CPU-only edge must start with a clean log, so the
probe is two-staged:

1. ``ctypes`` loads ORT's provider library (``libonnxruntime_providers_cuda.so`` next
   to ``onnxruntime/capi``). ``dlopen`` resolves all its dependencies (cuBLAS, cuDNN,
   TensorRT ...) and reports a missing one as an ``OSError``: nothing is printed.
2. Only if the library loads: a probe session on a one-node model, with ORT's default
   logger raised to FATAL (``set_default_logger_severity(4)``) for its duration,
   confirms the provider can actually be created (a device and driver exist).

The result is computed once per process and cached.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

log = logging.getLogger(__name__)

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
#: Accelerated providers probed, best first; CPU always follows them.
_ACCELERATED = (TENSORRT, CUDA)
_LIB_STEMS = {TENSORRT: "onnxruntime_providers_tensorrt", CUDA: "onnxruntime_providers_cuda"}
_SHARED_STEM = "onnxruntime_providers_shared"
#: ORT's default logger severity (WARNING). ORT offers no getter, so this is what the
#: probe restores after raising it.
ORT_DEFAULT_SEVERITY = 2
_FATAL = 4

_lock = threading.Lock()
_probed: tuple[str, ...] | None = None


def _library_path(stem: str) -> Path:
    """Where ORT keeps a provider library (``onnxruntime/capi``)."""
    capi = Path(ort.__file__).parent / "capi"
    return capi / (f"{stem}.dll" if sys.platform == "win32" else f"lib{stem}.so")


def _library_loads(provider: str) -> bool:
    """Whether the provider's library and all its dependencies load; never prints.

    The provider library needs ``Provider_GetHost`` from the shared bridge library,
    which ORT itself loads with ``RTLD_GLOBAL`` first; do the same, or a perfectly good
    CUDA install would fail with "undefined symbol"."""
    path = _library_path(_LIB_STEMS[provider])
    if not path.is_file():
        return False
    mode = getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0)
    try:
        shared = _library_path(_SHARED_STEM)
        if shared.is_file():
            ctypes.CDLL(str(shared), mode=mode)
        ctypes.CDLL(str(path))
    except OSError as exc:
        log.debug("%s unavailable: %s", provider, exc)
        return False
    return True


def _probe_model() -> bytes:
    """A one-node Identity model, serialized: the cheapest thing a session can load."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return bytes(model.SerializeToString())


def _session_accepts(provider: str) -> bool:
    """Whether a session really registers ``provider``, with ORT's logging silenced.

    A provider that fails to initialise is dropped by ORT (falling back to CPU) after
    logging at ERROR/WARNING through the *default* logger, which the session's own
    ``log_severity_level`` does not govern; hence the process-wide severity bump."""
    options = ort.SessionOptions()
    options.log_severity_level = _FATAL
    ort.set_default_logger_severity(_FATAL)
    try:
        session = ort.InferenceSession(_probe_model(), options, providers=[provider, CPU])
        return provider in session.get_providers()
    except Exception as exc:  # any failure means "not usable here"
        log.debug("%s probe session failed: %s", provider, exc)
        return False
    finally:
        ort.set_default_logger_severity(ORT_DEFAULT_SEVERITY)


def _probe() -> tuple[str, ...]:
    """The working providers, best first, CPU last (uncached)."""
    advertised = set(ort.get_available_providers())
    found = [p for p in _ACCELERATED if p in advertised and _library_loads(p) and _session_accepts(p)]
    return (*found, CPU)


def _working() -> tuple[str, ...]:
    """The probe result, computed once per process."""
    global _probed
    with _lock:
        if _probed is None:
            _probed = _probe()
            log.info("execution providers on this host: %s", ", ".join(_probed))
        return _probed


def available_providers(preferred: Sequence[str] | None = None) -> list[str]:
    """The execution providers that really work here, in the order to pass to a session.

    Without ``preferred``: TensorRT, CUDA (each only if it truly loads), then CPU.
    With it: the working ones among ``preferred``, in its order, then CPU, which is
    always present and always last (it is ORT's fallback for unsupported nodes).
    Names ORT does not know at all raise ``ValueError`` (a typo in settings should
    not silently mean "CPU")."""
    working = _working()
    if preferred is None:
        return list(working)
    unknown = [p for p in preferred if p not in ort.get_all_providers()]
    if unknown:
        raise ValueError(f"unknown execution providers: {', '.join(unknown)}")
    chosen = [p for p in dict.fromkeys(preferred) if p != CPU and p in working]
    return [*chosen, CPU]


def _reset_cache() -> None:
    """Forget the probe result (tests only)."""
    global _probed
    with _lock:
        _probed = None
