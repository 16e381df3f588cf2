"""The two decoder layouts the engine drives, and :func:`open_runner`, which picks one.

**In place** (:class:`InPlaceRunner`): ONNX Runtime GenAI's CPU graph, whose
GroupQueryAttention (``do_rotary``) derives each row's length and rotary positions from
``attention_mask`` (its row sum) and writes a step's keys and values into ``present`` at each
row's own length. Binding ``past`` and ``present`` to the same buffer (IOBinding; GenAI calls
it ``past_present_share_buffer``) makes that write happen in place: rows of different lengths
share one right-padded buffer, and a decode step copies no KV at all.

**Concatenating** (:class:`ConcatRunner`): the plain-attention graph Optimum's ONNX export
writes (``position_ids`` input; ``present`` = ``past`` concatenated with the step's keys and
values, so it is a new, longer tensor every step and cannot alias the buffer). Each row's
positions come from ``position_ids``; the right-padded past of a batch is masked by
``attention_mask`` (0 over each row's padding, then 1 for the new token), and after the run the
new keys and values are copied from ``present`` into each row at its own length. That costs a
copy of the batch's used KV into the graph per step, which the in-place layout avoids."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from edge_node.generation.kv import BatchKV
from edge_node.generation.model import DecoderRunner, DecoderSpec, ModelLoadError
from edge_node.generation.settings import EngineSettings

__all__ = ["ConcatRunner", "InPlaceRunner", "open_runner"]


def open_runner(folder: Path, spec: DecoderSpec, settings: EngineSettings) -> DecoderRunner:
    """The runner for the graph in ``folder``: in place for GroupQueryAttention, concatenating
    for plain attention with ``position_ids``; ModelLoadError for anything else."""
    try:
        graph = onnx.load(str(folder / spec.filename), load_external_data=False).graph
    except Exception as exc:  # missing, truncated or not protobuf: say which file
        raise ModelLoadError(f"{spec.filename} is not a readable ONNX model: {exc}") from exc
    if any(n.op_type == "GroupQueryAttention" for n in graph.node):
        return InPlaceRunner(folder, spec, settings)
    if any(i.name == spec.position_ids for i in graph.input):
        return ConcatRunner(folder, spec, settings)
    raise ModelLoadError(
        f"{spec.filename} has neither GroupQueryAttention (which derives each row's positions from "
        f"attention_mask) nor a {spec.position_ids!r} input: rows of different lengths in one batch "
        "would get wrong rotary positions"
    )


def _padded(chunks: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Chunks right-padded to the longest (token 0), and their lengths."""
    lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    input_ids = np.zeros((len(chunks), int(lengths.max())), dtype=np.int64)
    for i, chunk in enumerate(chunks):
        input_ids[i, : len(chunk)] = chunk
    return input_ids, lengths


