"""Replicas agree on one manifest signing key through PostgreSQL; a rotation on one replica
becomes the fleet's, the others take it at their next start, and an unrelated key is refused."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from central.ha.shared_files import share_signing_key
from central.registry.signing import KEY_FILE, KeyRotationError, ManifestSigner, rotate_key


def _share(url: str, data_dir: Path) -> ManifestSigner:
    with psycopg.connect(url) as conn:
        return share_signing_key(conn, data_dir)


def test_the_first_replica_s_key_is_every_replica_s(ha_url: str, tmp_path: Path) -> None:
    first = _share(ha_url, tmp_path / "r1")
    second = _share(ha_url, tmp_path / "r2")  # an empty data dir takes the shared key
    assert first.public_key == second.public_key
    assert (tmp_path / "r2" / KEY_FILE).stat().st_mode & 0o777 == 0o600


def test_a_rotation_on_one_replica_reaches_the_others(ha_url: str, tmp_path: Path) -> None:
    old = _share(ha_url, tmp_path / "r1").public_key
    _share(ha_url, tmp_path / "r2")
    rotate_key(tmp_path / "r1")  # `modelfleet keys rotate` on r1's data dir
    rotated = _share(ha_url, tmp_path / "r1")  # r1 restarts: its rotated key becomes the fleet's
    assert rotated.public_key != old and rotated.endorsements[-1].old_public_key == old
    taken = _share(ha_url, tmp_path / "r2")  # r2 restarts: it takes the new key and its chain
    assert taken.public_key == rotated.public_key and taken.endorsements == rotated.endorsements


def test_an_unrelated_key_is_refused_not_overwritten(ha_url: str, tmp_path: Path) -> None:
    _share(ha_url, tmp_path / "r1")
    stranger = ManifestSigner.load_or_create(tmp_path / "other")  # another fleet's data dir
    before = (tmp_path / "other" / KEY_FILE).read_bytes()
    with pytest.raises(KeyRotationError, match="neither endorses the other"):
        _share(ha_url, tmp_path / "other")
    assert (tmp_path / "other" / KEY_FILE).read_bytes() == before and stranger.public_key
