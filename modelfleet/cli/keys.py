"""``modelfleet keys rotate|show``: central's manifest signing key and its endorsements.

Like ``modelfleet token``, it runs on central's host against its data directory. A
rotation makes a new key and an endorsement (the new public key signed by the old
private key) that edges follow to re-pin on their own; central signs with the new key,
and re-signs the stored versions, from its next start. ``central`` is imported inside the
commands so that the rest of the CLI starts without it."""

from __future__ import annotations

from pathlib import Path

import typer

from modelfleet.cli import output
from modelfleet.cli.client import CliError
from modelfleet.cli.config import JsonOption
from modelfleet.cli.token import DataDirOption

keys_app = typer.Typer(no_args_is_help=True, help="Rotate and show central's manifest signing key.")


def register(app: typer.Typer) -> None:
    """Add ``keys`` to ``app``."""
    app.add_typer(keys_app, name="keys")


@keys_app.command("rotate")
@output.reported
def rotate(data_dir: DataDirOption = Path("./data/central")) -> None:
    """Make a new manifest key endorsed by the current one; restart central to use it."""
    from central.registry.signing import RETIRED_DIR, KeyRotationError, rotate_key
    from fleetwire.signing import fingerprint

    try:
        link = rotate_key(data_dir)
    except KeyRotationError as exc:
        raise CliError(str(exc)) from None
    old, new = fingerprint(link.old_public_key), fingerprint(link.new_public_key)
    output.console().print(
        f"rotated the manifest key {old} -> {new}. Restart central: it signs with {new} from then on and"
        f" edges re-pin it at their next registration. The old private key is in"
        f" {data_dir / RETIRED_DIR / (old + '.key')}: nothing needs it any more, delete it."
    )


@keys_app.command("show")
@output.reported
def show(json: JsonOption = False, data_dir: DataDirOption = Path("./data/central")) -> None:
    """The current key's fingerprint, its endorsement chain and the retired keys on disk."""
    from central.registry.signing import KEY_FILE, RETIRED_DIR, KeyRotationError, ManifestSigner
    from fleetwire.signing import fingerprint

    if not (data_dir / KEY_FILE).is_file():
        raise CliError(f"no manifest key in {data_dir}: central makes one at its first start")
    try:
        signer = ManifestSigner.load_or_create(data_dir)
    except KeyRotationError as exc:
        raise CliError(str(exc)) from None
    retired = sorted(p.name for p in (data_dir / RETIRED_DIR).glob("*.key"))
    chain = [
        {"created_at": e.created_at, "old": fingerprint(e.old_public_key), "new": fingerprint(e.new_public_key)}
        for e in signer.endorsements
    ]
    if json:
        current = {"fingerprint": fingerprint(signer.public_key), "public_key": signer.public_key.hex()}
        output.print_json({"current": current, "endorsements": chain, "retired_private_keys": retired})
        return
    console = output.console()
    console.print(f"manifest key {fingerprint(signer.public_key)} (public key {signer.public_key.hex()})")
    if chain:
        rows = [(e["created_at"], e["old"], e["new"]) for e in chain]
        console.print(output.table(("rotated at", "old key", "new key"), rows, title="endorsements"))
    else:
        console.print("never rotated: no endorsements")
    if retired:
        console.print(f"retired private keys in {data_dir / RETIRED_DIR} (safe to delete): {', '.join(retired)}")
