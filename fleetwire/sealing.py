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
keeps a seal's signature from ever verifying as a manifest's or an endorsement's.

Two forms carry the signature. The *tree* form (what central sends): the seals of many nodes
are the leaves of a Merkle tree (``fleetwire.merkle``), central signs ``SEAL_TREE_CONTEXT``,
the root and the leaf count once, and each node gets its seal, its leaf's audit path and that
signature (``DesiredState.seal_path`` and the fields beside it). A fleet-wide change then
costs central one signature instead of one per node. The *single* form (``seal_signature`` over ``SEAL_CONTEXT + seal``)
is what centrals before the tree form sent, and what an edge's state file may still hold: it
is accepted too, and is no weaker. Either way, what the edge acts on is checked against the
seal's bytes, which name the node and the generation: a path handed to another node opens a
seal for the first one, and an old tree's path opens an old generation."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cryptography.exceptions import InvalidSignature
from google.protobuf.message import DecodeError

from fleetwire.merkle import MerkleTree, ProofError, root_from_path, split_path
from fleetwire.signing import SignatureError, fingerprint, public_key_from_bytes
from fleetwire.v1 import registry_pb2

#: Prefix of the bytes a seal's signature covers.
SEAL_CONTEXT = b"modelfleet desired state seal v1\n"
#: Prefix of the bytes a tree of seals' signature covers (neither prefix is a prefix of the other).
SEAL_TREE_CONTEXT = b"modelfleet desired state seal tree v1\n"


class SealError(ValueError):
    """A desired state is unsealed, its seal does not verify, or it says something else than its seal."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        #: A short, fixed word for counters: unsigned, signature, proof, node, generation, content.
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
    """Seal ``state`` alone, in the single form: set ``state.seal`` and ``state.seal_signature``
    (``sign``: the manifest key's raw Ed25519 signing). Central no longer sends this form; tests
    and benchmarks make it to show it is still accepted, and to compare."""
    seal = seal_of(state, node_id, issued_at_ms)
    state.seal = seal
    state.seal_signature = sign(SEAL_CONTEXT + seal)


def tree_message(root: bytes, size: int) -> bytes:
    """What the signature over a tree of seals covers: the context, the root, the leaf count."""
    return SEAL_TREE_CONTEXT + root + size.to_bytes(8, "big")


class SignedTree:
    """A Merkle tree over seals and central's one signature over its root."""

    def __init__(self, tree: MerkleTree, signature: bytes) -> None:
        self.tree = tree
        self.signature = signature
        self._size = tree.size
        self._paths: list[bytes] | None = None

    @classmethod
    def over(cls, seals: Sequence[bytes], sign: Callable[[bytes], bytes]) -> SignedTree:
        """The tree of ``seals`` (serialized ``DesiredSeal``s, in leaf order), signed by ``sign``."""
        tree = MerkleTree(seals)
        return cls(tree, sign(tree_message(tree.root, tree.size)))

    def attach(self, state: registry_pb2.DesiredState, index: int, seal: bytes) -> None:
        """Set ``state.seal`` to ``seal``, leaf ``index`` of this tree, and the ``seal_*`` fields of its proof."""
        if self._paths is None:  # every leaf's at once: they share their upper parts
            self._paths = self.tree.packed_paths()
        state.seal = seal
        state.seal_leaf_index = index
        state.seal_tree_size = self._size
        state.seal_path = self._paths[index]
        state.seal_root_signature = self.signature


def seal_states(
    states: Sequence[tuple[registry_pb2.DesiredState, str]], issued_at_ms: int, sign: Callable[[bytes], bytes]
) -> None:
    """Seal every ``(state, node_id)`` in the tree form, all under one signature: set each
    state's ``seal`` and the ``seal_*`` fields of its proof."""
    seals = [seal_of(state, node_id, issued_at_ms) for state, node_id in states]
    signed = SignedTree.over(seals, sign)
    for index, ((state, _), seal) in enumerate(zip(states, seals, strict=True)):
        signed.attach(state, index, seal)


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
    what ``state`` says (generation, versions, serve flags, verdicts, caps). SealError otherwise.

    The tree form when ``seal_root_signature`` is set, else the single form."""
    if state.seal and state.seal_root_signature:
        _verify(public_key, state.seal_root_signature, _signed_tree_message(state), state.generation)
    elif state.seal and state.seal_signature:
        _verify(public_key, state.seal_signature, SEAL_CONTEXT + state.seal, state.generation)
    else:
        raise SealError("unsigned", f"desired state generation {state.generation} carries no seal")
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


def _signed_tree_message(state: registry_pb2.DesiredState) -> bytes:
    """What the root signature must cover, if ``state.seal`` is the leaf its proof says."""
    try:
        root = root_from_path(state.seal, state.seal_leaf_index, state.seal_tree_size, split_path(state.seal_path))
    except ProofError as exc:
        raise SealError("proof", f"the seal of desired state {state.generation}: {exc}") from exc
    return tree_message(root, state.seal_tree_size)


def _verify(public_key: bytes, signature: bytes, message: bytes, generation: int) -> None:
    try:
        public_key_from_bytes(public_key).verify(signature, message)
    except (SignatureError, InvalidSignature) as exc:
        raise SealError(
            "signature", f"the seal of desired state {generation} does not verify with {fingerprint(public_key)}"
        ) from exc
