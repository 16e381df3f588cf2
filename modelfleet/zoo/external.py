"""Models shipped as ONNX external data: ``model.onnx`` plus ``model.onnx.data``.

This is what exporters write for anything large (torch's default exporter does it from
tens of MB on, and a protobuf cannot hold more than 2 GiB, so every bigger model is
shipped this way). Two ways to make one:

- ``save_with_external_data``: a model held in memory, saved by ``onnx`` as exporters do.
- ``write_huge_mlp``: a random MLP of any size whose weights are generated in slices
  and streamed into the ``.data`` file as they are made, so that a model of several GiB
  never needs its weights in memory at once (the graph itself only points at offsets).
- ``write_embedding_table``: a random embedding table of any size behind one ``Gather``
  (a language model's first layer), written the same way. ONNX Runtime maps its external
  data instead of copying or pre-packing it, so its session starts in milliseconds whatever
  the size: what a benchmark of serving it measures is the server around the model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelfleet.zoo.graph import FLOAT, IR_VERSION, OPSET, PRODUCER

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
#: Tensors smaller than this stay inside the ``.onnx`` (onnx's own default).
SIZE_THRESHOLD = 1024
#: Offsets in the ``.data`` file are multiples of this, so ONNX Runtime can map it page by page.
ALIGNMENT = 4096
#: How much of one weight matrix is generated and written at a time.
SLICE_BYTES = 32 * 1024 * 1024


def save_with_external_data(model: onnx.ModelProto, directory: Path) -> Path:
    """Write ``model`` as ``directory/model.onnx`` + ``directory/model.onnx.data``; returns the .onnx path.

    ``model`` is not changed (``onnx`` moves the tensors out of the proto it saves)."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    path = directory / MODEL_FILE
    onnx.save_model(
        copy,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=SIZE_THRESHOLD,
    )
    return path


def external_data_files(model_path: Path) -> list[str]:
    """The external-data locations ``model_path`` refers to (relative to its directory)."""
    model = onnx.load(str(model_path), load_external_data=False)
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    locations: list[str] = []
    for tensor in tensors:
        if tensor.data_location == TensorProto.EXTERNAL:
            location = next(e.value for e in tensor.external_data if e.key == "location")
            if location not in locations:
                locations.append(location)
    return locations


class ExternalDataWriter:
    """Appends tensors to one ``.data`` file and returns the protos that point at them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = path.name
        self._file = path.open("wb")

    def add(self, name: str, shape: tuple[int, ...], slices: Iterator[np.ndarray]) -> TensorProto:
        """Write a float32 tensor given as consecutive row slices; the slices must fill ``shape``."""
        offset = self._file.seek(0, os.SEEK_END)
        padding = -offset % ALIGNMENT
        self._file.write(b"\0" * padding)
        offset += padding
        written = 0
        for part in slices:
            data = np.ascontiguousarray(part, dtype="<f4").tobytes()
            self._file.write(data)
            written += len(data)
        expected = 4 * int(np.prod(shape))
        if written != expected:
            raise ValueError(f"{name}: wrote {written} bytes for shape {shape}, expected {expected}")
        tensor = TensorProto(name=name, data_type=FLOAT, dims=list(shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(written))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        return tensor

    def close(self) -> None:
        self._file.close()


def huge_mlp_bytes(width: int, layers: int, classes: int = 10) -> int:
    """The size of ``write_huge_mlp``'s weights (float32, alignment padding aside)."""
    return 4 * (layers * (width * width + width) + width * classes + classes)


def huge_mlp_layer(seed: int, index: int, rows: int, cols: int, slice_rows: int) -> Iterator[np.ndarray]:
    """Layer ``index``'s weight matrix ``[rows, cols]``, ``slice_rows`` rows at a time (seeded, scaled 1/sqrt(rows))."""
    rng = np.random.default_rng([seed, index])
    scale = np.float32(1.0 / np.sqrt(rows))
    for start in range(0, rows, slice_rows):
        count = min(slice_rows, rows - start)
        yield (rng.standard_normal((count, cols), dtype=np.float32) * scale).astype(np.float32)


def write_huge_mlp(directory: Path, *, width: int = 8192, layers: int = 9, classes: int = 10, seed: int = 0) -> Path:
    """A random ReLU MLP ``[batch, width] → [batch, classes]`` as ``model.onnx`` + ``model.onnx.data``.

    The defaults make 9 layers of 8192x8192: 2.25 GiB of weights, past protobuf's 2 GiB
    limit, for benchmarks of pushing and serving big models. Memory use stays at one
    slice (``SLICE_BYTES``) whatever the size."""
    directory.mkdir(parents=True, exist_ok=True)
    slice_rows = max(1, SLICE_BYTES // (4 * width))
    writer = ExternalDataWriter(directory / DATA_FILE)
    nodes, initializers, current = [], [], "input"
    try:
        for i in range(layers + 1):
            cols = classes if i == layers else width
            initializers.append(writer.add(f"w{i}", (width, cols), huge_mlp_layer(seed, i, width, cols, slice_rows)))
            initializers.append(writer.add(f"b{i}", (cols,), iter([np.zeros(cols, np.float32)])))
            out = "logits" if i == layers else f"relu{i}"
            nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [f"mm{i}"], name=f"layer{i}/MatMul"))
            added = out if i == layers else f"add{i}"
            nodes.append(helper.make_node("Add", [f"mm{i}", f"b{i}"], [added], name=f"layer{i}/Add"))
            if i < layers:
                nodes.append(helper.make_node("Relu", [added], [out], name=f"layer{i}/Relu"))
            current = out
    finally:
        writer.close()
    graph = helper.make_graph(
        nodes,
        "huge_mlp",
        [helper.make_tensor_value_info("input", FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("logits", FLOAT, ["batch", classes])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    path = directory / MODEL_FILE
    onnx.save_model(model, str(path))
    onnx.checker.check_model(str(path))  # by path: reads the external data's references, not its bytes
    return path


#: Columns of ``write_embedding_table``'s table (a hidden size).
EMBEDDING_COLS = 1024


def write_embedding_table(directory: Path, *, total_bytes: int, cols: int = EMBEDDING_COLS, seed: int = 0) -> Path:
    """A random float32 table ``[rows, cols]`` of about ``total_bytes`` (at least one row) in
    ``model.onnx.data``, served by ``ids [batch] int64 → rows [batch, cols]``; the graph's path.

    Uniform weights in [-0.5, 0.5) from numpy's default generator, one slice at a time: about
    a second per GiB to generate, memory one slice, whatever the size."""
    directory.mkdir(parents=True, exist_ok=True)
    rows = max(1, total_bytes // (4 * cols))
    slice_rows = max(1, SLICE_BYTES // (4 * cols))
    rng = np.random.default_rng(seed)

    def slices() -> Iterator[np.ndarray]:
        for start in range(0, rows, slice_rows):
            block = rng.random((min(slice_rows, rows - start), cols), dtype=np.float32)
            block -= np.float32(0.5)
            yield block

    writer = ExternalDataWriter(directory / DATA_FILE)
    try:
        table = writer.add("table", (rows, cols), slices())
    finally:
        writer.close()
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embedding/Gather")],
        "embedding_table",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("rows", FLOAT, ["batch", cols])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    path = directory / MODEL_FILE
    onnx.save_model(model, str(path))
    onnx.checker.check_model(str(path))
    return path
