"""ONNX validation and signature extraction for pushed files.

A model may keep its weights outside the graph (ONNX external data: what every model
over 2 GiB needs, and what current exporters write by default). Such a graph names, per
tensor, a ``location`` relative to the graph's directory; a push is accepted only when
every location is a plain file name next to the graph, every referenced file came with
the push, and every file that came with it is referenced. The graph alone is parsed (never
the weights), and ``onnx.checker`` is given the path, so it checks the data files on disk
without loading them: validating an 8 GiB model costs little memory and no ORT session."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
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


def _never(_: str) -> bool:
    return False


def check_data_files(
    model: onnx.ModelProto, directory: Path, staged: Collection[str], companion: Callable[[str], bool] = _never
) -> list[str]:
    """400 unless the graph references exactly the ``staged`` data files, each long enough
    for the bytes its tensors read; the referenced files, in order. A staged file the graph
    does not reference passes only when ``companion`` allows its name (a language model's
    tokenizer and config: ``central.registry.companions``)."""
    refs = external_refs(model)
    names = list(dict.fromkeys(check_location(ref) for ref in refs))
    missing = [n for n in names if n not in staged]
    if missing:
        raise BadRequest(
            f"the graph references data file {missing[0]!r}, which was not uploaded; push every file the .onnx"
            " names (modelfleet push finds them next to it)"
        )
    extra = sorted(n for n in set(staged) - set(names) if not companion(n))
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


def load_checked(
    path: Path, staged_files: Collection[str] | None = None, companion: Callable[[str], bool] = _never
) -> onnx.ModelProto:
    """Parse and check an uploaded graph; any failure is the uploader's (400).

    ``staged_files``: the files that came with it (by name, next to ``path``); the graph must
    reference exactly those, but for the names ``companion`` allows. None checks only that
    what it references exists."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError, and others on garbage
        raise BadRequest(f"not an ONNX model: {type(exc).__name__}: {exc}") from exc
    if not model.HasField("graph") or not model.opset_import:
        raise BadRequest("not an ONNX model: no graph or no opset import")
    if staged_files is None:
        staged_files = [n for n in data_files(model) if (path.parent / n).is_file()]
    check_data_files(model, path.parent, staged_files, companion)
    try:
        _check_model(path, model)
    except Exception as exc:
        raise BadRequest(f"ONNX checker rejected the model: {exc}") from exc
    return model


def _runtime_only_ops(model: onnx.ModelProto) -> set[str]:
    """Default-domain ops ONNX does not define but ONNX Runtime does (the GenAI builder's
    ``SimplifiedLayerNormalization``): the checker cannot know them, ORT runs them."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    unknown = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx") and not onnx.defs.has(n.op_type)}
    runtime = {s.name for s in ort_c.get_all_operator_schema() if s.domain in ("", "ai.onnx")}
    return unknown & runtime


def _check_model(path: Path, model: onnx.ModelProto) -> None:
    """``onnx.checker`` on the file (so it sees the data files on disk). A graph using ops only
    ONNX Runtime defines is checked as a copy beside it with those ops moved to ORT's own
    domain, which the checker leaves to the runtime, as it does every contrib op."""
    ops = _runtime_only_ops(model)
    if not ops:
        onnx.checker.check_model(str(path))
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ops:
            node.domain = "com.microsoft"
    if not any(o.domain == "com.microsoft" for o in copy.opset_import):
        copy.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    checked = path.with_name(".checker-" + path.name)
    try:
        onnx.save_model(copy, str(checked))
        onnx.checker.check_model(str(checked))
    finally:
        checked.unlink(missing_ok=True)


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
