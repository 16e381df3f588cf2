"""Central says so, loudly and in one line per listener, when it starts listening beyond
loopback without authentication or TLS, naming the settings that close it; on loopback, or
with tokens and TLS, it says nothing."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from central.server import CentralServer
from support.certs import CertAuthority
from support.fleet import central_settings


async def _start_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture, **overrides: Any) -> list[str]:
    caplog.set_level(logging.WARNING, logger="central.server")
    server = CentralServer(central_settings(tmp_path / "central", **overrides))
    await server.start()
    try:
        return [r.getMessage() for r in caplog.records if r.name == "central.server" and r.levelno == logging.WARNING]
    finally:
        await server.stop()


async def test_central_on_every_address_without_auth_or_tls_warns_once_per_listener(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rest, inference, grpc_ = await _start_logs(tmp_path, caplog, http_host="0.0.0.0", grpc_host="0.0.0.0")
    assert rest.startswith("WIDE OPEN: central REST API listens on 0.0.0.0:") and "\n" not in rest
    assert "without authentication and without TLS" in rest
    assert "MODELFLEET_AUTH__ENABLED=true" in rest and "MODELFLEET_TLS__ENABLED=true" in rest
    # the gateway's gRPC inference port beside REST, guarded as REST is (open by design, as /v2)
    assert inference.startswith("WIDE OPEN: central gRPC inference gateway listens on 0.0.0.0:")
    assert "MODELFLEET_TLS__ENABLED=true" in inference
    assert grpc_.startswith("WIDE OPEN: central gRPC Registry listens on 0.0.0.0:")
    assert "MODELFLEET_AUTH__NODES_REQUIRED=true" in grpc_ and "MODELFLEET_TLS__CERT_FILE" in grpc_


async def test_central_with_tokens_but_no_tls_warns_that_tokens_travel_in_clear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    auth = {"enabled": True, "nodes_required": True}
    warnings = await _start_logs(tmp_path, caplog, http_host="0.0.0.0", grpc_host="127.0.0.1", auth=auth)
    assert len(warnings) == 2 and "central REST API" in warnings[0], warnings
    assert "central gRPC inference gateway" in warnings[1], warnings
    for warning in warnings:
        assert "without TLS" in warning and "MODELFLEET_AUTH__" not in warning


@pytest.mark.parametrize("hardened", [False, True], ids=["loopback", "tokens and TLS on 0.0.0.0"])
async def test_central_on_loopback_or_hardened_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, hardened: bool
) -> None:
    overrides: dict[str, Any] = {}
    if hardened:
        leaf = CertAuthority(tmp_path / "pki").issue("central")
        auth = {"enabled": True, "nodes_required": True}
        overrides = {"http_host": "0.0.0.0", "grpc_host": "0.0.0.0", "auth": auth, "tls": leaf.tls()}
    assert await _start_logs(tmp_path, caplog, **overrides) == []
