"""The Merkle tree under a batch of seals: RFC 6962's shape and hashing, and audit paths that
prove exactly one leaf at exactly one place of a tree of exactly one size."""

from __future__ import annotations

import hashlib

import pytest

from fleetwire.merkle import MerkleTree, ProofError, leaf_hash, node_hash, root_from_path

LEAVES = [f"leaf {i}".encode() for i in range(33)]


def _rfc6962_root(leaves: list[bytes]) -> bytes:
    """MTH as RFC 6962 section 2.1 defines it, recursively."""
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1 << ((len(leaves) - 1).bit_length() - 1)  # the largest power of two below the size
    return hashlib.sha256(b"\x01" + _rfc6962_root(leaves[:k]) + _rfc6962_root(leaves[k:])).digest()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 31, 33])
def test_every_leaf_proves_the_rfc6962_root(size: int) -> None:
    leaves = LEAVES[:size]
    tree = MerkleTree(leaves)
    assert tree.root == _rfc6962_root(leaves) and tree.size == size
    packed = tree.packed_paths()
    for i, leaf in enumerate(leaves):
        path = tree.path(i)
        assert len(path) <= (size - 1).bit_length() and packed[i] == b"".join(path)
        assert root_from_path(leaf, i, size, path) == tree.root


def test_a_wrong_leaf_path_or_index_proves_another_root() -> None:
    tree = MerkleTree(LEAVES[:13])
    path = tree.path(5)
    assert root_from_path(LEAVES[6], 5, 13, path) != tree.root  # a swapped leaf
    flipped = [path[0][:-1] + bytes([path[0][-1] ^ 1]), *path[1:]]
    assert root_from_path(LEAVES[5], 5, 13, flipped) != tree.root
    assert root_from_path(LEAVES[5], 4, 13, path) != tree.root  # the same path at another place


@pytest.mark.parametrize(
    ("index", "size", "path_change"),
    [
        (13, 13, 0),  # outside the tree
        (0, 0, 0),  # no tree
        (5, 13, -1),  # too short
        (5, 13, +1),  # too long
        (12, 13, +1),  # the last leaf moves up alone: one hash fewer than the others
    ],
)
def test_a_path_that_cannot_be_one_is_refused(index: int, size: int, path_change: int) -> None:
    tree = MerkleTree(LEAVES[:13])
    path = tree.path(min(index, 12))
    path = path[:-1] if path_change < 0 else path + [bytes(32)] * path_change
    with pytest.raises(ProofError):
        root_from_path(LEAVES[min(index, 12)], index, size, path)


def test_a_path_element_that_is_no_hash_is_refused() -> None:
    tree = MerkleTree(LEAVES[:4])
    with pytest.raises(ProofError):
        root_from_path(LEAVES[0], 0, 4, [tree.path(0)[0] + b"\x00", tree.path(0)[1]])


def test_an_inner_node_offered_as_a_leaf_proves_nothing() -> None:
    """Domain separation: the two children of an inner node, as a leaf's bytes, do not hash to it."""
    tree = MerkleTree(LEAVES[:4])
    left, right = (
        node_hash(leaf_hash(LEAVES[0]), leaf_hash(LEAVES[1])),
        node_hash(leaf_hash(LEAVES[2]), leaf_hash(LEAVES[3])),
    )
    assert node_hash(left, right) == tree.root
    assert root_from_path(left + right, 0, 1, []) != tree.root
    assert root_from_path(left, 0, 2, [right]) != tree.root


def test_a_tree_needs_a_leaf() -> None:
    with pytest.raises(ValueError):
        MerkleTree([])