class InPlaceRunner(DecoderRunner):
    """GroupQueryAttention graphs: ``past`` and ``present`` bound to the same buffer rows."""

    def __init__(self, folder: Path, spec: DecoderSpec, settings: EngineSettings) -> None:
        super().__init__(folder, spec, settings, positions=False)

    def prefill(self, kv: BatchKV, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        input_ids = np.asarray([ids], dtype=np.int64)
        mask = np.ones((1, start + len(ids)), dtype=np.int64)
        logits = self._run(kv, slice(slot, slot + 1), input_ids, mask)
        return logits[0, -1]

    def prefill_fresh(self, kv: BatchKV, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> np.ndarray:
        """GroupQueryAttention batches chunks of several tokens only with no past (its "first
        prompt" mode; with a past it wants batch 1). So the past is empty, the chunks are
        right-padded to the longest with the mask covering the real tokens only, and
        ``present`` comes back as new tensors whose rows are copied into the buffer (a few
        MB; the run itself costs far more)."""
        input_ids, lengths = _padded(chunks)
        rows, width = input_ids.shape
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        s = self.spec
        binding = self.session.io_binding()
        binding.bind_cpu_input(s.input_ids, input_ids)
        binding.bind_cpu_input(s.attention_mask, mask)
        empty = np.zeros((rows, s.kv_heads, 0, s.head_size), self.kv_dtype)
        for layer in range(s.layers):
            for name in (s.past_key, s.past_value):
                binding.bind_cpu_input(name % layer, empty)
        names = [s.logits] + [n % layer for layer in range(s.layers) for n in (s.present_key, s.present_value)]
        for name in names:
            binding.bind_output(name)
        self.session.run_with_iobinding(binding)
        logits, *present = (v.numpy() for v in binding.get_outputs())
        for layer in range(s.layers):
            keys, values = present[2 * layer], present[2 * layer + 1]
            for i, (slot, n) in enumerate(zip(slots, lengths, strict=True)):
                kv.keys[layer][slot, :, :n] = keys[i, :, :n]
                kv.values[layer][slot, :, :n] = values[i, :, :n]
        out: np.ndarray = logits[np.arange(rows), lengths - 1]
        return out

    def decode(self, kv: BatchKV, rows: int, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        width = int(lengths.max()) + 1
        mask = (np.arange(width)[None, :] <= lengths[:, None]).astype(np.int64)
        logits = self._run(kv, slice(0, rows), tokens.reshape(rows, 1).astype(np.int64), mask)
        return logits[:, -1]

    def _run(self, kv: BatchKV, rows: slice, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        s = self.spec
        binding = self.session.io_binding()
        binding.bind_cpu_input(s.input_ids, input_ids)
        binding.bind_cpu_input(s.attention_mask, mask)
        binding.bind_output(s.logits)
        for layer in range(s.layers):
            for past, present, buf in (
                (s.past_key, s.present_key, kv.keys[layer]),
                (s.past_value, s.present_value, kv.values[layer]),
            ):
                value = ort.OrtValue.ortvalue_from_numpy(buf[rows])
                binding.bind_ortvalue_input(past % layer, value)
                binding.bind_ortvalue_output(present % layer, value)
        self.session.run_with_iobinding(binding)
        out: np.ndarray = binding.get_outputs()[0].numpy()
        return out


class ConcatRunner(DecoderRunner):
    """Plain-attention graphs with ``position_ids``: the past goes in as a copy of the used
    part of the buffer, the new keys and values come back in ``present`` and are copied to
    each row's own length."""

    def __init__(self, folder: Path, spec: DecoderSpec, settings: EngineSettings) -> None:
        super().__init__(folder, spec, settings, positions=True)

    def prefill(self, kv: BatchKV, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        rows = slice(slot, slot + 1)
        input_ids = np.asarray([ids], dtype=np.int64)
        mask = np.ones((1, start + len(ids)), dtype=np.int64)
        positions = np.arange(start, start + len(ids), dtype=np.int64)[None]
        logits, present = self._run(kv, rows, start, input_ids, mask, positions)
        for layer, (keys, values) in enumerate(present):
            kv.keys[layer][slot, :, start : start + len(ids)] = keys[0, :, start:]
            kv.values[layer][slot, :, start : start + len(ids)] = values[0, :, start:]
        out: np.ndarray = logits[0, -1]
        return out

    def prefill_fresh(self, kv: BatchKV, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> np.ndarray:
        """Right-padded chunks with no past; the mask covers the real tokens, whose causal
        attention never reaches the padding after them."""
        input_ids, lengths = _padded(chunks)
        rows, width = input_ids.shape
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        positions = np.broadcast_to(np.arange(width, dtype=np.int64), (rows, width))
        logits, present = self._run(kv, None, 0, input_ids, mask, np.ascontiguousarray(positions))
        for layer, (keys, values) in enumerate(present):
            for i, (slot, n) in enumerate(zip(slots, lengths, strict=True)):
                kv.keys[layer][slot, :, :n] = keys[i, :, :n]
                kv.values[layer][slot, :, :n] = values[i, :, :n]
        out: np.ndarray = logits[np.arange(rows), lengths - 1]
        return out

    def decode(self, kv: BatchKV, rows: int, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The past is every row's first ``max(lengths)`` positions; a row's padding beyond its
        length is masked, and its new token (position ``lengths[i]``) sits at the end."""
        width = int(lengths.max())
        mask = np.ones((rows, width + 1), dtype=np.int64)
        mask[:, :width] = np.arange(width)[None, :] < lengths[:, None]
        logits, present = self._run(kv, slice(0, rows), width, tokens.reshape(rows, 1), mask, lengths.reshape(rows, 1))
        index = np.arange(rows)
        for layer, (keys, values) in enumerate(present):
            kv.keys[layer][index, :, lengths] = keys[:, :, width]
            kv.values[layer][index, :, lengths] = values[:, :, width]
        out: np.ndarray = logits[:, -1]
        return out

    def _run(
        self,
        kv: BatchKV,
        rows: slice | None,
        past: int,
        input_ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Run with the first ``past`` positions of ``rows`` as the past (None: an empty past
        for ``len(input_ids)`` rows); returns logits and each layer's (key, value) present."""
        s = self.spec
        feed: dict[str, np.ndarray] = {s.input_ids: input_ids, s.attention_mask: mask, s.position_ids: positions}
        empty = np.zeros((len(input_ids), s.kv_heads, 0, s.head_size), self.kv_dtype)
        for layer in range(s.layers):
            for name, buf in ((s.past_key, kv.keys[layer]), (s.past_value, kv.values[layer])):
                feed[name % layer] = empty if rows is None else np.ascontiguousarray(buf[rows, :, :past])
        names = [s.logits] + [n % layer for layer in range(s.layers) for n in (s.present_key, s.present_value)]
        logits, *present = self.session.run(names, feed)
        return logits, [(present[2 * i], present[2 * i + 1]) for i in range(s.layers)]
