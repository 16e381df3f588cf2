"""A small private certificate authority for a fleet: one self-signed CA and the leaf
certificates it signs, written as PEM files into one directory.

Used by ``modelfleet up --secure`` (certificates for central, each edge, the broker and
an operator), by ``modelfleet pki issue`` (the deployment files' certificates) and by the
tests. EC P-256 keys, so a CA and a few leaves take
milliseconds. Leaves carry both serverAuth and clientAuth, and subject alternative names
for ``localhost`` and ``127.0.0.1`` unless told otherwise, so one file pair serves as a
process's server and client certificate, as the fleet's TLS settings expect
(``fleetwire/tls.py``). An edge's certificate is issued with its node id
(``issue(..., node_id=)``), which adds the names ``fleetwire.peer_identity`` binds it by;
peers refuse an edge certificate without them. Keys are written unencrypted with mode 0600.

Not a production PKI: no revocation list, no intermediate CA, no renewal; a fleet on a
real network should use certificates from its own CA."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fleetwire.names import check_name
from fleetwire.peer_identity import NODE_DNS_SUFFIX, node_sans
from fleetwire.signing import write_atomic

__all__ = ["LOOPBACK_SANS", "CertAuthority", "LeafFiles"]

LOOPBACK_SANS = ("localhost", "127.0.0.1")
#: Backdating, so a clock a little behind ours still accepts a certificate made just now.
_BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class LeafFiles:
    """One issued certificate: its PEM file, its key's PEM file, and the CA file to trust."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def tls(self, **extra: object) -> dict[str, object]:
        """A ``tls`` settings section that turns TLS on with these files."""
        return {
            "enabled": True,
            "cert_file": self.cert_file,
            "key_file": self.key_file,
            "ca_file": self.ca_file,
            **extra,
        }


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(entries: tuple[str, ...], node_id: str | None) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for entry in entries:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            names.append(x509.DNSName(entry))
    if node_id is not None:
        uri, dns = node_sans(check_name("node id", node_id))
        names += [x509.UniformResourceIdentifier(uri), x509.DNSName(dns)]
    return x509.SubjectAlternativeName(names)


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_atomic(path, pem, 0o600)  # created with its mode, so it is never readable by others


_CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


class CertAuthority:
    """A new self-signed CA in ``directory`` (``<name>-ca.pem``, its key in
    ``<name>-ca-key.pem``) that issues leaf certificates; ``common_name`` defaults to
    ``"<name> test CA"``."""

    def __init__(
        self, directory: Path, name: str = "fleet", *, common_name: str | None = None, valid_days: float = 1.0
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self._name = _name(common_name or f"{name} test CA")
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + dt.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_KEY_USAGE, critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}-ca.pem"
        self.ca_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.ca_key_file = directory / f"{name}-ca-key.pem"
        _write_key(self._key, self.ca_key_file)

    @classmethod
    def load_or_create(
        cls, directory: Path, name: str = "fleet", *, common_name: str | None = None, valid_days: float = 1.0
    ) -> CertAuthority:
        """The CA kept in ``directory`` (``<name>-ca.pem`` and its key), made there first if
        there is none: a fleet's later certificates must chain to the one its members trust."""
        ca_file, key_file = directory / f"{name}-ca.pem", directory / f"{name}-ca-key.pem"
        if not (ca_file.is_file() and key_file.is_file()):
            return cls(directory, name, common_name=common_name, valid_days=valid_days)
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_file}: not the EC key of a modelfleet CA")
        ca = cls.__new__(cls)
        ca.directory, ca.ca_file, ca.ca_key_file = directory, ca_file, key_file
        ca._key, ca.cert = key, x509.load_pem_x509_certificate(ca_file.read_bytes())
        ca._name = ca.cert.subject
        return ca

    def issue(
        self,
        name: str,
        sans: tuple[str, ...] = LOOPBACK_SANS,
        *,
        valid_days: float = 1.0,
        expired: bool = False,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        node_id: str | None = None,
    ) -> LeafFiles:
        """A leaf certificate for ``name`` (``<name>.pem`` and ``<name>-key.pem`` in the CA's
        directory, unless ``cert_file`` / ``key_file`` say where), for both server and
        client use; ``expired`` makes one whose validity ended yesterday; ``node_id`` makes
        it that node's (an edge's), its id in its names (``fleetwire.peer_identity``)."""
        if any(san.endswith(NODE_DNS_SUFFIX) for san in sans):
            raise ValueError(f"{NODE_DNS_SUFFIX} names only come with node_id")
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start = now - dt.timedelta(days=2) if expired else now - _BACKDATE
        end = now - dt.timedelta(days=1) if expired else now + dt.timedelta(days=valid_days)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_san(sans, node_id), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        cert_file = cert_file or self.directory / f"{name}.pem"
        key_file = key_file or self.directory / f"{name}-key.pem"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_file)
        return LeafFiles(cert_file, key_file, self.ca_file)
