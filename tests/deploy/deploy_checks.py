"""Helpers of the deploy tests: where deploy/ is, a check that ``MODELFLEET_*`` variables
are real settings (with the files they name, from where a volume would mount them), the
images' own environment, and the deployment's shell scripts run with the project's CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: Where the images and manifests mount certificates, keys and tokens.
CONTAINER_SECRETS = "/run/modelfleet/secrets"


def dockerfile_stages(dockerfile: str) -> list[list[str]]:
    """Instructions per stage of ``deploy/docker/<dockerfile>`` (continuation lines
    joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "docker" / dockerfile).read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        stages[-1].append(line)
    return stages


def image_env(dockerfile: str) -> dict[str, str]:
    """The ``MODELFLEET_*`` variables the image's final stage sets."""
    final = dockerfile_stages(dockerfile)[-1]
    return dict(re.findall(r"(MODELFLEET_\w+)=(\S+)", " ".join(i for i in final if i.startswith("ENV "))))


def run_script(script: Path, bin_dir: Path, env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run a deployment shell script with ``modelfleet`` on PATH as this checkout's CLI
    (this interpreter, this source tree; the shim is written into ``bin_dir``), as it
    runs in an image or on an operator's machine."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    cli = bin_dir / "modelfleet"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m modelfleet "$@"\n')
    cli.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    run_env = {**os.environ, **env, "PATH": path, "PYTHONPATH": str(DEPLOY.parent)}
    done = subprocess.run(["sh", str(script), *args], env=run_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout}\n{done.stderr}"
    return done


def mounted(value: str, mounts: Mapping[str, Path]) -> str:
    """``value`` with a container path under one of ``mounts`` (container prefix → host
    directory) replaced by where that file is on this machine."""
    for prefix, host in mounts.items():
        if value == prefix or value.startswith(prefix.rstrip("/") + "/"):
            return str(host) + value[len(prefix.rstrip("/")) :]
    return value


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assert_settings_apply(
    settings_class: type[BaseSettings], env: Mapping[str, str], mounts: Mapping[str, Path] | None = None
) -> None:
    """Every ``MODELFLEET_*`` variable in ``env`` names a field of ``settings_class`` and
    its value is what the service would run with (pydantic ignores unknown names, so a
    misspelt one would otherwise pass silently). Files under a container path in
    ``mounts`` are read from the host directory it maps to (the settings check
    certificates and token files when they load)."""
    ours = {k: mounted(str(v), mounts or {}) for k, v in env.items() if k.startswith("MODELFLEET_")}
    with _environment(ours):
        settings = settings_class()
    for name, raw in ours.items():
        value: Any = settings
        for part in name.removeprefix("MODELFLEET_").lower().split("__"):
            assert hasattr(value, part), f"{name}: {settings_class.__name__} has no setting {part!r}"
            value = getattr(value, part)
        parsed = json.loads(raw) if isinstance(value, dict) else type(value)(raw)
        assert parsed == value, f"{name}={raw!r} did not take effect: {value!r}"


def assert_secure_broker(conf: str) -> None:
    """Logins, the ACL, TLS with client certificates on every non-loopback listener, and
    ``use_username_as_clientid`` on every listener (a listener option in Mosquitto 2)."""
    lines = [line.strip() for line in conf.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert "allow_anonymous false" in lines and "per_listener_settings false" in lines
    listeners: list[list[str]] = []
    for line in lines:
        if line.startswith("listener "):
            listeners.append([line])
        elif listeners:
            listeners[-1].append(line)
    assert listeners
    for block in listeners:
        assert "use_username_as_clientid true" in block, block[0]
        if not block[0].endswith(" 127.0.0.1"):
            assert "require_certificate true" in block and any(o.startswith("certfile ") for o in block), block[0]
