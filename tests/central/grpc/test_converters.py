"""Desired-state messages: each signed manifest is converted once and copied into every
node's message, which stays the message built from scratch, and a message a caller changes
never changes the next one."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench._ha_seal import desired_state_from_scratch
from central.distribution import ArtifactVerdict, DesiredState
from central.distribution.assignment import VersionAssignment
from central.grpc.converters import desired_state_to_pb, manifest_pb_of
from fleetwire.convert import manifest_from_pb
from fleetwire.manifest import ArtifactRef, ChunkRef, Manifest
from fleetwire.signing import sign_manifest
from fleetwire.transfer import TransferCaps

KEY = Ed25519PrivateKey.generate()
CHUNK = ChunkRef(digest="cd" * 32, size=4, offset=0)
VERDICT = ArtifactVerdict(artifact="int8", hardware_class="x86", node_id="n0", speedup_b1=2.0, speedup_b8=3.5)


def _manifest(version: str, sha: str = "ab", signed: bool = True) -> Manifest:
    m = Manifest(
        name="mlp", version=version, sha256=sha * 32, size=4, chunks=[CHUNK], created_at="2026-12-05T00:00:00Z"
    )
    return sign_manifest(m, KEY) if signed else m


def _state(*manifests: Manifest, generation: int = 7) -> DesiredState:
    versions = [
        VersionAssignment(manifest=manifests[0], serve=True, placement={"cd" * 32: ["n0", "n1"]}, verdict=VERDICT),
        *(
            VersionAssignment(
                manifest=m, serve=False, placement={}, stage=True, serve_at=1_765_000_000.1234, force_artifact="fp32"
            )
            for m in manifests[1:]
        ),
    ]
    return DesiredState(
        generation=generation,
        versions=versions,
        peers={"n1": "127.0.0.1:2", "n0": "127.0.0.1:1"},
        peer_sites={"n1": "rack-b"},
        placement_enabled=False,
        limits=TransferCaps(serve_bytes_per_s=1000),
    )


def test_every_node_gets_the_message_builtdesired_state_from_scratch() -> None:
    v1, v2 = _manifest("1"), _manifest("2", "ef")
    for generation in (1, 2):  # the second time from the cache
        state = _state(v1, v2, generation=generation)
        pb = desired_state_to_pb(state)
        assert pb == desired_state_from_scratch(state)
        assert [manifest_from_pb(v.manifest) for v in pb.versions] == [v1, v2]
        assert pb.versions[0].HasField("verdict") and not pb.versions[1].HasField("verdict")
    assert manifest_pb_of(v1) is manifest_pb_of(v1.model_copy())  # converted once, by signature


def test_a_message_changed_by_its_caller_leaves_the_next_alone() -> None:
    state = _state(_manifest("3"), _manifest("4", "ef"))
    first = desired_state_to_pb(state)
    first.versions[0].manifest.name = "other"
    first.versions[0].manifest.chunks.add(digest="ee" * 32, size=1)
    first.versions[0].verdict.artifact = "fp32"
    first.seal = b"sealed"
    assert desired_state_to_pb(state) == desired_state_from_scratch(state)


def test_a_reissued_or_unsigned_manifest_is_converted_for_what_it_holds() -> None:
    signed = _manifest("5")
    desired_state_to_pb(_state(signed))
    pending = ArtifactRef(artifact="int8", sha256="01" * 32, size=4, chunks=[CHUNK])
    reissued = sign_manifest(signed.model_copy(update={"pending": [pending], "signature": ""}), KEY)
    assert manifest_from_pb(desired_state_to_pb(_state(reissued)).versions[0].manifest).pending == [pending]
    # Unsigned: the same name and version say nothing of the content, so nothing is reused.
    for sha in ("11", "22"):
        unsigned = _manifest("6", sha, signed=False)
        assert desired_state_to_pb(_state(unsigned)).versions[0].manifest.sha256 == sha * 32
    assert manifest_pb_of(unsigned) is not manifest_pb_of(unsigned)
