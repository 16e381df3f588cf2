"""Desired-state seals: central signs what an edge acts on; an edge opens only an untouched
seal, made for it, by the key it pinned, that says what the state says."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fleetwire.sealing import SEAL_CONTEXT, SealError, open_seal
from fleetwire.signing import raw_public_key
from fleetwire.v1 import registry_pb2
from support.seals import SEAL_KEY as KEY
from support.seals import sealed_state


def test_a_sealed_state_opens_for_its_node_with_the_key_that_sealed_it() -> None:
    seal = open_seal(sealed_state(), "edge-1", raw_public_key(KEY))
    assert (seal.node_id, seal.generation, seal.issued_at_ms) == ("edge-1", 7, 1_765_000_000_000)
    assert [(v.name, v.version, v.serve) for v in seal.versions] == [("mlp", "1", True)]


def _unsealed(state: registry_pb2.DesiredState) -> None:
    state.ClearField("seal")


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


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_unsealed, "unsigned"),
        (_serve_flipped, "content"),
        (_caps_changed, "content"),
        (_version_added, "content"),
        (_generation_bumped, "content"),
        (_seal_bit_flipped, "signature"),
    ],
)
def test_a_state_that_differs_from_its_seal_is_refused(
    tamper: Callable[[registry_pb2.DesiredState], None], reason: str
) -> None:
    state = sealed_state()
    tamper(state)
    with pytest.raises(SealError) as refused:
        open_seal(state, "edge-1", raw_public_key(KEY))
    assert refused.value.reason == reason


def test_a_seal_for_another_node_or_by_another_key_is_refused() -> None:
    with pytest.raises(SealError) as other_node:
        open_seal(sealed_state(node_id="edge-2"), "edge-1", raw_public_key(KEY))
    assert other_node.value.reason == "node"
    with pytest.raises(SealError) as other_key:
        open_seal(sealed_state(key=Ed25519PrivateKey.generate()), "edge-1", raw_public_key(KEY))
    assert other_key.value.reason == "signature"


def test_a_seal_signature_is_no_manifest_signature() -> None:
    """The context prefix: signing a seal's bytes never yields what a bare signature over them is."""
    state = sealed_state()
    assert state.seal_signature != KEY.sign(state.seal)
    assert state.seal_signature == KEY.sign(SEAL_CONTEXT + state.seal)
