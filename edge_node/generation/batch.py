"""The running batch: which sequence sits in which KV row, prefill chunks, decode steps,
and the KV budget shared with the prefix cache. Used by the engine thread alone."""

from __future__ import annotations

import numpy as np

from edge_node.generation.kv import BatchKV, BlockBudget
from edge_node.generation.model import DecoderRunner
from edge_node.generation.prefix_cache import PrefixCache
from edge_node.generation.sequence import Sequence

__all__ = ["RunningBatch"]


class RunningBatch:
    """Decoding sequences in rows 0…n-1, the one being prefilled in row n."""

    def __init__(self, runner: DecoderRunner, rows: int, budget: BlockBudget, cache: PrefixCache | None) -> None:
        spec = runner.spec
        self.runner = runner
        self.rows = rows
        self.budget = budget
        self.cache = cache
        self.kv = BatchKV(
            spec.layers, rows, spec.kv_heads, spec.head_size, runner.kv_dtype, budget.block_tokens, spec.context_length
        )
        self.decoding: list[Sequence] = []
        self.prefilling: Sequence | None = None
        self.prefilled_tokens = 0

    @property
    def size(self) -> int:
        """Sequences holding a row."""
        return len(self.decoding) + (self.prefilling is not None)

    @property
    def used_blocks(self) -> int:
        """Blocks reserved by sequences plus blocks kept by the prefix cache."""
        return self.budget.reserved + (len(self.cache) if self.cache is not None else 0)

    def can_admit(self) -> bool:
        """A row is free and no prefill is under way."""
        return self.prefilling is None and len(self.decoding) < self.rows

    def admit(self, seq: Sequence) -> bool:
        """Give ``seq`` the prefill row if its KV fits the budget (evicting cached prefixes
        as needed); False leaves it waiting."""
        need = self.budget.blocks_for(seq.limit)
        hits = self._cached_prefix(seq)
        while self.used_blocks + need > self.budget.total and self.cache is not None and self.cache.evict():
            pass
        if self.used_blocks + need > self.budget.total:
            return False
        self.budget.reserved += need
        seq.reserved_blocks = need
        seq.slot = len(self.decoding)
        self.kv.ensure(seq.limit, self._longest())
        for i, block in enumerate(hits):
            self.kv.write(seq.slot, i * self.budget.block_tokens, block)
        seq.length = seq.cached = len(hits) * self.budget.block_tokens
        self.prefilling = seq
        return True

    def _cached_prefix(self, seq: Sequence) -> list[np.ndarray]:
        # At least the last prompt token is run again: its logits give the first token.
        if self.cache is None:
            return []
        return self.cache.lookup(seq.prompt, (len(seq.prompt) - 1) // self.budget.block_tokens)

    def _longest(self) -> int:
        rows = [*self.decoding, *([self.prefilling] if self.prefilling else [])]
        return max((s.length for s in rows), default=0)

    def prefill_step(self, budget_tokens: int) -> tuple[Sequence, np.ndarray | None, int]:
        """Run up to ``budget_tokens`` of the prefilling sequence's prompt. Returns it, the
        logits of its last prompt token once the prompt is done (else None), and tokens run."""
        seq = self.prefilling
        assert seq is not None
        chunk = seq.prompt[seq.length : seq.length + budget_tokens]
        logits = self.runner.prefill(self.kv, seq.slot, chunk, seq.length)
        seq.length += len(chunk)
        self.prefilled_tokens += len(chunk)
        if seq.length < len(seq.prompt):
            return seq, None, len(chunk)
        self.prefilling = None
        self._store_prefix(seq, len(seq.prompt))
        return seq, logits, len(chunk)

    def join(self, seq: Sequence) -> None:
        """The sequence just prefilled (still in row n) starts decoding."""
        assert seq.slot == len(self.decoding)
        self.decoding.append(seq)

    def decode_step(self) -> np.ndarray:
        """One decode step of every decoding row; returns logits [rows, vocab]."""
        tokens = np.fromiter((s.pending for s in self.decoding), dtype=np.int64, count=len(self.decoding))
        lengths = np.fromiter((s.length for s in self.decoding), dtype=np.int64, count=len(self.decoding))
        logits = self.runner.decode(self.kv, len(self.decoding), tokens, lengths)
        for s in self.decoding:
            s.length += 1
        return logits

    def remove(self, seq: Sequence, *, keep_prefix: bool = True) -> None:
        """Take ``seq`` out of the batch (finished or cancelled), free its row and reservation;
        its full blocks go to the prefix cache when ``keep_prefix``."""
        if keep_prefix:
            self._store_prefix(seq, seq.length)
        if seq is self.prefilling:
            self.prefilling = None
        elif seq in self.decoding:
            last = self.decoding.pop()
            if last is not seq:
                index = self.decoding.index(seq)
                self.kv.move_row(last.slot, seq.slot, last.length)
                last.slot = seq.slot
                self.decoding[index] = last
            if self.prefilling is not None:
                self.kv.move_row(self.prefilling.slot, len(self.decoding), self.prefilling.length)
                self.prefilling.slot = len(self.decoding)
        self.budget.reserved -= seq.reserved_blocks
        seq.reserved_blocks, seq.slot = 0, -1
        if self.size == 0:
            self.kv.release()

    def _store_prefix(self, seq: Sequence, tokens_with_kv: int) -> None:
        """Copy the sequence's full blocks that the cache lacks into it, as far as the budget allows."""
        if self.cache is None:
            return
        size = self.budget.block_tokens
        tokens = seq.tokens
        blocks: dict[int, np.ndarray] = {}
        for index in self.cache.missing(tokens, tokens_with_kv // size):
            # a cached block never displaces a reservation; it may displace older cached blocks
            while self.used_blocks + len(blocks) + 1 > self.budget.total and self.cache.evict():
                pass
            if self.used_blocks + len(blocks) + 1 > self.budget.total:
                break
            blocks[index] = self.kv.read(seq.slot, index * size, (index + 1) * size)
        self.cache.store(tokens, blocks)
