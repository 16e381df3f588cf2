"""MQTT over TLS: one settings section shared by the edge's publisher and central's consumer.

Separate from ``fleetwire.tls.TlsSettings`` (gRPC and HTTPS) on purpose: the broker is
usually run by someone else, with its own CA (often a public one, so ``ca_file`` may be
left empty to trust the system's store), and client certificates are optional there,
since the broker authenticates fleet members by user name and password. The broker's host
name is always verified against its certificate. The files are read when the settings
are validated, so a wrong path fails at start-up naming the setting."""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["MqttTlsError", "MqttTlsSettings"]


class MqttTlsError(ValueError):
    """MQTT TLS settings or files that cannot be used; the message names the setting."""


class MqttTlsSettings(BaseModel):
    """TLS to the MQTT broker (``…__TLS__*``); off by default."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    enabled: bool = Field(False, description="Connect to the broker over TLS (point the port at its TLS listener).")
    """Connect to the broker over TLS (point the port at its TLS listener, usually 8883)."""
    ca_file: Path | None = Field(
        None, description="PEM bundle of the CA(s) that signed the broker's certificate; empty: the system's store."
    )
    """PEM bundle of the CA(s) that signed the broker's certificate; None: the system's trust store."""
    cert_file: Path | None = Field(
        None, description="PEM client certificate, for a broker that requires one (require_certificate); optional."
    )
    """PEM client certificate, for a broker that requires one (``require_certificate true``); optional."""
    key_file: Path | None = Field(None, description="PEM private key of cert_file (unencrypted; mode 0600).")
    """PEM private key of ``cert_file`` (unencrypted; keep it mode 0600)."""

    @model_validator(mode="after")
    def _usable(self) -> MqttTlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise MqttTlsError("mqtt tls: cert_file and key_file go together (give both or neither)")
        if self.enabled:
            self.ssl_context()  # a bad file fails here, at start-up
        return self

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2+, the broker's certificate and host name verified
        against ``ca_file`` (or the system's store), our certificate shown when given."""
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=_path(self.ca_file, "ca_file"))
        except (OSError, ssl.SSLError) as exc:
            raise MqttTlsError(f"mqtt tls.ca_file: cannot use {self.ca_file}: {_reason(exc)}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert_file is not None and self.key_file is not None:
            try:
                context.load_cert_chain(_file(self.cert_file, "cert_file"), _file(self.key_file, "key_file"))
            except (OSError, ssl.SSLError) as exc:
                raise MqttTlsError(
                    f"mqtt tls.cert_file/key_file: cannot use {self.cert_file} with {self.key_file}: {_reason(exc)}"
                ) from None
        return context


def _path(path: Path | None, field: str) -> str | None:
    return None if path is None else _file(path, field)


def _file(path: Path, field: str) -> str:
    if not path.is_file():
        raise MqttTlsError(f"mqtt tls.{field}: {path} is not a readable file")
    return str(path)


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
