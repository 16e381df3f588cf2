"""Desired-state seals: central signs what an edge acts on; an edge opens only an untouched
seal, made for it, by the key it pinned, that says what the state says. Both forms: the tree
(many nodes' seals under one signature, each with its audit path) and the single signature."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fleetwire.merkle import leaf_hash, node_hash
from fleetwire.sealing import SEAL_CONTEXT, SEAL_TREE_CONTEXT, SealError, open_seal, tree_message
from fleetwire.signing import raw_public_key
from fleetwire.v1 import registry_pb2
from support.seals import ISSUED_AT_MS, SealForm, sealed_state, sealed_together
from support.seals import SEAL_KEY as KEY

FORMS: list[SealForm] = ["tree", "single"]


@pytest.mark.parametrize("form", FORMS)
def test_a_sealed_state_opens_for_its_node_with_the_key_that_sealed_it(form: SealForm) -> None:
    state = sealed_state(form=form)
    assert bool(state.seal_root_signature) == (form == "tree") and bool(state.seal_signature) == (form == "single")
    seal = open_seal(state, "edge-1", raw_public_key(KEY))
    assert (seal.node_id, seal.generation, seal.issued_at_ms) == ("edge-1", 7, ISSUED_AT_MS)
    assert [(v.name, v.version, v.serve) for v in seal.versions] == [("mlp", "1", True)]


def _unsealed(state: registry_pb2.DesiredState) -> None:
    state.ClearField("seal")


def _signature_dropped(state: registry_pb2.DesiredState) -> None:
    state.ClearField("seal_root_signature")
    state.ClearField("seal_signature")


def _serve_flipped(state: registry_pb2.DesiredState) -> None:
    state.versions[0].serve = False


def _caps_changed(state: registry_pb2.DesiredState) -> None:
    state.limits.serve_bytes_per_s = 1


def _version_added(state: registry_pb2.DesiredState) -> None:
    state.versions.append(state.versions[0])


def _generation_bumped(state: registry_pb2.DesiredState) -> None:
    state.generation += 1


def _seal_bit_flipped(state: registry_pb2.DesiredState) -> None:
    state.seal = state.seal[:-1] + bytes([state.seal[-1] ^ 1])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_unsealed, "unsigned"),
        (_signature_dropped, "unsigned"),
        (_serve_flipped, "content"),
        (_caps_changed, "content"),
        (_version_added, "content"),
        (_generation_bumped, "content"),
        (_seal_bit_flipped, "signature"),
    ],
)
def test_a_state_that_differs_from_its_seal_is_refused(
    tamper: Callable[[registry_pb2.DesiredState], None], reason: str, form: SealForm
) -> None:
    state = sealed_state(form=form)
    tamper(state)
    with pytest.raises(SealError) as refused:
        open_seal(state, "edge-1", raw_public_key(KEY))
    assert refused.value.reason == reason


@pytest.mark.parametrize("form", FORMS)
def test_a_seal_for_another_node_or_by_another_key_is_refused(form: SealForm) -> None:
    with pytest.raises(SealError) as other_node:
        open_seal(sealed_state(node_id="edge-2", form=form), "edge-1", raw_public_key(KEY))
    assert other_node.value.reason == "node"
    with pytest.raises(SealError) as other_key:
        open_seal(sealed_state(key=Ed25519PrivateKey.generate(), form=form), "edge-1", raw_public_key(KEY))
    assert other_key.value.reason == "signature"


def test_one_signature_seals_every_node_of_a_change_and_each_opens_only_its_own() -> None:
    states = sealed_together([f"edge-{i}" for i in range(5)])
    assert len({s.seal_root_signature for s in states.values()}) == 1
    assert [s.seal_leaf_index for s in states.values()] == list(range(5))
    for node_id, state in states.items():
        assert open_seal(state, node_id, raw_public_key(KEY)).node_id == node_id
    # edge-3's seal with its own valid proof, handed to edge-1: a seal for edge-3.
    with pytest.raises(SealError) as replayed:
        open_seal(states["edge-3"], "edge-1", raw_public_key(KEY))
    assert replayed.value.reason == "node"


def test_a_seal_with_another_leafs_proof_or_a_changed_proof_is_refused() -> None:
    states = sealed_together([f"edge-{i}" for i in range(5)])
    key = raw_public_key(KEY)
    other = states["edge-2"]

    def swap(s: registry_pb2.DesiredState) -> None:  # edge-1's seal at edge-2's place in the tree
        s.seal_leaf_index, s.seal_path = other.seal_leaf_index, other.seal_path

    refused_as = {
        "signature": [
            _copy(states["edge-1"], swap),
            _copy(states["edge-1"], lambda s: setattr(s, "seal_path", bytes([s.seal_path[0] ^ 1]) + s.seal_path[1:])),
            _copy(states["edge-1"], lambda s: setattr(s, "seal_leaf_index", 0)),
            _copy(states["edge-1"], lambda s: setattr(s, "seal_tree_size", 6)),  # the same path fits a tree of 6
        ],
        "proof": [
            _copy(states["edge-1"], lambda s: setattr(s, "seal_leaf_index", 5)),  # outside the tree
            _copy(states["edge-1"], lambda s: setattr(s, "seal_path", s.seal_path[:-32])),  # one hash short
            _copy(states["edge-1"], lambda s: setattr(s, "seal_path", s.seal_path[:-1])),  # not whole hashes
        ],
    }
    for reason, tampered in refused_as.items():
        for state in tampered:
            with pytest.raises(SealError) as refused:
                open_seal(state, "edge-1", key)
            assert refused.value.reason == reason


def _copy(
    state: registry_pb2.DesiredState, change: Callable[[registry_pb2.DesiredState], object]
) -> registry_pb2.DesiredState:
    copy = registry_pb2.DesiredState()
    copy.CopyFrom(state)
    change(copy)
    return copy


def test_signatures_of_the_two_forms_never_stand_for_each_other() -> None:
    """Each form's signature covers its own context prefix: a single seal's signature is no
    root's, and a tree of one (root: the seal's leaf hash) is no single seal."""
    single = sealed_state(form="single")
    assert single.seal_signature == KEY.sign(SEAL_CONTEXT + single.seal)
    assert single.seal_signature != KEY.sign(single.seal)
    tree = sealed_state(form="tree")  # the middle leaf of three
    root = node_hash(node_hash(tree.seal_path[:32], leaf_hash(tree.seal)), tree.seal_path[32:])
    assert tree.seal_root_signature == KEY.sign(tree_message(root, 3))
    assert tree_message(root, 3) == SEAL_TREE_CONTEXT + root + (3).to_bytes(8, "big")
    forged = registry_pb2.DesiredState()
    forged.CopyFrom(single)
    forged.seal_tree_size = 1
    forged.seal_root_signature = single.seal_signature
    with pytest.raises(SealError) as refused:
        open_seal(forged, "edge-1", raw_public_key(KEY))
    assert refused.value.reason == "signature"
