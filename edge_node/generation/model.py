"""The decoder graph of a GenAI-builder folder: what ``genai_config.json`` says, and one ONNX
Runtime session that runs prefill chunks and batched decode steps in place on a KV buffer.

The builder's CPU graph (GroupQueryAttention with ``do_rotary``) derives each row's length
and rotary positions from ``attention_mask`` (its row sum), and writes a step's keys and
values into ``present`` at each row's own length. Binding ``past`` and ``present`` to the
same buffer (ONNX Runtime's IOBinding; GenAI calls it ``past_present_share_buffer``) makes
that write happen in place: rows of different lengths share one right-padded buffer, and a
step copies no KV at all."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edge_node.generation.kv import BatchKV
from edge_node.generation.settings import EngineSettings

__all__ = ["DecoderRunner", "DecoderSpec", "ModelLoadError"]

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class ModelLoadError(ValueError):
    """The folder is not a decoder this engine can serve (names the file and the field)."""


@dataclass(frozen=True, slots=True)
class DecoderSpec:
    """The decoder's shape and tensor names, from ``genai_config.json``."""

    filename: str
    layers: int
    kv_heads: int
    head_size: int
    vocab_size: int
    context_length: int
    eos_token_ids: tuple[int, ...]
    input_ids: str
    attention_mask: str
    past_key: str
    past_value: str
    logits: str
    present_key: str
    present_value: str

    @classmethod
    def from_folder(cls, folder: Path) -> DecoderSpec:
        """Read ``genai_config.json``; ModelLoadError naming the missing field."""
        path = folder / "genai_config.json"
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
            model = config["model"]
            decoder = model["decoder"]
            inputs, outputs = decoder.get("inputs", {}), decoder.get("outputs", {})
            eos = model.get("eos_token_id", [])
            return cls(
                filename=str(decoder.get("filename", "model.onnx")),
                layers=int(decoder["num_hidden_layers"]),
                kv_heads=int(decoder["num_key_value_heads"]),
                head_size=int(decoder["head_size"]),
                vocab_size=int(model["vocab_size"]),
                context_length=int(model.get("context_length") or config.get("search", {})["max_length"]),
                eos_token_ids=tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])),
                input_ids=inputs.get("input_ids", "input_ids"),
                attention_mask=inputs.get("attention_mask", "attention_mask"),
                past_key=inputs.get("past_key_names", "past_key_values.%d.key"),
                past_value=inputs.get("past_value_names", "past_key_values.%d.value"),
                logits=outputs.get("logits", "logits"),
                present_key=outputs.get("present_key_names", "present.%d.key"),
                present_value=outputs.get("present_value_names", "present.%d.value"),
            )
        except FileNotFoundError as exc:
            raise ModelLoadError(f"{path.name} is missing: not a GenAI-layout language model") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path.name}: missing or bad field {exc}") from exc


class DecoderRunner:
    """One ONNX Runtime session of the decoder, run only from the engine thread."""

    def __init__(self, folder: Path, spec: DecoderSpec, settings: EngineSettings) -> None:
        self.spec = spec
        self.session = ort.InferenceSession(
            str(folder / spec.filename), _session_options(settings), providers=["CPUExecutionProvider"]
        )
        self._check_graph()
        past = {i.name: i for i in self.session.get_inputs()}[spec.past_key % 0]
        self.kv_dtype = np.dtype(_DTYPES.get(past.type, np.float32))
        self.bytes_per_token = spec.layers * 2 * spec.kv_heads * spec.head_size * self.kv_dtype.itemsize

    def _check_graph(self) -> None:
        names = {i.name for i in self.session.get_inputs()}
        outputs = {o.name for o in self.session.get_outputs()}
        s = self.spec
        need = [s.input_ids, s.attention_mask] + [n % i for i in range(s.layers) for n in (s.past_key, s.past_value)]
        missing = [n for n in need if n not in names]
        missing += [n for n in [s.logits, s.present_key % 0] if n not in outputs]
        if missing:
            raise ModelLoadError(f"the graph lacks {', '.join(missing)} that genai_config.json names")
        extra = sorted(names - set(need))
        if extra:  # position_ids and friends: graphs this engine does not drive
            raise ModelLoadError(f"the graph has inputs this engine does not feed: {', '.join(extra)}")

    def prefill(self, kv: BatchKV, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        """Run ``ids`` (positions ``start``…) of the sequence in ``slot``; its KV lands in the
        buffer. Returns the logits of the last position, shape [vocab]."""
        input_ids = np.asarray([ids], dtype=np.int64)
        mask = np.ones((1, start + len(ids)), dtype=np.int64)
        logits = self._run(kv, slice(slot, slot + 1), input_ids, mask)
        return logits[0, -1]

    def prefill_fresh(self, kv: BatchKV, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> np.ndarray:
        """Run the first chunk of several prompts together (positions 0…), whatever rows
        ``slots`` they sit in; their KV lands in the buffer. Returns the logits of each chunk's
        last token, [rows, vocab].

        GroupQueryAttention batches chunks of several tokens only with no past (its "first
        prompt" mode; with a past it wants batch 1). So the past is empty, the chunks are
        right-padded to the longest with the mask covering the real tokens only, and
        ``present`` comes back as new tensors whose rows are copied into the buffer (a few
        MB; the run itself costs far more)."""
        rows, width = len(chunks), max(len(c) for c in chunks)
        lengths = np.fromiter((len(c) for c in chunks), dtype=np.int64, count=rows)
        input_ids = np.zeros((rows, width), dtype=np.int64)
        for i, chunk in enumerate(chunks):
            input_ids[i, : len(chunk)] = chunk
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
        """One step for rows 0…rows-1: ``tokens`` [rows] fed at positions ``lengths`` [rows].
        Returns logits [rows, vocab]."""
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


def _session_options(settings: EngineSettings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if settings.pin_threads:
        affinities = _worker_affinities(settings.intra_op_threads)
        if affinities:
            options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
    return options


def _worker_affinities(threads: int) -> str:
    """ORT's affinity string for the intra-op workers (the caller is thread 0, pinned by the
    engine to the first core): one logical processor each, 1-based, after the first core."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    count = threads or len(cores)
    return ";".join(str(c + 1) for c in cores[1:count])
