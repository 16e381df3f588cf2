"""The prefix cache: the KV of prompt prefixes seen before, in whole blocks, LRU within the budget.

Block i of a sequence is keyed by a hash chain over the token ids of blocks 0…i, since its
keys and values depend on every token before it (and on its positions, which a prefix
shares). A hit on block i therefore implies blocks 0…i-1 match too. Looking a chain up
touches its deepest block first, so a parent is always more recently used than its
children and LRU eviction never strands a child whose parent is gone.

A *tail* is a part of a block, fewer tokens than a block after a chain of whole ones: what a
warmed chat turn ends with (``RunningBatch.warm``), so that the next turn runs only its own
tokens. It takes a block of the budget, and a prompt takes the longest tail that its tokens
begin with."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PrefixCache"]


@dataclass(slots=True)
class _Block:
    parent: int
    tokens: tuple[int, ...]
    kv: np.ndarray


class PrefixCache:
    """Blocks of KV keyed by their prefix; the engine thread alone uses it."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self._tails: dict[int, Counter[int]] = {}
        """Per parent key, the lengths of the tails cached under it."""
        self.queries = 0
        """Blocks looked up (total)."""
        self.hits = 0
        """Blocks found (total)."""

    def __len__(self) -> int:
        return len(self._blocks)

    def _chain(self, tokens: Sequence[int], blocks: int) -> list[tuple[int, int, tuple[int, ...]]]:
        """(key, parent key, tokens) of the first ``blocks`` blocks of ``tokens``."""
        chain, parent, size = [], 0, self.block_tokens
        for i in range(blocks):
            part = tuple(tokens[i * size : (i + 1) * size])
            key = hash((parent, part))
            chain.append((key, parent, part))
            parent = key
        return chain

    def lookup(
        self, tokens: Sequence[int], max_blocks: int, known: int | None = None, *, counted: bool = True
    ) -> list[np.ndarray]:
        """The cached KV of the longest run of leading blocks of ``tokens`` (at most ``max_blocks``).

        ``known``: the prompt was looked up before and found that many blocks; this second look
        (blocks another prompt has cached since) counts only the blocks found beyond them, and no
        queries, so every prompt's blocks are queried once in the counters. ``counted=False``:
        not a prompt's look (a turn warmed ahead), left out of the counters."""
        found: list[tuple[int, _Block]] = []
        chain = self._chain(tokens, max_blocks)
        self.queries += len(chain) if known is None and counted else 0
        for key, parent, part in chain:
            block = self._blocks.get(key)
            if block is None or block.parent != parent or block.tokens != part:
                break
            found.append((key, block))
        self.hits += max(0, len(found) - (known or 0)) if counted else 0
        for key, _ in reversed(found):
            self._blocks.move_to_end(key)
        return [block.kv for _, block in found]

    def missing(self, tokens: Sequence[int], blocks: int) -> list[int]:
        """Indexes of the first ``blocks`` blocks of ``tokens`` that are not cached."""
        return [i for i, (key, _, _) in enumerate(self._chain(tokens, blocks)) if key not in self._blocks]

    def store(self, tokens: Sequence[int], blocks: dict[int, np.ndarray]) -> None:
        """Cache ``blocks`` (block index → KV) of ``tokens``, and mark the chain up to the
        deepest of them used, deepest first."""
        if not blocks:
            return
        chain = self._chain(tokens, max(blocks) + 1)
        for index, kv in blocks.items():
            key, parent, part = chain[index]
            self._put(key, _Block(parent, part, kv))
        self._touch(chain)

    def _put(self, key: int, block: _Block) -> None:
        """Cache ``block`` under ``key``, keeping the tail lengths right whatever it replaces
        (keys are hashes: a tail and a whole block may collide, and the later one wins)."""
        old = self._blocks.get(key)
        if old is not None:
            self._forget(old)
        self._blocks[key] = block
        if len(block.tokens) < self.block_tokens:
            self._tails.setdefault(block.parent, Counter())[len(block.tokens)] += 1

    def _forget(self, block: _Block) -> None:
        """``block`` leaves the cache: a tail's length is no longer counted under its parent."""
        n = len(block.tokens)
        lengths = self._tails.get(block.parent)
        if n >= self.block_tokens or lengths is None:
            return
        lengths[n] -= 1
        if lengths[n] <= 0:
            del lengths[n]
        if not lengths:
            del self._tails[block.parent]

    def store_tail(self, tokens: Sequence[int], whole: int, kv: np.ndarray) -> None:
        """Cache ``kv``, the KV of ``tokens`` after their first ``whole`` blocks (fewer than a
        block of them), as a tail under those blocks; the chain is marked used after it."""
        size = self.block_tokens
        part = tuple(tokens[whole * size :])
        if not 0 < len(part) < size:
            raise ValueError(f"a tail holds 1 to {size - 1} tokens, not {len(part)}")
        chain = self._chain(tokens, whole)
        parent = chain[-1][0] if chain else 0
        self._put(hash((parent, part)), _Block(parent, part, kv))
        self._touch(chain)

    def tail(self, tokens: Sequence[int], whole: int, most: int) -> np.ndarray | None:
        """The KV of the longest cached tail under the first ``whole`` blocks of ``tokens`` that
        ``tokens`` go on with, at most ``most`` tokens long (None: none)."""
        chain = self._chain(tokens, whole)
        parent = chain[-1][0] if chain else 0
        rest = tokens[whole * self.block_tokens :]
        for n in sorted(self._tails.get(parent, ()), reverse=True):
            if n > min(most, len(rest)):
                continue
            part = tuple(rest[:n])
            key = hash((parent, part))
            block = self._blocks.get(key)
            if block is not None and block.parent == parent and block.tokens == part:
                self._blocks.move_to_end(key)
                self._touch(chain)
                return block.kv
        return None

    def _touch(self, chain: list[tuple[int, int, tuple[int, ...]]]) -> None:
        """Mark a chain's cached blocks used, deepest first (parents end up the newest)."""
        for key, _, _ in reversed(chain):
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def evict(self) -> bool:
        """Drop the least recently used block; False when the cache is empty."""
        if not self._blocks:
            return False
        _, block = self._blocks.popitem(last=False)
        self._forget(block)
        return True

    def clear(self) -> None:
        """Drop every block."""
        self._blocks.clear()
        self._tails.clear()
