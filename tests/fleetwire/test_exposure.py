"""``wide_open``: a listener bound beyond loopback without authentication or TLS is reported
with the settings that close it, and the settings it names really do (they are applied from
the environment, as an operator would, and the listener is no longer open)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from central.settings import CentralSettings
from edge_node.settings import EdgeSettings
from fleetwire.exposure import Listener, is_loopback, wide_open
from support.certs import CertAuthority, LeafFiles

_SETTING = re.compile(r"\b(MODELFLEET_[A-Z_]+)=true\b")


@pytest.fixture
def leaf(tmp_path: Path) -> LeafFiles:
    return CertAuthority(tmp_path / "pki").issue("node")


def _tls_env(leaf: LeafFiles) -> dict[str, str]:
    return {f"MODELFLEET_TLS__{k.upper()}": str(v) for k, v in leaf.tls().items() if k != "enabled"}


def _listener(host: str, authenticated: bool = False, encrypted: bool = False) -> Listener:
    return Listener("central REST API", host, 8080, authenticated, encrypted, auth_fix="MODELFLEET_AUTH__ENABLED=true")


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]", "::ffff:127.0.0.1"]
)
def test_loopback_binds_are_never_wide_open(host: str) -> None:
    assert is_loopback(host)
    assert wide_open(_listener(host)) is None


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "[::]", "", "10.0.0.5", "192.168.1.20", "::ffff:10.0.0.1", "edge-7.lan"]
)
@pytest.mark.parametrize(
    ("authenticated", "encrypted", "missing"),
    [
        (False, False, ("authentication", "TLS")),
        (True, False, ("TLS",)),
        (False, True, ("authentication",)),
        (True, True, ()),
    ],
)
def test_binds_beyond_loopback_are_reported_when_a_guard_is_missing(
    host: str, authenticated: bool, encrypted: bool, missing: tuple[str, ...]
) -> None:
    assert not is_loopback(host)
    exposure = wide_open(_listener(host, authenticated, encrypted))
    if not missing:
        assert exposure is None
        return
    assert exposure is not None and exposure.missing == missing
    line = str(exposure)
    assert line.startswith(f"WIDE OPEN: central REST API listens on {host}:8080") and "\n" not in line
    assert ("MODELFLEET_AUTH__ENABLED=true" in line) is (not authenticated)
    assert ("MODELFLEET_TLS__ENABLED=true" in line) is (not encrypted)


CENTRAL_CASES = {
    "defaults on 0.0.0.0": (
        {},
        {"central REST API": ("authentication", "TLS"), "central gRPC Registry": ("authentication", "TLS")},
    ),
    "tokens without TLS": (
        {"MODELFLEET_AUTH__ENABLED": "true", "MODELFLEET_AUTH__NODES_REQUIRED": "true"},
        {"central REST API": ("TLS",), "central gRPC Registry": ("TLS",)},
    ),
    "TLS without tokens": (
        {"MODELFLEET_TLS__ENABLED": "true"},
        {"central REST API": ("authentication",), "central gRPC Registry": ("authentication",)},
    ),
    "TLS with client certificates on gRPC": (
        {"MODELFLEET_TLS__ENABLED": "true", "MODELFLEET_TLS__REQUIRE_CLIENT_CERT": "true"},
        {"central REST API": ("authentication",)},
    ),
    "all on": (
        {
            "MODELFLEET_TLS__ENABLED": "true",
            "MODELFLEET_AUTH__ENABLED": "true",
            "MODELFLEET_AUTH__NODES_REQUIRED": "true",
        },
        {},
    ),
}
EDGE_CASES = {
    "defaults on 0.0.0.0": (
        {},
        {"edge e1 HTTP API": ("authentication", "TLS"), "edge e1 Peer gRPC": ("authentication", "TLS")},
    ),
    "TLS": ({"MODELFLEET_TLS__ENABLED": "true"}, {"edge e1 HTTP API": ("authentication",)}),
    "TLS with client certificates": (
        {"MODELFLEET_TLS__ENABLED": "true", "MODELFLEET_TLS__REQUIRE_CLIENT_CERT": "true"},
        {},
    ),
}


#: The gRPC inference ports are guarded as the HTTP APIs beside them (same host, TLS and auth).
_INFERENCE_BESIDE = {"central REST API": "central gRPC inference gateway", "edge e1 HTTP API": "edge e1 gRPC inference"}


def _with_inference(expected: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    return expected | {_INFERENCE_BESIDE[k]: v for k, v in expected.items() if k in _INFERENCE_BESIDE}


def _open(settings: CentralSettings | EdgeSettings) -> dict[str, tuple[str, ...]]:
    return {e.listener.name: e.missing for e in map(wide_open, settings.listeners()) if e is not None}


def _load(kind: str, tmp_path: Path) -> CentralSettings | EdgeSettings:
    if kind == "central":
        return CentralSettings(data_dir=tmp_path / "central")
    return EdgeSettings(node_id="e1", data_dir=tmp_path / "edge")


@pytest.mark.parametrize(
    ("kind", "env", "expected"),
    [pytest.param("central", env, open_, id=f"central: {case}") for case, (env, open_) in CENTRAL_CASES.items()]
    + [pytest.param("edge", env, open_, id=f"edge: {case}") for case, (env, open_) in EDGE_CASES.items()],
)
def test_the_settings_a_warning_names_close_what_it_reports(
    kind: str,
    env: dict[str, str],
    expected: dict[str, tuple[str, ...]],
    leaf: LeafFiles,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {"MODELFLEET_HTTP_HOST": "0.0.0.0", "MODELFLEET_GRPC_HOST": "0.0.0.0", **env}.items():
        monkeypatch.setenv(name, value)
    if env.get("MODELFLEET_TLS__ENABLED"):
        for name, value in _tls_env(leaf).items():
            monkeypatch.setenv(name, value)
    settings = _load(kind, tmp_path)
    assert _open(settings) == _with_inference(expected)

    # What an operator does with the lines: set every setting they name, with the TLS files.
    named = {
        s
        for e in map(wide_open, settings.listeners())
        if e is not None
        for fix in e.fixes
        for s in _SETTING.findall(fix)
    }
    for name in named:
        monkeypatch.setenv(name, "true")
    if "MODELFLEET_TLS__ENABLED" in named:
        for name, value in _tls_env(leaf).items():
            monkeypatch.setenv(name, value)
    assert _open(_load(kind, tmp_path)) == {}

    # And loopback needs none of it.
    for name in (*named, *env):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODELFLEET_HTTP_HOST", "127.0.0.1")
    monkeypatch.setenv("MODELFLEET_GRPC_HOST", "::1")
    assert _open(_load(kind, tmp_path)) == {}
