"""``modelfleet doctor``: what this host offers a modelfleet node, each line ok, warn or
fail with a fix to try. Exit 1 when any line fails.

Providers are the ones that really load (the edge's own probe, not the list the wheel
was built with); GPU library versions come from the libraries themselves (ctypes),
found where the dynamic loader (``ldconfig -p``) or NVIDIA's pip wheels put them."""

from __future__ import annotations

import platform
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

import typer
from pydantic import ValidationError
from rich.text import Text

from fleetwire.exposure import Listener, wide_open
from modelfleet.cli import gpu_libs, output
from modelfleet.cli.client import CentralClient, CliError
from modelfleet.cli.config import CentralOption, ConfigError, JsonOption, TokenOption, load_config

Status = Literal["ok", "warn", "fail"]
_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}
DEFAULT_BROKER = "127.0.0.1:1883"


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    check: str
    status: Status
    detail: str
    fix: str | None = None


def register(app: typer.Typer) -> None:
    """Add ``doctor`` to ``app``."""
    app.command()(doctor)


def check_python() -> Check:
    """The interpreter this CLI runs on (the project needs 3.11+, which installing it enforced)."""
    return Check("python", "ok", f"{platform.python_version()} ({sys.executable})")


def check_onnxruntime() -> list[Check]:
    """The onnxruntime distribution and version, then the providers that really load."""
    from importlib import metadata

    try:
        import onnxruntime as ort
    except Exception as exc:  # a broken install raises anything from ImportError to OSError
        return [Check("onnxruntime", "fail", f"cannot import: {exc}", "pip install onnxruntime (or onnxruntime-gpu)")]
    dists = sorted(
        {
            d.metadata["Name"]
            for d in metadata.distributions()
            if d.metadata["Name"] and "onnxruntime" in d.metadata["Name"].lower()
        }
    )
    lines = [Check("onnxruntime", "ok", f"{ort.__version__} (package {', '.join(dists) or 'unknown'})")]
    return [*lines, check_providers(list(ort.get_available_providers()))]


def check_providers(advertised: list[str]) -> Check:
    """Working providers; a GPU provider the wheel advertises but cannot load is a warning."""
    from edge_node.inference.providers import available_providers

    working = available_providers()
    broken = [p for p in advertised if p not in working and p in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    detail = f"working: {', '.join(working)}"
    if broken:
        fix = "install the CUDA/cuDNN (and TensorRT) versions this onnxruntime-gpu was built for, and a GPU driver"
        return Check("providers", "warn", f"{detail}; advertised but not loading: {', '.join(broken)}", fix)
    return Check("providers", "ok", detail)


def check_gpu_libraries() -> list[Check]:
    """CUDA runtime, cuDNN, TensorRT: versions found, or none (fine on a CPU-only host)."""
    lines = []
    for lib in gpu_libs.LIBRARIES:
        found = gpu_libs.find(lib)
        if found is None:
            lines.append(Check(lib.label, "ok", "not found (not needed for CPU inference)"))
        else:
            lines.append(Check(lib.label, "ok", f"{found.version or 'version unknown'} ({found.path})"))
    return lines


def check_cpu() -> Check:
    """VNNI (AVX512-VNNI / AVX-VNNI) makes INT8 matmuls several times faster on x86."""
    flags = gpu_libs.cpu_flags()
    if flags is None:
        return Check("cpu", "warn", f"{platform.machine()}: /proc/cpuinfo not readable", "run doctor on Linux")
    interesting = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp") if f in flags]
    detail = f"{platform.machine()}, {', '.join(interesting) or 'no SIMD extensions of note'}"
    if {"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"} & flags:
        return Check("cpu", "ok", f"{detail} (fast INT8)")
    fix = "INT8 still works but gains less here; a CPU with VNNI (Cascade Lake+/Alder Lake+/Zen 4) runs it faster"
    return Check("cpu", "warn", f"{detail} (no INT8 dot-product instructions)", fix)


def check_broker(address: str, timeout: float = 2.0) -> Check:
    """A TCP connection to the MQTT broker (heartbeats, failover, events)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return Check("broker", "fail", f"--broker must be host:port, got {address!r}", "pass --broker HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return Check("broker", "ok", f"{address} accepts connections")
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        fix = f"start one (mosquitto -p {port}) or pass --broker HOST:PORT"
        return Check("broker", "fail", f"{address} is unreachable ({reason.lower()})", fix)


def check_central(central: str | None, token: str | None) -> Check:
    """``GET /healthz`` on central's REST API."""
    try:
        config = load_config(central, token)
    except ConfigError as exc:
        return Check("central", "fail", str(exc), "fix the flag, the environment or the config file")
    try:
        with CentralClient(config, timeout=5.0) as client:
            client.health()
    except CliError as exc:
        fix = "start it (modelfleet central) or point at it with --central / MODELFLEET_CENTRAL_URL"
        return Check("central", "fail", exc.message, fix)
    return Check("central", "ok", f"{config.central_url} is healthy")


def check_exposure() -> list[Check]:
    """Whether a central and an edge started here, with this environment's ``MODELFLEET_*``
    settings, would listen beyond loopback without authentication or TLS (what they log at start)."""
    from central.settings import CentralSettings
    from edge_node.settings import EdgeSettings

    return [
        *_exposure("central", lambda: CentralSettings().listeners()),
        *_exposure("edge", lambda: EdgeSettings().listeners()),
    ]


def _exposure(kind: str, listeners_of: Callable[[], list[Listener]]) -> list[Check]:
    """One ok line for ``kind``, or a warning per wide-open listener with the settings that close it
    (``listeners_of`` reads the settings from the environment)."""
    name = f"{kind} exposure"
    try:
        listeners = listeners_of()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        detail = f"cannot read {kind} settings from the environment: {where}: {first.get('msg')}"
        return [Check(name, "warn", detail, "fix the MODELFLEET_* variables")]
    exposures = [e for e in map(wide_open, listeners) if e is not None]
    if not exposures:
        binds = ", ".join(sorted({listener.host for listener in listeners}))
        return [Check(name, "ok", f"binds {binds}: loopback only, or with authentication and TLS")]
    return [Check(name, "warn", f"WIDE OPEN: {e.problem}", e.fix) for e in exposures]


def _print(checks: list[Check]) -> None:
    out = output.console()
    width = max(len(c.check) for c in checks)
    for c in checks:
        line = Text(f"{c.status:<5} ", style=_STYLE[c.status])
        line.append(f"{c.check:<{width}}  {c.detail}")
        if c.fix:
            line.append(f"\n{'':<{width + 8}}fix: {c.fix}", style="dim")
        out.print(line, soft_wrap=True)


@output.reported
def doctor(
    broker: Annotated[str, typer.Option(help="MQTT broker to try, host:port.")] = DEFAULT_BROKER,
    json: JsonOption = False,
    central: CentralOption = None,
    token: TokenOption = None,
) -> None:
    """Check this host: Python, onnxruntime and its providers, GPU libraries, CPU, broker, central,
    and whether a central or edge started with this environment's settings would be wide open."""
    checks = [check_python(), *check_onnxruntime(), *check_gpu_libraries(), check_cpu()]
    checks += [check_broker(broker), check_central(central, token), *check_exposure()]
    if json:
        output.print_json([asdict(c) for c in checks])
    else:
        _print(checks)
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(output.EXIT_FAILURE)
