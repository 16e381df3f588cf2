"""Where the KV lives: one right-padded buffer per layer for the running batch, and the
block accounting that keeps every sequence within the budget.

``BatchKV`` holds keys and values as ``[rows, kv_heads, capacity, head_size]`` per layer.
Decoding sequences occupy rows 0…n-1 and those being prefilled the rows after them, so a
decode step binds the contiguous view ``[:n]``; when a sequence leaves, the last row moves
into its place (a copy of that row's used length, once, instead of a copy of the batch
every step)."""

from __future__ import annotations

import numpy as np

__all__ = ["BatchKV", "BlockBudget"]


class BatchKV:
    """The batch's KV buffers; capacity grows (by reallocating) to the longest admitted sequence."""

    def __init__(
        self, layers: int, rows: int, kv_heads: int, head_size: int, dtype: np.dtype, block: int, most: int
    ) -> None:
        self._shape = (rows, kv_heads, 0, head_size)
        self._dtype = dtype
        self._block = block
        self._most = -(-most // block) * block
        self.keys: list[np.ndarray] = [np.zeros(self._shape, dtype) for _ in range(layers)]
        self.values: list[np.ndarray] = [np.zeros(self._shape, dtype) for _ in range(layers)]

    @property
    def capacity(self) -> int:
        """Tokens each row can hold now."""
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes the buffers take."""
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def ensure(self, tokens: int, used: int) -> None:
        """Make every row hold at least ``tokens`` (rounded up to a block, doubled on growth);
        the first ``used`` positions of every row are kept."""
        if tokens <= self.capacity:
            return
        capacity = max(tokens, 2 * self.capacity)
        capacity = min(-(-capacity // self._block) * self._block, max(self._most, tokens))
        rows, heads, _, head = self._shape
        for arrays in (self.keys, self.values):
            for i, old in enumerate(arrays):
                new = np.zeros((rows, heads, capacity, head), self._dtype)
                new[:, :, :used] = old[:, :, :used]
                arrays[i] = new

    def release(self) -> None:
        """Drop the buffers (the batch is empty)."""
        self.keys = [np.zeros(self._shape, self._dtype) for _ in self.keys]
        self.values = [np.zeros(self._shape, self._dtype) for _ in self.values]

    def move_row(self, source: int, target: int, length: int) -> None:
        """Copy the first ``length`` positions of row ``source`` into row ``target``."""
        for arrays in (self.keys, self.values):
            for a in arrays:
                a[target, :, :length] = a[source, :, :length]

    def swap_rows(self, a: int, b: int, length: int) -> None:
        """Exchange the first ``length`` positions of rows ``a`` and ``b``."""
        for arrays in (self.keys, self.values):
            for arr in arrays:
                arr[[a, b], :, :length] = arr[[b, a], :, :length]

    def read(self, row: int, start: int, stop: int) -> np.ndarray:
        """A copy of positions start…stop-1 of ``row``: ``[layers, 2, kv_heads, stop-start, head]``."""
        return np.stack(
            [
                np.stack([k[row, :, start:stop], v[row, :, start:stop]])
                for k, v in zip(self.keys, self.values, strict=True)
            ]
        )

    def write(self, row: int, start: int, block: np.ndarray) -> None:
        """Put a block from :meth:`read` at position ``start`` of ``row``."""
        stop = start + block.shape[3]
        for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            k[row, :, start:stop] = block[layer, 0]
            v[row, :, start:stop] = block[layer, 1]


class BlockBudget:
    """The KV budget in blocks: reservations of admitted sequences plus cached prefix blocks."""

    def __init__(self, total_blocks: int, block_tokens: int) -> None:
        self.total = total_blocks
        self.block_tokens = block_tokens
        self.reserved = 0

    def blocks_for(self, tokens: int) -> int:
        """Blocks that ``tokens`` tokens need."""
        return -(-tokens // self.block_tokens)
