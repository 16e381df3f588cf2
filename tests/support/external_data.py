"""Models that keep their weights in ONNX external data, built by code for the tests."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx
import numpy as np
import onnx

from edge_node.server import EdgeServer
from modelfleet.zoo import build_mlp

DATA_FILE = "model.onnx.data"


def build_external_mlp(
    directory: Path,
    *,
    width: int = 64,
    hidden_layers: int = 1,
    classes: int = 10,
    seed: int = 0,
    head_seed: int = 0,
    location: str = DATA_FILE,
    graph: str = "model.onnx",
) -> Path:
    """An MLP (``modelfleet.zoo.build_mlp``: onnx.helper + numpy) saved as ``directory/graph``
    with every tensor in one external-data file ``location``; the graph's path."""
    directory.mkdir(parents=True, exist_ok=True)
    scratch = build_mlp(directory / ".inline.onnx", width=width, hidden_layers=hidden_layers, classes=classes,
                        seed=seed, head_seed=head_seed)  # fmt: skip
    model = onnx.load(str(scratch))
    scratch.unlink()
    path = directory / graph
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )
    return path


def set_location(graph: Path, location: str) -> None:
    """Rewrite every external-data location of the graph file (not the data file)."""
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(model, str(graph))


def tar_of(files: dict[str, bytes | None], gz: bool = False, **kinds: bytes) -> bytes:
    """A tar holding ``files`` (name → content; None: a directory entry), plain or gzipped."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if gz else "w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def model_files(graph: Path) -> dict[str, bytes]:
    """The graph and every file next to it, by name."""
    return {p.name: p.read_bytes() for p in sorted(graph.parent.iterdir()) if p.is_file()}


async def infer_mlp(edge: EdgeServer, x: np.ndarray, model: str = "ext") -> np.ndarray:
    """``x`` through ``model`` (an MLP of ``build_external_mlp``) on ``edge``'s OIP REST API."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as oip:
        answer = await oip.post(f"/v2/models/{model}/infer", json=body)
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(len(x), -1)
