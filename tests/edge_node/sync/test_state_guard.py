"""The edge's guard over desired states: sealed by the pinned key, generations that never go
back, the last accepted one kept on disk and checked again at boot."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_node.sync.guard import STATE_FILE, StateGuard, StateRefused
from edge_node.sync.trust import ManifestTrust
from fleetwire.signing import raw_public_key
from fleetwire.v1 import registry_pb2
from support.seals import SEAL_KEY as KEY
from support.seals import sealed_state, sealed_together


def guard(data_dir: Path) -> StateGuard:
    trust = ManifestTrust(data_dir)
    trust.offer(raw_public_key(KEY))
    return StateGuard("edge-1", data_dir, trust)


def test_an_admitted_state_is_kept_and_restored_after_a_restart(tmp_path: Path) -> None:
    first = guard(tmp_path)
    state = first.admit(sealed_state(generation=5))
    assert state.generation == 5 and first.generation == 5
    again = guard(tmp_path)
    restored = again.restore()
    assert restored is not None and restored.generation == 5
    assert [v.manifest.key for v in restored.versions] == [("mlp", "1")]
    assert again.generation == 5 and again.issued_at is not None and not again.refusals


def test_an_older_state_or_another_under_the_same_generation_is_refused(tmp_path: Path) -> None:
    g = guard(tmp_path)
    g.admit(sealed_state(generation=5))
    for older in (sealed_state(generation=4), sealed_state(generation=5, serve=False)):
        with pytest.raises(StateRefused) as refused:
            g.admit(older)
        assert refused.value.reason == "generation"
    assert g.refusals == {"generation": 2}
    assert g.admit(sealed_state(generation=5)).generation == 5  # the same state again: a reconnect
    assert g.admit(sealed_state(generation=6)).generation == 6
    assert registry_pb2.DesiredState.FromString((tmp_path / STATE_FILE).read_bytes()).generation == 6


def test_a_state_file_sealed_by_an_older_central_is_restored_and_a_tree_sealed_state_follows(tmp_path: Path) -> None:
    """Centrals before the tree form signed each state alone; the file such a central left is
    still this node's: it is restored, and central's next (tree-sealed) state is admitted."""
    guard(tmp_path).admit(sealed_state(generation=5, form="single"))
    again = guard(tmp_path)
    restored = again.restore()
    assert restored is not None and restored.generation == 5 and not again.refusals
    assert again.admit(sealed_state(generation=6)).generation == 6


def test_a_replayed_tree_sealed_state_of_an_older_change_is_refused(tmp_path: Path) -> None:
    """A whole older change, validly signed (one root, a proof for every node), replayed: this
    node's leaf names its older generation."""
    old, new = sealed_together(["edge-1", "edge-2"], generation=4), sealed_together(["edge-1", "edge-2"], generation=5)
    g = guard(tmp_path)
    g.admit(new["edge-1"])
    for replayed in (old["edge-1"], old["edge-2"], new["edge-2"]):
        with pytest.raises(StateRefused):
            g.admit(replayed)
    assert g.refusals == {"generation": 1, "node": 2} and g.generation == 5


def test_a_refused_state_is_not_kept(tmp_path: Path) -> None:
    g = guard(tmp_path)
    g.admit(sealed_state(generation=5))
    with pytest.raises(StateRefused):
        g.admit(sealed_state(generation=9, node_id="edge-2"))
    assert registry_pb2.DesiredState.FromString((tmp_path / STATE_FILE).read_bytes()).generation == 5


@pytest.mark.parametrize("corrupt", ["flip", "garbage", "unsealed"])
def test_a_tampered_state_on_disk_is_refused_and_counted(tmp_path: Path, corrupt: str) -> None:
    guard(tmp_path).admit(sealed_state(generation=5))
    path = tmp_path / STATE_FILE
    pb = registry_pb2.DesiredState.FromString(path.read_bytes())
    if corrupt == "flip":
        pb.versions[0].serve = False  # what an attacker with the disk would change
        path.write_bytes(pb.SerializeToString())
    elif corrupt == "garbage":
        path.write_bytes(b"\xff" * 40)
    else:
        pb.ClearField("seal_root_signature")
        pb.ClearField("seal_signature")
        path.write_bytes(pb.SerializeToString())
    again = guard(tmp_path)
    assert again.restore() is None
    assert sum(again.refusals.values()) == 1 and again.generation == 0


def test_nothing_on_disk_restores_nothing(tmp_path: Path) -> None:
    g = guard(tmp_path)
    assert g.restore() is None and not g.refusals
