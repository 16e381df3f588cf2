"""``modelfleet keys``: rotating central's manifest key from its data directory, and the
one-line errors when there is nothing (sound) to rotate."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from central.registry.signing import ENDORSEMENTS_FILE, KEY_FILE, ManifestSigner
from fleetwire.signing import fingerprint, verify_chain
from modelfleet.cli import app


def test_rotate_twice_then_show_the_chain(tmp_path: Path) -> None:
    first = ManifestSigner.load_or_create(tmp_path)
    runner = CliRunner()
    for _ in range(2):
        result = runner.invoke(app, ["keys", "rotate", "--data-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
    current = ManifestSigner.load_or_create(tmp_path)
    assert verify_chain(first.public_key, current.public_key, current.endorsements) == 2
    shown = runner.invoke(app, ["keys", "show", "--data-dir", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert fingerprint(current.public_key) in shown.output and f"{fingerprint(first.public_key)}.key" in shown.output


def test_rotate_without_a_key_or_with_a_broken_chain_fails_in_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["keys", "rotate", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and "no manifest key" in result.output
    assert not (tmp_path / KEY_FILE).exists()  # central makes the first key, not the CLI

    ManifestSigner.load_or_create(tmp_path)
    (tmp_path / ENDORSEMENTS_FILE).write_text("{not json")
    for command in ("rotate", "show"):
        result = CliRunner().invoke(app, ["keys", command, "--data-dir", str(tmp_path)])
        assert result.exit_code == 1 and "is not a list of key endorsements" in result.output, result.output
        assert "Traceback" not in result.output
