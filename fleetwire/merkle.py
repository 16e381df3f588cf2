"""A Merkle tree of SHA-256 in the shape and hashing of RFC 6962 / RFC 9162 (Certificate
Transparency), and the check of one leaf's inclusion proof.

Central seals a fleet-wide change with one signature over the root of a tree whose leaves
are the nodes' seals (``fleetwire.sealing``); each node gets its leaf's audit path and
recomputes the root. Leaves hash as ``SHA-256(0x00 || leaf)`` and inner nodes as
``SHA-256(0x01 || left || right)``: without the two prefixes an inner node's 64 bytes could
be offered as a leaf (a second preimage), and a proof for a made-up "leaf" would verify.

The tree is built level by level; a level's last node without a partner moves up as it is.
That is exactly RFC 6962's recursive split at the largest power of two below the size, and
the audit path and its check are RFC 9162's (section 2.1.3), so the shape of a path follows
from the leaf's index and the tree's size alone, which the signature covers."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

#: Bytes of every hash (SHA-256).
HASH_SIZE = 32
#: The longest audit path accepted (a tree of 2**64 leaves would need 64).
MAX_PATH = 64

_LEAF = b"\x00"
_NODE = b"\x01"


class ProofError(ValueError):
    """An inclusion proof that cannot be one: an index outside the tree, a path of the wrong
    length for the index and size, or a path element that is no SHA-256 hash."""


def leaf_hash(leaf: bytes) -> bytes:
    """The hash of one leaf."""
    return hashlib.sha256(_LEAF + leaf).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an inner node."""
    return hashlib.sha256(_NODE + left + right).digest()


class MerkleTree:
    """Every level of the tree over some leaves (at least one), kept to hand out paths."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        """The tree over ``leaves`` (their bytes: each is hashed as a leaf here)."""
        if not leaves:
            raise ValueError("a Merkle tree needs at least one leaf")
        sha256 = hashlib.sha256  # a local: these loops are the whole cost of a 10k-leaf tree
        level = [sha256(_LEAF + x).digest() for x in leaves]
        self._levels = [level]
        while len(level) > 1:
            up = [sha256(_NODE + a + b).digest() for a, b in zip(level[0::2], level[1::2], strict=False)]
            if len(level) % 2:
                up.append(level[-1])
            self._levels.append(up)
            level = up

    @property
    def size(self) -> int:
        """How many leaves."""
        return len(self._levels[0])

    @property
    def root(self) -> bytes:
        """The root hash (the leaf's own hash in a tree of one)."""
        return self._levels[-1][0]

    def path(self, index: int) -> list[bytes]:
        """The audit path of leaf ``index``, bottom up (RFC 9162 order)."""
        if not 0 <= index < self.size:
            raise IndexError(f"leaf {index} of a tree of {self.size}")
        path = []
        for level in self._levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):  # else this node moves up alone: no hash on the path
                path.append(level[sibling])
            index >>= 1
        return path

    def packed_paths(self) -> list[bytes]:
        """Every leaf's audit path, its hashes concatenated (``split_path`` undoes it).

        Top down, each node's path is its sibling's hash before its parent's path, so the
        two children of a node share everything above them: one concatenation per node of
        the tree instead of one list per leaf and level (a third of the time at 10k leaves)."""
        paths = [b""]
        for level in reversed(self._levels[:-1]):
            last = len(level) - 1
            alone = last % 2 == 0  # an odd count: the last node moves up alone, nothing added for it
            down = [level[i ^ 1] + paths[i >> 1] for i in range(last if alone else last + 1)]
            if alone:
                down.append(paths[last >> 1])
            paths = down
        return paths


def split_path(packed: bytes) -> list[bytes]:
    """The hashes of a packed audit path; ProofError when it is no whole number of hashes."""
    if len(packed) % HASH_SIZE or len(packed) > MAX_PATH * HASH_SIZE:
        raise ProofError(f"an audit path of {len(packed)} bytes is no path of SHA-256 hashes")
    return [packed[i : i + HASH_SIZE] for i in range(0, len(packed), HASH_SIZE)]


def root_from_path(leaf: bytes, index: int, size: int, path: Sequence[bytes]) -> bytes:
    """The root that ``path`` proves ``leaf`` (the leaf's bytes, not its hash) to sit under at
    ``index`` of a tree of ``size`` leaves; ProofError when the path cannot be one for them.

    A wrong path or leaf gives another root, so only the signature over the root decides."""
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is outside a tree of {size}")
    if len(path) > MAX_PATH:
        raise ProofError(f"an audit path of {len(path)} hashes is longer than any tree needs")
    fn, sn, r = index, size - 1, leaf_hash(leaf)
    for p in path:
        if len(p) != HASH_SIZE:
            raise ProofError(f"an audit path element of {len(p)} bytes is no SHA-256 hash")
        if sn == 0:
            raise ProofError(f"the audit path is too long for leaf {index} of {size}")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:  # the levels this node moved up alone
                fn >>= 1
                sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(f"the audit path is too short for leaf {index} of {size}")
    return r
