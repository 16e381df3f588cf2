"""The decoder graph of a GenAI-layout folder: what ``genai_config.json`` says, and the
interface of the ONNX Runtime session that runs prefill chunks and batched decode steps on
the batch's KV buffer (its two layouts are in :mod:`edge_node.generation.runners`)."""

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

__all__ = ["DecoderRunner", "DecoderSpec", "ModelLoadError", "spare_cores", "usable_cores"]


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
    position_ids: str
    """Fed only to graphs that take it (plain attention, :class:`~edge_node.generation.runners.ConcatRunner`)."""

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
                position_ids=inputs.get("position_ids", "position_ids"),
            )
        except FileNotFoundError as exc:
            raise ModelLoadError(f"{path.name} is missing: not a GenAI-layout language model") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{path.name}: missing or bad field {exc}") from exc


class DecoderRunner:
    """One ONNX Runtime session of the decoder, run only from the engine thread; the layouts
    (:mod:`edge_node.generation.runners`) differ in how the KV buffer meets the graph."""

    def __init__(self, folder: Path, spec: DecoderSpec, settings: EngineSettings, *, positions: bool) -> None:
        self.spec = spec
        self.session = ort.InferenceSession(
            str(folder / spec.filename), _session_options(settings), providers=["CPUExecutionProvider"]
        )
        self._check_graph(positions)
        past = {i.name: i for i in self.session.get_inputs()}[spec.past_key % 0]
        self.kv_dtype = np.dtype(_DTYPES.get(past.type, np.float32))
        self.bytes_per_token = spec.layers * 2 * spec.kv_heads * spec.head_size * self.kv_dtype.itemsize

    def _check_graph(self, positions: bool) -> None:
        names = {i.name for i in self.session.get_inputs()}
        outputs = {o.name for o in self.session.get_outputs()}
        s = self.spec
        need = [s.input_ids, s.attention_mask] + [n % i for i in range(s.layers) for n in (s.past_key, s.past_value)]
        need += [s.position_ids] if positions else []
        missing = [n for n in need if n not in names]
        missing += [n for n in [s.logits, s.present_key % 0] if n not in outputs]
        if missing:
            raise ModelLoadError(f"the graph lacks {', '.join(missing)} that genai_config.json names")
        extra = sorted(names - set(need))
        if extra:  # inputs such as token_type_ids: graphs this engine does not drive
            raise ModelLoadError(f"the graph has inputs this engine does not feed: {', '.join(extra)}")

    def prefill(self, kv: BatchKV, slot: int, ids: Sequence[int], start: int) -> np.ndarray:
        """Run ``ids`` (positions ``start``…) of the sequence in ``slot``; its KV lands in the
        buffer. Returns the logits of the last position, shape [vocab]."""
        raise NotImplementedError

    def prefill_fresh(self, kv: BatchKV, slots: Sequence[int], chunks: Sequence[Sequence[int]]) -> np.ndarray:
        """Run the first chunk of several prompts together (positions 0…), whatever rows
        ``slots`` they sit in; their KV lands in the buffer. Returns the logits of each chunk's
        last token, [rows, vocab]."""
        raise NotImplementedError

    def decode(self, kv: BatchKV, rows: int, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """One step for rows 0…rows-1: ``tokens`` [rows] fed at positions ``lengths`` [rows].
        Returns logits [rows, vocab]."""
        raise NotImplementedError


def _session_options(settings: EngineSettings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    if not settings.spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if settings.pin_threads:
        affinities = _worker_affinities(settings.intra_op_threads)
        if affinities:
            options.add_session_config_entry("session.intra_op_thread_affinities", affinities)
    return options


def _worker_affinities(threads: int) -> str:
    """ORT's affinity string for the intra-op workers (the caller is thread 0, pinned by the
    engine to the first core): one logical processor each, 1-based, after the first core."""
    cores = usable_cores()
    count = threads or len(cores)
    return ";".join(str(c + 1) for c in cores[1:count])


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def spare_cores(threads: int) -> set[int]:
    """The cores that pinned intra-op threads (``threads``; 0: one per core) leave free."""
    cores = usable_cores()
    return set(cores[threads:]) if threads else set()
