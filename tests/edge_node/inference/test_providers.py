"""available_providers: what really loads here, probed once and without a sound."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edge_node.inference import providers
from edge_node.inference.providers import CPU, CUDA, available_providers

REPO = Path(__file__).resolve().parents[3]
CUDA_LOADS = providers._library_loads(CUDA)


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; its fd 2 is a pipe, so anything ORT's C++
    logger writes there (which Python-level redirection would miss) is captured."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.mark.skipif(CUDA_LOADS, reason="this host has working CUDA libraries")
def test_cpu_only_host_gets_only_cpu() -> None:
    assert available_providers() == [CPU]


def test_cpu_is_always_last_and_present() -> None:
    found = available_providers()
    assert found[-1] == CPU
    assert found.count(CPU) == 1


def test_probe_is_cached() -> None:
    first = available_providers()
    assert available_providers() == first
    assert providers._probed is not None


def test_preferred_filters_and_orders() -> None:
    assert available_providers([CPU]) == [CPU]
    assert available_providers([CPU, CUDA])[-1] == CPU
    if not CUDA_LOADS:
        assert available_providers([CUDA]) == [CPU]


def test_unknown_provider_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="NoSuchExecutionProvider"):
        available_providers(["NoSuchExecutionProvider"])


def test_probe_writes_nothing_to_stderr() -> None:
    """Both stages, including the probe session with CUDA requested, stay silent."""
    child = run_child(
        """
        from edge_node.inference import providers
        print(providers.available_providers())
        print(providers._session_accepts("CUDAExecutionProvider"))
        print(providers._session_accepts("TensorrtExecutionProvider"))
        """
    )
    assert child.returncode == 0, child.stderr
    assert child.stderr == ""
    assert "CPUExecutionProvider" in child.stdout


@pytest.mark.skipif(CUDA_LOADS, reason="this host has working CUDA libraries")
def test_naive_cuda_session_is_noisy_which_is_why_we_probe() -> None:
    """The control: the capture above would have seen ORT's error line."""
    child = run_child(
        """
        import onnxruntime as ort
        from edge_node.inference.providers import _probe_model
        ort.InferenceSession(_probe_model(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        """
    )
    assert child.returncode == 0, child.stderr
    assert "Failed to load library" in child.stderr or "CUDAExecutionProvider" in child.stderr


def test_logger_severity_is_restored_after_probe() -> None:
    """After the probe, ORT logs warnings again (severity back to WARNING)."""
    child = run_child(
        """
        import onnxruntime as ort
        from edge_node.inference import providers
        providers._session_accepts("CUDAExecutionProvider")
        ort.InferenceSession(providers._probe_model(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        """
    )
    assert child.returncode == 0
    if not CUDA_LOADS:
        assert child.stderr != ""
