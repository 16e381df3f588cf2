"""The running batch: which sequence sits in which KV row, batched prefill chunks, decode
steps, and the KV budget shared with the prefix cache. Used by the engine thread alone."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edge_node.generation.kv import BatchKV, BlockBudget
from edge_node.generation.model import DecoderRunner
from edge_node.generation.prefix_cache import PrefixCache
from edge_node.generation.sequence import Sequence

__all__ = ["RunningBatch", "lone_row_rounds_apart", "plan_chunks"]


class RunningBatch:
    """Decoding sequences in rows 0…n-1, those being prefilled in rows n…n+k-1 (in order)."""

    def __init__(
        self,
        runner: DecoderRunner,
        rows: int,
        budget: BlockBudget,
        cache: PrefixCache | None,
        *,
        pad_lone_row: bool = False,
    ) -> None:
        spec = runner.spec
        self.runner = runner
        self.rows = rows
        #: A lone decoding row runs beside row 1 (``decode_step``; ``lone_row_rounds_apart``);
        #: needs ``rows`` > 1.
        self.pad_lone_row = pad_lone_row
        self.budget = budget
        self.cache = cache
        self.kv = BatchKV(
            spec.layers, rows, spec.kv_heads, spec.head_size, runner.kv_dtype, budget.block_tokens, spec.context_length
        )
        self.decoding: list[Sequence] = []
        self.prefilling: list[Sequence] = []
        self.prefilled_tokens = 0

    @property
    def size(self) -> int:
        """Sequences holding a row."""
        return len(self.decoding) + len(self.prefilling)

    @property
    def running(self) -> list[Sequence]:
        """Every sequence holding a row, in row order."""
        return [*self.decoding, *self.prefilling]

    @property
    def used_blocks(self) -> int:
        """Blocks reserved by sequences plus blocks kept by the prefix cache."""
        return self.budget.reserved + (len(self.cache) if self.cache is not None else 0)

    @property
    def prompt_backlog(self) -> int:
        """Prompt tokens admitted but not prefilled yet."""
        return sum(len(s.prompt) - s.length for s in self.prefilling)

    def can_admit(self) -> bool:
        """A row is free."""
        return self.size < self.rows

    def admit(self, seq: Sequence) -> bool:
        """Give ``seq`` the next row for prefill if its KV fits the budget (evicting cached
        prefixes as needed); False leaves it waiting."""
        need = self.budget.blocks_for(seq.limit)
        hits = self._cached_prefix(seq)
        if not self._room(need):
            return False
        self.budget.reserved += need
        seq.reserved_blocks = need
        seq.slot = self.size
        self.kv.ensure(seq.limit, self._longest())
        size = self.budget.block_tokens
        for i, block in enumerate(hits):
            self.kv.write(seq.slot, i * size, block)
        seq.length = seq.cached = len(hits) * size
        tail = self.cache.tail(seq.prompt, len(hits), len(seq.prompt) - 1 - seq.length) if self.cache else None
        if tail is not None:  # a warmed turn's last part block: the prompt runs only what follows it
            self.kv.write(seq.slot, seq.length, tail)
            seq.length = seq.cached = seq.length + tail.shape[3]
        self.prefilling.append(seq)
        return True

    def _cached_prefix(self, seq: Sequence, known: int | None = None) -> list[np.ndarray]:
        # At least the last prompt token is run again: its logits give the first token.
        if self.cache is None:
            return []
        return self.cache.lookup(seq.prompt, (len(seq.prompt) - 1) // self.budget.block_tokens, known)

    def _longest(self) -> int:
        return max((s.length for s in self.running), default=0)

    def _catch_up(self, seq: Sequence) -> None:
        """A prompt that has run nothing of its own yet takes the blocks that other prompts
        cached since it was admitted (a burst sharing a system prompt computes it once)."""
        size = self.budget.block_tokens
        if self.cache is None or seq.length != seq.cached:
            return
        known = seq.cached // size
        hits = self._cached_prefix(seq, known)
        for i in range(known, len(hits)):
            self.kv.write(seq.slot, i * size, hits[i])
        if len(hits) > known:
            seq.length = seq.cached = len(hits) * size

    def _follows(self, seq: Sequence, ahead: list[Sequence]) -> bool:
        """Whether ``seq``, which has run nothing of its own yet, should wait because a prompt
        ``ahead`` of it is about to compute (and cache) the same next block: it then takes it
        from the cache instead of computing it again."""
        if self.cache is None or seq.length != seq.cached:
            return False
        size = self.budget.block_tokens
        end = (seq.length // size + 1) * size  # its next block, whole, short of the last token
        if end > len(seq.prompt) - 1:
            return False
        head = seq.prompt[:end]
        return any(o.length < end <= len(o.prompt) and o.prompt[:end] == head for o in ahead)

    def _runnable(self) -> list[Sequence]:
        """The prefilling prompts that may run now, in row order: all but those that follow a
        prompt ahead (earlier, or already under way) computing the blocks they share."""
        out = []
        for i, seq in enumerate(self.prefilling):
            ahead = [*self.prefilling[:i], *(o for o in self.prefilling[i + 1 :] if o.length > o.cached)]
            if not self._follows(seq, ahead):
                out.append(seq)
        return out

    def prefill_step(
        self, budget_tokens: int, ready: Callable[[Sequence, np.ndarray], None] | None = None
    ) -> tuple[list[tuple[Sequence, np.ndarray]], int]:
        """Run the next prompt work, at most ``budget_tokens``: the first chunks of the fresh
        prompts (nothing cached, nothing run yet) together in one session run (see
        :func:`plan_chunks`), else the prompts under way in row order, one session run each
        (a chunk with a past runs alone), until the budget is spent. A prompt waits while one
        ahead of it computes the blocks they share (each chunk's whole blocks are cached as
        soon as it ran). Returns the sequences whose prompt is now done with the logits of
        their last prompt token, and the prompt tokens run; ``ready`` gets each of them as soon
        as its own run is over, before the step's later runs (its first token need not wait
        for them)."""
        for seq in self.prefilling:
            self._catch_up(seq)
        runnable = self._runnable()
        fresh = [s for s in runnable if s.length == 0]
        if fresh:
            lengths = plan_chunks([len(s.prompt) for s in fresh], budget_tokens)
            group = fresh[: len(lengths)]
            chunks = [s.prompt[:n] for s, n in zip(group, lengths, strict=True)]
            runs = list(self.runner.prefill_fresh(self.kv, [s.slot for s in group], chunks))
            done = [self._ran(seq, n, row, ready) for seq, n, row in zip(group, lengths, runs, strict=True)]
        else:  # short continuations share the step's budget: fewer decode steps before their first tokens
            lengths, done = [], []
            for seq in runnable:
                n = min(len(seq.prompt) - seq.length, budget_tokens - sum(lengths))
                if n <= 0:
                    break
                row = self.runner.prefill(self.kv, seq.slot, seq.prompt[seq.length : seq.length + n], seq.length)
                lengths.append(n)
                done.append(self._ran(seq, n, row, ready))
        self.prefilled_tokens += sum(lengths)
        return [(seq, row) for seq, row in done if seq.length == len(seq.prompt)], sum(lengths)

    def _ran(
        self, seq: Sequence, n: int, row: np.ndarray, ready: Callable[[Sequence, np.ndarray], None] | None
    ) -> tuple[Sequence, np.ndarray]:
        """``n`` more of ``seq``'s prompt ran: cache its whole blocks, and hand a finished prompt to ``ready``."""
        seq.length += n
        self._store_prefix(seq, seq.length)
        if seq.length == len(seq.prompt) and ready is not None:
            ready(seq, row)
        return seq, row

    def warm(self, tokens: list[int], most: int) -> int:
        """Cache the KV of ``tokens`` ahead of a prompt expected to begin with them (a chat's
        next turn: the conversation so far, the reply as its text will come back) — whole
        blocks, and the part block they end with as a tail — when the cache already holds all
        but at most ``most`` of them; run in a free row, nothing reserved (what it computes
        becomes cached blocks, within the budget). Returns the tokens run (0: all cached
        already, too many missing, or no row or room)."""
        size = self.budget.block_tokens
        whole, part = divmod(len(tokens), size)
        if self.cache is None or not tokens or not self.can_admit():
            return 0
        hits = self.cache.lookup(tokens, whole, counted=False)
        start = len(hits) * size
        if len(hits) == whole and (not part or self._has_tail(tokens, whole, part)):
            return 0
        missing = len(tokens) - start
        blocks = whole - len(hits) + (1 if part else 0)
        if missing > most:
            return 0
        if not self._room(blocks):
            return 0
        slot = self.size
        self.kv.ensure(len(tokens), self._longest())
        for i, block in enumerate(hits):
            self.kv.write(slot, i * size, block)
        if start:
            self.runner.prefill(self.kv, slot, tokens[start:], start)
        else:
            self.runner.prefill_fresh(self.kv, [slot], [tokens])
        self._store_blocks(slot, tokens, len(tokens))
        # the tail only under its whole chain (a tail whose parents are missing is never found)
        if part and self._room(1) and not self.cache.missing(tokens, whole):
            self.cache.store_tail(tokens, whole, self.kv.read(slot, whole * size, len(tokens)))
        if self.size == 0:
            self.kv.release()
        return missing

    def _has_tail(self, tokens: list[int], whole: int, part: int) -> bool:
        """Whether the cache holds the ``part`` tokens after ``whole`` blocks as a tail, all of them."""
        assert self.cache is not None
        tail = self.cache.tail(tokens, whole, part)
        return tail is not None and tail.shape[3] == part

    def join(self, seq: Sequence) -> None:
        """A sequence whose prompt is done starts decoding: it swaps rows with the first
        prefilling row, so decoding rows stay 0…n-1."""
        first = self.prefilling[0]
        if first is not seq:
            self.kv.swap_rows(first.slot, seq.slot, max(first.length, seq.length))
            index = self.prefilling.index(seq)
            first.slot, seq.slot = seq.slot, first.slot
            self.prefilling[index] = first
        self.prefilling.pop(0)
        self.decoding.append(seq)

    def decode_step(self) -> np.ndarray:
        """One decode step of every decoding row; returns logits [rows, vocab].

        With ``pad_lone_row``, a lone greedy or seeded decoding row (the streams whose tokens
        another node must be able to reproduce) runs as two: the second is row 1 as it stands
        (the first prefilling sequence, or a free row), fed the same token at its own length, so
        what it writes lands where that row has nothing yet (its next prefill chunk starts
        there); its logits are dropped. An unseeded sampled stream is never reproduced, so it
        decodes alone."""
        n = len(self.decoding)
        tokens = np.fromiter((s.pending for s in self.decoding), dtype=np.int64, count=n)
        lengths = np.fromiter((s.length for s in self.decoding), dtype=np.int64, count=n)
        if n == 1 and self.pad_lone_row and self.decoding[0].params.reproducible:
            beside = self.prefilling[0].length if self.prefilling else 0
            padded = self.runner.decode(self.kv, 2, np.repeat(tokens, 2), np.append(lengths, beside))
            logits: np.ndarray = padded[:1]
        else:
            logits = self.runner.decode(self.kv, n, tokens, lengths)
        for s in self.decoding:
            s.length += 1
        return logits

    def remove(self, seq: Sequence, *, keep_prefix: bool = True) -> None:
        """Take ``seq`` out of the batch (finished or cancelled), free its row and reservation;
        its full blocks go to the prefix cache when ``keep_prefix``. Rows stay contiguous:
        the last decoding row fills a decoding hole, the last prefilling row any hole left."""
        if keep_prefix:
            self._store_prefix(seq, seq.length)
        if seq in self.decoding:
            self._fill(self.decoding, seq)
            if self.prefilling:  # the decoding rows shrank by one: the last prefilling row moves down
                last = self.prefilling.pop()
                self._move(last, len(self.decoding))
                self.prefilling.insert(0, last)
        elif seq in self.prefilling:
            self._fill(self.prefilling, seq)
        self.budget.reserved -= seq.reserved_blocks
        seq.reserved_blocks, seq.slot = 0, -1
        if self.size == 0:
            self.kv.release()

    def _fill(self, rows: list[Sequence], seq: Sequence) -> None:
        """Drop ``seq`` from ``rows``, moving the last of them into its row."""
        last = rows.pop()
        if last is not seq:
            index = rows.index(seq)
            self._move(last, seq.slot)
            rows[index] = last

    def _move(self, seq: Sequence, slot: int) -> None:
        if seq.slot != slot:
            self.kv.move_row(seq.slot, slot, seq.length)
            seq.slot = slot

    def _store_prefix(self, seq: Sequence, tokens_with_kv: int) -> None:
        """Copy the sequence's full blocks that the cache lacks into it, as far as the budget allows."""
        self._store_blocks(seq.slot, seq.tokens, tokens_with_kv)

    def _room(self, blocks: int) -> bool:
        """Whether ``blocks`` more fit the budget, evicting the least recently used cached blocks
        as needed: a cached block gives way, a reservation never does."""
        while self.used_blocks + blocks > self.budget.total and self.cache is not None and self.cache.evict():
            pass
        return self.used_blocks + blocks <= self.budget.total

    def _store_blocks(self, slot: int, tokens: list[int], tokens_with_kv: int) -> None:
        """Copy the full blocks of ``tokens`` in row ``slot`` that the cache lacks into it, as
        far as the budget allows."""
        if self.cache is None:
            return
        size = self.budget.block_tokens
        blocks: dict[int, np.ndarray] = {}
        for index in self.cache.missing(tokens, tokens_with_kv // size):
            if not self._room(len(blocks) + 1):
                break
            blocks[index] = self.kv.read(slot, index * size, (index + 1) * size)
        self.cache.store(tokens, blocks)


def plan_chunks(remaining: list[int], budget: int) -> list[int]:
    """Chunk lengths for the first k prompts (``remaining`` tokens each, in row order) to run
    together in one right-padded run of k × width tokens, at most ``budget``.

    The width is the one that runs the most real prompt tokens (ties: the narrower, which
    finishes more short prompts); a longer prompt gets a chunk of the width and continues next
    step. One prompt alone always gets ``min(remaining, budget)``."""
    best: tuple[int, int] = (0, 0)  # (real tokens, -width)
    for width in sorted({min(r, budget) for r in remaining}):
        rows = min(len(remaining), budget // width)
        real = sum(min(r, width) for r in remaining[:rows])
        best = max(best, (real, -width))
    width = -best[1]
    rows = min(len(remaining), budget // width)
    return [min(r, width) for r in remaining[:rows]]


def lone_row_rounds_apart(runner: DecoderRunner, block_tokens: int) -> bool:
    """Whether a row decoded alone gets other numbers than the same row decoded beside another.

    On some CPUs ONNX Runtime runs a one-row MatMul (MatMulNBits included) through a kernel of
    its own that rounds differently from the many-row one (measured on an AVX2 CPU without
    AVX-512: up to 1.4e-6 apart, while two, three or thirty rows agree bit for bit). A greedy
    or seeded stream's tokens then depend on whether it happened to decode alone, so a stream
    resumed on another node would not continue exactly. Two decode steps of one row and of
    two identical rows on scratch buffers tell; a few milliseconds at load."""
    spec = runner.spec
    logits = []
    for rows in (1, 2):
        kv = BatchKV(spec.layers, 2, spec.kv_heads, spec.head_size, runner.kv_dtype, block_tokens, spec.context_length)
        kv.ensure(2, 0)
        steps = [
            runner.decode(kv, rows, np.full(rows, token, np.int64), np.full(rows, length, np.int64))[0]
            for length, token in enumerate((1, 2))
        ]
        logits.append(np.stack(steps))
    return not np.array_equal(logits[0], logits[1])
