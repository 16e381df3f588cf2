"""Central's signature over a desired state (the *seal*), and the edge's check of it.

A desired state tells an edge which signed manifests to serve, which artifact, and how fast
it may move bytes. Manifests are signed one by one, but the set of them is not: without a
seal, anything that could pose as central could hand an edge an old (validly signed)
manifest and roll it back. The seal binds, for one node, a generation that only grows to
the versions (by their manifest signatures), the serve flags, the artifact verdicts and the
transfer caps. Placement and peer addresses stay outside: they are hints, and every chunk is
verified against its digest whoever sends it.

The seal travels as the serialized ``DesiredSeal`` bytes central signed, next to the state
(``DesiredState.seal``): the edge verifies exactly those bytes, so no canonical encoding of
a protobuf message is needed (protobuf promises none), and then checks that the state it
acts on says what the seal says. The signing key is the manifest key; ``SEAL_CONTEXT``
keeps a seal's signature from ever verifying as a manifest's or an endorsement's."""

from __future__ import annotations

from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from google.protobuf.message import DecodeError

from fleetwire.signing import SignatureError, fingerprint, public_key_from_bytes
from fleetwire.v1 import registry_pb2

#: Prefix of the bytes a seal's signature covers.
SEAL_CONTEXT = b"modelfleet desired state seal v1\n"


class SealError(ValueError):
    """A desired state is unsealed, its seal does not verify, or it says something else than its seal."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        #: A short, fixed word for counters: unsigned, signature, node, generation, content.
        self.reason = reason


def seal_of(state: registry_pb2.DesiredState, node_id: str, issued_at_ms: int) -> bytes:
    """The serialized ``DesiredSeal`` of ``state`` (its generation already set) for ``node_id``."""
    seal = registry_pb2.DesiredSeal(
        node_id=node_id,
        generation=state.generation,
        issued_at_ms=issued_at_ms,
        versions=[_sealed(v) for v in state.versions],
        limits=state.limits,
        placement_enabled=state.placement_enabled,
    )
    return seal.SerializeToString()


def seal_state(
    state: registry_pb2.DesiredState, node_id: str, issued_at_ms: int, sign: Callable[[bytes], bytes]
) -> None:
    """Set ``state.seal`` and ``state.seal_signature`` (``sign``: the manifest key's raw Ed25519 signing)."""
    seal = seal_of(state, node_id, issued_at_ms)
    state.seal = seal
    state.seal_signature = sign(SEAL_CONTEXT + seal)


def _sealed(v: registry_pb2.VersionAssignment) -> registry_pb2.SealedVersion:
    return registry_pb2.SealedVersion(
        name=v.manifest.name,
        version=v.manifest.version,
        manifest_signature=v.manifest.signature,
        serve=v.serve,
        artifact=v.verdict.artifact if v.HasField("verdict") else "",
        stage=v.stage,
        serve_at_ms=v.serve_at_ms,
        force_artifact=v.force_artifact,
    )


def open_seal(state: registry_pb2.DesiredState, node_id: str, public_key: bytes) -> registry_pb2.DesiredSeal:
    """The seal of ``state`` once checked: signed by ``public_key``, for ``node_id``, and saying
    what ``state`` says (generation, versions, serve flags, verdicts, caps). SealError otherwise."""
    if not state.seal or not state.seal_signature:
        raise SealError("unsigned", f"desired state generation {state.generation} carries no seal")
    try:
        public_key_from_bytes(public_key).verify(state.seal_signature, SEAL_CONTEXT + state.seal)
    except (SignatureError, InvalidSignature) as exc:
        raise SealError(
            "signature", f"the seal of desired state {state.generation} does not verify with {fingerprint(public_key)}"
        ) from exc
    try:
        seal = registry_pb2.DesiredSeal.FromString(state.seal)
    except DecodeError as exc:  # signed but unreadable: not from a central of this protocol
        raise SealError("content", f"the seal of desired state {state.generation} does not parse") from exc
    if seal.node_id != node_id:
        raise SealError(
            "node", f"desired state {state.generation} is sealed for node {seal.node_id!r}, not {node_id!r}"
        )
    if seal.generation != state.generation:
        raise SealError("content", f"desired state {state.generation} carries the seal of generation {seal.generation}")
    sealed = [_sealed(v) for v in state.versions]
    if list(seal.versions) != sealed or seal.limits != state.limits:
        raise SealError("content", f"desired state {state.generation} differs from its seal")
    if seal.placement_enabled != state.placement_enabled:
        raise SealError("content", f"desired state {state.generation} differs from its seal")
    return seal
