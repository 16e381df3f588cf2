"""The files of a model to push: the ``.onnx`` and the external-data files it references.

Exporters write large models (and, since torch 2.x, most models) as a graph plus weights
in separate files named by each tensor's ``location``. The CLI reads the graph alone
(never the weights), collects those names, and checks each is a plain file next to the
graph, as central requires, so a mistake is a clear usage error before any byte is sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from fleetwire.manifest import COMPANION_FILES
from modelfleet.cli.client import UsageError

if TYPE_CHECKING:
    import onnx

#: Names a file pushed as is, without reading it as a graph: central unpacks tars itself.
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                yield from _tensors(sub)


def _locations(model: onnx.ModelProto) -> dict[str, str]:
    """location → the first tensor stored there, for every tensor kept in external data."""
    import onnx

    found: dict[str, str] = {}
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            found.setdefault(location, tensor.name)
    return found


def data_files(model_path: Path) -> dict[str, Path]:
    """The external-data files ``model_path`` references, by the name its graph uses; empty
    for a self-contained model, a tar, or a file that is not ONNX (central says why)."""
    if model_path.name.lower().endswith(TAR_SUFFIXES):
        return {}
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return {}
    files: dict[str, Path] = {}
    for location, tensor in _locations(model).items():
        parts = location.replace("\\", "/").split("/")
        if not location or location.startswith("/") or len(parts) > 1 or location in (".", ".."):
            raise UsageError(
                f"{model_path.name} keeps tensor {tensor!r} in {location!r}, not in a file next to it; central takes"
                " data files beside the .onnx only (re-save with onnx.save_model(..., location='model.onnx.data'))"
            )
        path = model_path.parent / location
        if not path.is_file():
            raise UsageError(
                f"{model_path.name} keeps tensor {tensor!r} in {location!r}, which is not in {model_path.parent}"
            )
        files[location] = path
    return files


def graph_of(model_path: Path) -> Path:
    """The graph to push: ``model_path`` itself, or the one ``.onnx`` in a folder (the layout
    ONNX Runtime GenAI's builder or Optimum writes); a usage error for a folder with none or several."""
    if not model_path.is_dir():
        return model_path
    graphs = sorted(model_path.glob("*.onnx"))
    if len(graphs) != 1:
        found = ", ".join(g.name for g in graphs) or "none"
        raise UsageError(f"{model_path} must hold exactly one .onnx (the graph) to push it as a folder; found {found}")
    return graphs[0]


def _is_decoder(graph: Path) -> bool:
    """GenAI's config beside the graph, or KV-cache inputs in it (what central calls a decoder)."""
    if (graph.parent / "genai_config.json").is_file():
        return True
    import onnx

    try:
        model = onnx.load(str(graph), load_external_data=False)
    except Exception:
        return False
    return any(i.name.startswith("past_key_values.") for i in model.graph.input)


def companion_files(graph: Path) -> dict[str, Path]:
    """A language model's tokenizer, configs and chat template next to ``graph`` (the names
    central accepts beside a decoder's graph), by name; empty for a tar or a model that is
    not a decoder (an encoder exported with its tokenizer is pushed as before, graph only)."""
    if graph.name.lower().endswith(TAR_SUFFIXES) or not _is_decoder(graph):
        return {}
    return {name: graph.parent / name for name in COMPANION_FILES if (graph.parent / name).is_file()}
