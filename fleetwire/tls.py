"""TLS on the fleet's connections: one settings model and the helpers that turn it into
gRPC credentials, an ``ssl.SSLContext`` for HTTP clients and uvicorn's TLS arguments.

Every process has one certificate (``cert_file`` + ``key_file``) that it shows as a
server and, on mutual TLS, as a client, and one CA bundle (``ca_file``, the fleet's CA)
that it trusts for the other side. So certificates should carry both the serverAuth and
clientAuth extended key usages (or none), and subject alternative names for every host
or IP address others dial (an edge's ``advertise_host``, central's address as edges
configure it): host names are always verified, there is no override.

The files are read and checked when the settings are validated, so a missing, unreadable
or garbled file, a key that does not belong to the certificate or an expired certificate
stops the process at start-up with one line naming the setting, not a handshake failure
deep in gRPC later. Off by default."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from cryptography.exceptions import UnsupportedAlgorithm
from pydantic import BaseModel, Field, model_validator

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

__all__ = [
    "HTTP_DRAIN_S",
    "TlsError",
    "TlsMaterial",
    "TlsSettings",
    "client_ssl_context",
    "grpc_channel_credentials",
    "grpc_idle_options",
    "grpc_server_credentials",
    "uvicorn_ssl_kwargs",
    "wait_http_stopped",
]

#: How long a closing HTTPS connection may wait for the client's close_notify before it is
#: aborted. asyncio waits up to 30 s for it (``ssl_shutdown_timeout``) and uvicorn waits for
#: every connection, while an idle pooled client (central's gateway: httpx) does not read
#: its socket to answer: an edge behind a gateway took 30 s to stop.
TLS_CLOSE_GRACE_S = 0.5
#: How long requests in flight may still run once an HTTP server is told to stop; then uvicorn
#: cancels them (its ``timeout_graceful_shutdown``), so a request that never ends (a stream
#: whose client went quiet) cannot hold a stop, and the process, for ever.
HTTP_DRAIN_S = 10


#: Longest a gRPC server waits for a new connection's HTTP/2 (and TLS) handshake.
GRPC_HANDSHAKE_TIMEOUT_S = 10


def grpc_idle_options(idle_timeout_s: float) -> list[tuple[str, int]]:
    """gRPC server options that close what holds a connection for nothing: a connection
    with no call open for ``idle_timeout_s`` (GOAWAY; a client reconnects on its next call),
    one still in its handshake after ``GRPC_HANDSHAKE_TIMEOUT_S``, and one whose client
    stops answering keep-alive pings. Long calls (an edge's desired-state watch) keep
    theirs: a connection with a call open is not idle."""
    idle_ms = max(1, int(idle_timeout_s * 1000))
    return [
        ("grpc.max_connection_idle_ms", idle_ms),
        ("grpc.server_handshake_timeout_ms", min(GRPC_HANDSHAKE_TIMEOUT_S * 1000, idle_ms)),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
    ]


class TlsError(ValueError):
    """TLS settings or files that cannot be used; the message names the setting."""


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of one process's certificate chain, its key and the trusted CAs,
    read and checked once."""

    cert_file: Path
    key_file: Path
    ca_file: Path
    cert_chain: bytes
    private_key: bytes
    ca_certs: bytes


class TlsSettings(BaseModel):
    """TLS for this process's servers and the connections it opens to other fleet members."""

    enabled: bool = Field(False, description="Serve and connect with TLS; off: plaintext, as before.")
    cert_file: Path | None = Field(
        None, description="PEM certificate (chain) this process shows as server and as client; needed when enabled."
    )
    key_file: Path | None = Field(
        None, description="PEM private key of cert_file (unencrypted; keep it mode 0600); needed when enabled."
    )
    ca_file: Path | None = Field(
        None, description="PEM bundle of the CA(s) trusted for the other side (the fleet's CA); needed when enabled."
    )

    @model_validator(mode="after")
    def _usable(self) -> TlsSettings:
        if self.enabled:
            self.material()
        return self

    def material(self) -> TlsMaterial:
        """Read and check the three files; ``TlsError`` naming the setting when one is
        missing, unreadable, not PEM, mismatched or expired."""
        cert_file = _required(self.cert_file, "cert_file")
        key_file = _required(self.key_file, "key_file")
        ca_file = _required(self.ca_file, "ca_file")
        cert_chain = _read(cert_file, "cert_file")
        private_key = _read(key_file, "key_file")
        ca_certs = _read(ca_file, "ca_file")
        certs = _certificates(cert_chain, cert_file, "cert_file")
        _certificates(ca_certs, ca_file, "ca_file")
        key = _private_key(private_key, key_file)
        _check_pair(certs[0], key, cert_file, key_file)
        _check_validity(certs[0], cert_file)
        return TlsMaterial(cert_file, key_file, ca_file, cert_chain, private_key, ca_certs)


def _required(path: Path | None, field: str) -> Path:
    if path is None:
        raise TlsError(f"tls.{field} is required when tls.enabled is true")
    return path


def _read(path: Path, field: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsError(f"tls.{field}: cannot read {path}: {exc.strerror or exc}") from None


def _certificates(data: bytes, path: Path, field: str) -> list[x509.Certificate]:
    # x509 is imported here, not at module level: it is most of cryptography's import
    # time, and every edge imports this module whether TLS is on or not.
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise TlsError(f"tls.{field}: {path} holds no valid PEM certificate") from None
    return certs


def _private_key(data: bytes, path: Path) -> PrivateKeyTypes:
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError:  # cryptography: "Password was not given but private key is encrypted"
        raise TlsError(f"tls.key_file: {path} is encrypted; give an unencrypted PEM key") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise TlsError(f"tls.key_file: {path} holds no valid PEM private key ({exc})") from None


def _public_der(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def _check_pair(cert: x509.Certificate, key: PrivateKeyTypes, cert_file: Path, key_file: Path) -> None:
    if _public_der(cert.public_key()) != _public_der(key.public_key()):
        raise TlsError(f"tls.key_file: {key_file} is not the key of the certificate in {cert_file}")


def _check_validity(cert: x509.Certificate, path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    if cert.not_valid_after_utc < now:
        raise TlsError(f"tls.cert_file: the certificate in {path} expired on {cert.not_valid_after_utc:%Y-%m-%d}")


def grpc_server_credentials(material: TlsMaterial, *, require_client_cert: bool) -> grpc.ServerCredentials:
    """Credentials for ``add_secure_port``; with ``require_client_cert`` a client must show a
    certificate signed by the CA in ``ca_file`` or its handshake fails."""
    return grpc.ssl_server_credentials(
        [(material.private_key, material.cert_chain)],
        root_certificates=material.ca_certs,
        require_client_auth=require_client_cert,
    )


def grpc_channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    """Credentials for ``secure_channel``: trust only ``ca_file`` and show our certificate
    when the server asks for one (mutual TLS)."""
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca_certs, private_key=material.private_key, certificate_chain=material.cert_chain
    )


def client_ssl_context(material: TlsMaterial) -> ssl.SSLContext:
    """An HTTPS client context (for httpx): verifies the server against ``ca_file`` and its
    host name, and shows our certificate when the server asks for one."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=material.ca_certs.decode("latin-1"))
    context.load_cert_chain(str(material.cert_file), str(material.key_file))
    return context


def uvicorn_ssl_kwargs(material: TlsMaterial, *, require_client_cert: bool) -> dict[str, Any]:
    """``uvicorn.Config`` arguments for HTTPS; with ``require_client_cert`` a client must
    show a certificate signed by the CA in ``ca_file``."""
    return {
        "ssl_certfile": str(material.cert_file),
        "ssl_keyfile": str(material.key_file),
        "ssl_ca_certs": str(material.ca_file),
        "ssl_cert_reqs": int(ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_NONE),
    }


async def wait_http_stopped(server: Any, task: asyncio.Task[None], grace_s: float = TLS_CLOSE_GRACE_S) -> None:
    """Wait for a ``uvicorn.Server`` told to exit (``should_exit``) whose ``serve()`` runs as
    ``task``. Connections uvicorn is already closing (idle keep-alive ones) that are still
    open after ``grace_s`` are aborted; requests in flight keep their time to finish."""
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    if not done:
        for connection in list(server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None and transport.is_closing():
                transport.abort()
    await task
