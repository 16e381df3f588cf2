"""ONNX validation and signature extraction for pushed files.

A model may keep its weights outside the graph (ONNX external data: what every model
over 2 GiB needs, and what current exporters write by default). Such a graph names, per
tensor, a ``location`` relative to the graph's directory; a push is accepted only when
every location is a plain file name next to the graph, every referenced file came with
the push, and every file that came with it is referenced. The graph alone is parsed (never
the weights), and ``onnx.checker`` is given the path, so it checks the data files on disk
without loading them: validating an 8 GiB model costs little memory and no ORT session."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import helper

from central.errors import BadRequest
from fleetwire.manifest import FILE_NAME, MODEL_FILE, TensorSpec


@dataclass(frozen=True)
class ExternalRef:
    """Where one tensor's bytes are: ``location`` (a file next to the graph), offset, length."""

    tensor: str
    location: str
    offset: int
    length: int | None


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _graph_tensors(sub)


def _model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                if attribute.HasField("g"):
                    yield from _graph_tensors(attribute.g)


def _int(value: str, what: str, tensor: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"tensor {tensor!r} has a non-numeric external-data {what}: {value!r}") from None
    if number < 0:
        raise BadRequest(f"tensor {tensor!r} has a negative external-data {what}")
    return number


def external_refs(model: onnx.ModelProto) -> list[ExternalRef]:
    """Every tensor of the model (initializers, attributes, subgraphs) stored outside the graph."""
    refs = []
    for tensor in _model_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        offset = _int(info["offset"], "offset", tensor.name) if "offset" in info else 0
        length = _int(info["length"], "length", tensor.name) if "length" in info else None
        refs.append(ExternalRef(tensor.name, info.get("location", ""), offset, length))
    return refs


def check_location(ref: ExternalRef) -> str:
    """The data file a tensor names, if it is a plain file name next to the graph; else 400."""
    location = ref.location
    if not location:
        raise BadRequest(f"tensor {ref.tensor!r} is stored as external data but names no location")
    if location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise BadRequest(f"tensor {ref.tensor!r} has an absolute external-data location {location!r}")
    parts = location.replace("\\", "/").split("/")
    if ".." in parts:
        raise BadRequest(f"tensor {ref.tensor!r} has an external-data location {location!r} that escapes its directory")
    if len(parts) > 1:
        raise BadRequest(
            f"tensor {ref.tensor!r} has its data in a subdirectory ({location!r}); external data must be"
            " files next to the .onnx"
        )
    if not FILE_NAME.fullmatch(location) or ".." in location or location == MODEL_FILE:
        raise BadRequest(
            f"tensor {ref.tensor!r} has an external-data location {location!r} that is not a usable file name"
            " (letters, digits, '.', '_', '-'; no leading dot)"
        )
    return location


def data_files(model: onnx.ModelProto) -> list[str]:
    """The model's external-data files (checked plain names), in the order tensors use them."""
    return list(dict.fromkeys(check_location(ref) for ref in external_refs(model)))


def check_data_files(model: onnx.ModelProto, directory: Path, staged: Collection[str]) -> list[str]:
    """400 unless the graph references exactly the ``staged`` data files, each long enough
    for the bytes its tensors read; the referenced files, in order."""
    refs = external_refs(model)
    names = list(dict.fromkeys(check_location(ref) for ref in refs))
    missing = [n for n in names if n not in staged]
    if missing:
        raise BadRequest(
            f"the graph references data file {missing[0]!r}, which was not uploaded; push every file the .onnx"
            " names (modelfleet push finds them next to it)"
        )
    extra = sorted(set(staged) - set(names))
    if extra:
        raise BadRequest(f"file {extra[0]!r} came with the push but the graph references no such data file")
    sizes = {n: (directory / n).stat().st_size for n in names}
    for ref in refs:
        end = ref.offset + (ref.length or 0)
        if end > sizes[ref.location]:
            raise BadRequest(
                f"tensor {ref.tensor!r} reads bytes {ref.offset}..{end} of {ref.location!r},"
                f" which has {sizes[ref.location]} bytes"
            )
    return names


def load_checked(path: Path, staged_files: Collection[str] | None = None) -> onnx.ModelProto:
    """Parse and check an uploaded graph; any failure is the uploader's (400).

    ``staged_files``: the data files that came with it (by name, next to ``path``); the
    graph must reference exactly those. None checks only that what it references exists."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, and others on garbage
        raise BadRequest(f"not an ONNX model: {type(exc).__name__}: {exc}") from exc
    if not model.HasField("graph") or not model.opset_import:
        raise BadRequest("not an ONNX model: no graph or no opset import")
    if staged_files is None:
        staged_files = [n for n in data_files(model) if (path.parent / n).is_file()]
    check_data_files(model, path.parent, staged_files)
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:
        raise BadRequest(f"ONNX checker rejected the model: {exc}") from exc
    return model


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    tensor = value.type.tensor_type
    try:
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
    except Exception:
        dtype = onnx.TensorProto.DataType.Name(tensor.elem_type).lower()
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    return TensorSpec(name=value.name, dtype=dtype, shape=shape)


def signature(model: onnx.ModelProto) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's real inputs (initializers excluded) and outputs."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [_spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_spec(v) for v in model.graph.output]
    return inputs, outputs
