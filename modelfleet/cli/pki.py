"""``modelfleet pki issue``: a fleet CA and the certificates of its processes, as the
deployment files expect them (``deploy/docker-compose.yml`` runs it in its ``secrets``
service; ``deploy/k8s/make-secrets.sh`` on the operator's machine).

Each certificate goes into a directory of its own with the three file names the images'
TLS settings point at: ``cert.pem``, ``key.pem`` (mode 0600) and ``ca.pem``, so one
directory is what one process mounts. The CA (and its key, which signs everything) stays
in ``--ca-dir``: made there the first time, reused after. A certificate already in place
is kept (``--renew`` replaces it), so the command can run at every start. An edge's
certificate is issued with ``--node ID``: its node id goes into its names
(``fleetwire.peer_identity``), which other edges' Peer services and their own channels to
it check; a kept certificate that does not name the node asked for is replaced."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from modelfleet.cli import output
from modelfleet.cli.client import CliError

pki_app = typer.Typer(no_args_is_help=True, help="A private CA for the fleet and its processes' certificates.")

#: File names in an ``--out`` directory (the images' MODELFLEET_TLS__* defaults).
CERT_FILE, KEY_FILE, CA_FILE = "cert.pem", "key.pem", "ca.pem"
_CA_NAME = "fleet"


def register(app: typer.Typer) -> None:
    """Add ``pki`` to ``app``."""
    app.add_typer(pki_app, name="pki")


def _chains_to(cert_file: Path, ca_file: Path) -> bool:
    """``cert_file`` was issued by the CA in ``ca_file`` (by name and signature)."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _node_of(cert_file: Path) -> str | None:
    """The node id a certificate is bound to, if any."""
    from cryptography import x509

    from fleetwire.peer_identity import AmbiguousIdentity, node_of_uris

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return node_of_uris(sans.get_values_for_type(x509.UniformResourceIdentifier))
    except (x509.ExtensionNotFound, AmbiguousIdentity):
        return None


@pki_app.command("issue")
@output.reported
def issue(
    name: Annotated[str, typer.Argument(help="The certificate's common name (e.g. central, edge-a, mosquitto).")],
    ca_dir: Annotated[
        Path, typer.Option("--ca-dir", help="Where the fleet CA and its private key are kept (made when missing).")
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for cert.pem, key.pem and ca.pem.")],
    san: Annotated[
        list[str] | None,
        typer.Option(
            "--san",
            help="A host name or IP address clients dial (repeat); default: NAME, localhost and 127.0.0.1.",
            show_default=False,
        ),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option("--node", help="An edge's node id: the certificate is bound to it (peers check it)."),
    ] = None,
    days: Annotated[int, typer.Option("--days", min=1, help="Validity of the certificate.")] = 365,
    ca_days: Annotated[int, typer.Option("--ca-days", min=1, help="Validity of a CA made now.")] = 3650,
    renew: Annotated[bool, typer.Option("--renew", help="Replace a certificate already in --out.")] = False,
) -> None:
    """Issue NAME's certificate into --out, signed by the CA in --ca-dir."""
    from modelfleet.pki import LOOPBACK_SANS, CertAuthority

    ca = CertAuthority.load_or_create(ca_dir, _CA_NAME, common_name="modelfleet fleet CA", valid_days=ca_days)
    out.mkdir(parents=True, exist_ok=True)
    cert_file, key_file, ca_copy = out / CERT_FILE, out / KEY_FILE, out / CA_FILE
    held = not renew and cert_file.is_file() and key_file.is_file()
    if held and node is not None and _node_of(cert_file) != node:
        # made before certificates were bound to node ids (or for another node): peers would
        # refuse it, and replacing it is what this command exists for
        typer.echo(f"{cert_file} is not bound to node {node}: issuing a new one", err=True)
        held = False
    if held:
        if not _chains_to(cert_file, ca.ca_file):
            raise CliError(f"{cert_file} was not issued by the CA in {ca_dir}: give --renew to replace it")
        shutil.copyfile(ca.ca_file, ca_copy)
        typer.echo(f"kept {cert_file} ({name})", err=True)
        return
    names = tuple(san) if san else (name, *LOOPBACK_SANS)
    try:
        ca.issue(name, names, valid_days=days, cert_file=cert_file, key_file=key_file, node_id=node)
    except ValueError as exc:  # a bad node id, or a SAN only --node may give
        raise CliError(str(exc)) from None
    shutil.copyfile(ca.ca_file, ca_copy)
    bound = f" bound to node {node}" if node is not None else ""
    typer.echo(f"issued {cert_file} for {', '.join(names)}{bound}, valid {days} days", err=True)
