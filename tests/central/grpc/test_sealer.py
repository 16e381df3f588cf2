"""Central's seal batcher: the seals it encodes from cached pieces are byte for byte those of
``fleetwire.sealing.seal_of``, and the states that wait together share one signature, each
opening for its own node only."""

from __future__ import annotations

import asyncio

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from central.distribution import ArtifactVerdict, DesiredState
from central.distribution.assignment import VersionAssignment
from central.grpc.converters import desired_state_to_pb
from central.grpc.sealer import SealBatcher, SealEncoder
from fleetwire.manifest import ChunkRef, Manifest
from fleetwire.sealing import SealError, open_seal, seal_of
from fleetwire.signing import raw_public_key, sign_manifest
from fleetwire.transfer import TransferCaps
from fleetwire.v1 import registry_pb2

KEY = Ed25519PrivateKey.generate()


def _manifest(version: str) -> Manifest:
    chunk = ChunkRef(digest="cd" * 32, size=4, offset=0)
    m = Manifest(
        name="mlp", version=version, sha256="ab" * 32, size=4, chunks=[chunk], created_at="2026-12-05T00:00:00Z"
    )
    return sign_manifest(m, KEY)


V1, V2 = _manifest("1"), _manifest("2")
VERDICT = ArtifactVerdict(artifact="int8", hardware_class="x86", node_id="n0", speedup_b1=2.0)


def _state(generation: int, variant: int) -> DesiredState:
    """States that differ in every field a seal covers."""
    versions = [
        VersionAssignment(manifest=V1, serve=variant % 2 == 0, placement={"cd" * 32: ["n0", "n1"]}),
        VersionAssignment(
            manifest=V2,
            serve=variant % 3 != 0,
            placement={},
            verdict=VERDICT if variant % 4 else None,
            stage=variant % 3 == 0,
            serve_at=1_765_000_000.1234 if variant % 5 == 1 else None,
            force_artifact="fp32" if variant % 7 == 2 else None,
        ),
    ][: 1 + variant % 2 + (variant % 3 == 0)]
    caps = TransferCaps(serve_bytes_per_s=variant * 1000 if variant % 2 else None, fetch_bytes_per_s=variant or None)
    return DesiredState(generation=generation, versions=versions, placement_enabled=variant % 6 != 5, limits=caps)


@pytest.mark.parametrize("variant", range(14))
def test_a_seal_from_cached_pieces_is_the_seal_of_the_state_sent(variant: int) -> None:
    encoder = SealEncoder()
    for generation in (3, 4):  # the second time from the caches
        state = _state(generation, variant)
        expected = seal_of(desired_state_to_pb(state), f"node-{variant}", 1_765_000_000_000 + generation)
        assert encoder.seal(state, f"node-{variant}", 1_765_000_000_000 + generation) == expected
    assert encoder.seal(_state(4, variant), "another", 1) != expected


def test_unsigned_manifests_of_other_versions_get_their_own_seal_pieces() -> None:
    encoder = SealEncoder()
    for version in ("1", "2"):
        unsigned = _manifest(version).model_copy(update={"signature": ""})
        state = DesiredState(generation=3, versions=[VersionAssignment(manifest=unsigned, serve=True, placement={})])
        assert encoder.seal(state, "n", 1) == seal_of(desired_state_to_pb(state), "n", 1)


async def _sealed(batcher: SealBatcher, state: DesiredState, node_id: str) -> registry_pb2.DesiredState:
    """What the servicer does: seal, then convert and attach."""
    sealed = await batcher.seal(state, node_id)
    pb = desired_state_to_pb(state)
    sealed.attach(pb)
    return pb


async def test_states_waiting_together_share_one_signature_and_each_opens_for_its_node() -> None:
    batcher = SealBatcher(KEY.sign, window_s=0.01)
    states = {f"node-{i}": _state(10 + i % 2, i) for i in range(40)}
    pbs = dict(zip(states, await asyncio.gather(*(_sealed(batcher, s, n) for n, s in states.items())), strict=True))
    assert batcher.signatures == 1
    assert {pb.seal_tree_size for pb in pbs.values()} == {40}
    for node_id, pb in pbs.items():
        assert open_seal(pb, node_id, raw_public_key(KEY)).node_id == node_id
    with pytest.raises(SealError):
        open_seal(pbs["node-1"], "node-2", raw_public_key(KEY))

    # A lone state later (a node joining): its own tree of one, its own signature.
    late = await _sealed(batcher, _state(12, 3), "late")
    assert batcher.signatures == 2 and late.seal_tree_size == 1 and not late.seal_path
    assert open_seal(late, "late", raw_public_key(KEY)).generation == 12


async def test_a_stream_that_closes_while_waiting_leaves_the_others_sealed() -> None:
    batcher = SealBatcher(KEY.sign, window_s=0.05)
    state = _state(2, 1)
    waits = [asyncio.ensure_future(_sealed(batcher, state, f"n{i}")) for i in range(3)]
    await asyncio.sleep(0)
    waits[1].cancel()
    first, third = await asyncio.gather(waits[0], waits[2])
    assert open_seal(first, "n0", raw_public_key(KEY)).node_id == "n0"
    assert batcher.signatures == 1 and third.seal_tree_size == 2 and third.seal_leaf_index == 1
    assert open_seal(third, "n2", raw_public_key(KEY)).node_id == "n2"


async def test_a_full_batch_is_signed_at_once() -> None:
    batcher = SealBatcher(KEY.sign, window_s=60, max_batch=4)
    waits = [_sealed(batcher, _state(2, 1), f"n{i}") for i in range(8)]
    pbs = await asyncio.wait_for(asyncio.gather(*waits), timeout=10)  # a 60 s window would time out
    assert batcher.signatures == 2 and {pb.seal_tree_size for pb in pbs} == {4}
