"""TLS settings and helpers: off by default, and every unusable configuration stops the
process at settings validation with one message naming the setting (never a traceback
from inside gRPC or a handshake that fails later)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from pydantic import ValidationError

from central.settings import CentralSettings
from edge_node.settings import EdgeSettings
from fleetwire.tls import (
    TlsError,
    TlsSettings,
    client_ssl_context,
    grpc_channel_credentials,
    grpc_server_credentials,
    uvicorn_ssl_kwargs,
)
from support.certs import CertAuthority, LeafFiles


@pytest.fixture
def ca(tmp_path: Path) -> CertAuthority:
    return CertAuthority(tmp_path / "pki")


@pytest.fixture
def leaf(ca: CertAuthority) -> LeafFiles:
    return ca.issue("node")


def _error(**section: object) -> str:
    with pytest.raises(ValidationError) as info:
        TlsSettings.model_validate(section)
    return str(info.value)


def test_tls_is_off_by_default_everywhere(tmp_path: Path) -> None:
    central = CentralSettings(data_dir=tmp_path)
    edge = EdgeSettings(node_id="e1", data_dir=tmp_path)
    assert not central.tls.enabled and not edge.tls.enabled
    assert central.tls.edge_scheme == "http"


@pytest.mark.parametrize("missing", ["cert_file", "key_file", "ca_file"])
def test_enabled_without_a_file_names_the_missing_setting(leaf: LeafFiles, missing: str) -> None:
    section = leaf.tls()
    del section[missing]
    assert f"tls.{missing} is required when tls.enabled is true" in _error(**section)


def test_enabling_tls_from_the_environment_without_files_fails_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODELFLEET_TLS__ENABLED", "true")
    with pytest.raises(ValidationError, match=r"tls\.cert_file is required"):
        EdgeSettings(node_id="e1", data_dir=tmp_path)
    with pytest.raises(ValidationError, match=r"tls\.cert_file is required"):
        CentralSettings(data_dir=tmp_path)


def test_an_unreadable_file_is_named(leaf: LeafFiles, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    message = _error(**leaf.tls(ca_file=missing))
    assert f"tls.ca_file: cannot read {missing}" in message


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("cert_file", "tls.cert_file: {path} holds no valid PEM certificate"),
        ("ca_file", "tls.ca_file: {path} holds no valid PEM certificate"),
        ("key_file", "tls.key_file: {path} holds no valid PEM private key"),
    ],
)
def test_a_garbled_file_is_named(leaf: LeafFiles, tmp_path: Path, field: str, expected: str) -> None:
    garbled = tmp_path / "garbled.pem"
    garbled.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    assert expected.format(path=garbled) in _error(**leaf.tls(**{field: garbled}))


def test_a_key_of_another_certificate_is_refused(ca: CertAuthority, leaf: LeafFiles) -> None:
    other = ca.issue("other")
    message = _error(**leaf.tls(key_file=other.key_file))
    assert f"tls.key_file: {other.key_file} is not the key of the certificate in {leaf.cert_file}" in message


def test_an_encrypted_key_is_refused_with_a_clear_message(leaf: LeafFiles, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key(leaf.key_file.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted-key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    assert "is encrypted; give an unencrypted PEM key" in _error(**leaf.tls(key_file=encrypted))


def test_an_expired_certificate_is_refused_at_start_up(ca: CertAuthority) -> None:
    expired = ca.issue("old", expired=True)
    assert f"tls.cert_file: the certificate in {expired.cert_file} expired on" in _error(**expired.tls())


def test_edge_https_without_tls_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"tls\.edge_https needs tls\.enabled"):
        CentralSettings(data_dir=tmp_path, tls={"edge_https": True})


def test_central_with_tls_reaches_edges_over_https_unless_told_otherwise(tmp_path: Path, leaf: LeafFiles) -> None:
    assert CentralSettings(data_dir=tmp_path, tls=leaf.tls()).tls.edge_scheme == "https"
    assert CentralSettings(data_dir=tmp_path, tls=leaf.tls(edge_https=False)).tls.edge_scheme == "http"


def test_helpers_build_credentials_from_checked_material(leaf: LeafFiles) -> None:
    material = TlsSettings.model_validate(leaf.tls()).material()
    assert material.ca_certs == leaf.ca_file.read_bytes()
    assert grpc_server_credentials(material, require_client_cert=True) is not None
    assert grpc_channel_credentials(material) is not None
    context = client_ssl_context(material)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert uvicorn_ssl_kwargs(material, require_client_cert=True)["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert uvicorn_ssl_kwargs(material, require_client_cert=False)["ssl_cert_reqs"] == ssl.CERT_NONE


def test_material_of_a_disabled_section_still_says_what_is_missing() -> None:
    with pytest.raises(TlsError, match=r"tls\.cert_file is required"):
        TlsSettings().material()
