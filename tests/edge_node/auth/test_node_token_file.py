"""The edge's node token from a file: read at start-up (a missing or empty file is a
settings error naming it), re-read when it changes (rotation without a restart), and
kept when a rotation leaves the file briefly unreadable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_node.auth import NodeCredential
from edge_node.settings import EdgeSettings


def test_a_rotated_token_file_is_picked_up_and_a_broken_rotation_keeps_the_last_token(tmp_path: Path) -> None:
    path = tmp_path / "node.token"
    path.write_text("mft_first\n")
    credential = NodeCredential(token_file=path)
    assert credential.metadata() == (("authorization", "Bearer mft_first"),)

    replacement = tmp_path / "node.token.new"
    replacement.write_text("mft_second")
    os.replace(replacement, path)  # how a rotation should write it: a new file renamed over
    assert credential.metadata() == (("authorization", "Bearer mft_second"),)

    path.write_text("")  # a writer caught half-way
    assert credential.metadata() == (("authorization", "Bearer mft_second"),)
    path.unlink()
    assert credential.metadata() == (("authorization", "Bearer mft_second"),)


def test_a_missing_or_empty_token_file_and_both_settings_fail_at_start_up(tmp_path: Path) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("  \n")
    for kwargs, message in (
        ({"node_token_file": tmp_path / "absent.token"}, "cannot read node_token_file"),
        ({"node_token_file": empty}, "is empty"),
        ({"node_token": "mft_x", "node_token_file": empty}, "not both"),
    ):
        with pytest.raises(ValidationError, match=message):
            EdgeSettings(node_id="edge-a", data_dir=tmp_path, **kwargs)
    assert NodeCredential().metadata() == () and NodeCredential("").metadata() == ()
    settings = EdgeSettings(node_id="edge-a", data_dir=tmp_path, node_token="mft_secret")
    assert "mft_secret" not in repr(settings)  # SecretStr: never in a logged settings dump
