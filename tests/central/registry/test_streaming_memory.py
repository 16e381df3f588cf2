"""A push's files are streamed, never held whole: staging a multipart body, extracting a
tar and chunking a file each allocate a bounded amount (a few blocks or chunks), whatever
the file's size. Measured with tracemalloc on a 64 MiB data file; the bound asserted is an
eighth of the file, far above what a block-wise copy needs and far below a whole read,
so an 8 GiB model takes the same memory as this one."""

from __future__ import annotations

import os
import tarfile
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
from onnx import helper

from central.registry.bundle import ReceivedPart, arrange
from central.registry.chunker import Chunker
from central.registry.pipeline import ChunkStep, PushContext
from central.registry.staging import StagedFile, Staging
from central.rest.multipart import read_push_form
from central.settings import ChunkingSettings
from central.storage.blobs.local import BlobStore
from support.fleet import SMALL_CHUNKS

SIZE = 64 * 1024 * 1024
#: One random block, repeated: the body costs the test no memory of its own.
BLOCK = os.urandom(256 * 1024)
BOUND = SIZE // 8


@contextmanager
def peak_memory() -> Iterator[Callable[[], int]]:
    """The peak of Python allocations inside the block (call the yielded function after it)."""
    tracemalloc.start()
    peak: list[int] = []
    try:
        yield lambda: peak[0]
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def write_data_file(path: Path) -> Path:
    with path.open("wb") as f:
        for _ in range(SIZE // len(BLOCK)):
            f.write(BLOCK)
    return path


async def multipart_body(boundary: str) -> AsyncIterator[bytes]:
    head = 'Content-Disposition: form-data; name="{}"; filename="{}"\r\n\r\n'
    yield f"--{boundary}\r\n{head.format('file', 'model.onnx')}".encode() + b"graph\r\n"
    yield f"--{boundary}\r\n{head.format('data', 'model.onnx.data')}".encode()
    for _ in range(SIZE // len(BLOCK)):
        yield BLOCK
    yield f"\r\n--{boundary}--\r\n".encode()


async def test_a_multipart_push_is_staged_block_by_block(tmp_path: Path) -> None:
    box = Staging(tmp_path / "staging", limit=1 << 40).open()
    with peak_memory() as peak:
        form = await read_push_form(multipart_body("b0undary"), "multipart/form-data; boundary=b0undary", box)
        upload = arrange(box, form.parts)
    assert upload.files["model.onnx.data"].size == SIZE
    assert upload.path.read_bytes() == b"graph"
    assert peak() < BOUND, peak()


def test_a_tar_is_extracted_member_by_member(tmp_path: Path) -> None:
    data = write_data_file(tmp_path / "model.onnx.data")
    (tmp_path / "model.onnx").write_bytes(b"graph")
    staging = Staging(tmp_path / "staging", limit=1 << 40)
    box = staging.open()
    tar = box.directory / ".upload"
    with tarfile.open(tar, "w:gz", compresslevel=1) as out:
        out.add(tmp_path / "model.onnx", "model/model.onnx")
        out.add(data, "model/model.onnx.data")
    with peak_memory() as peak:
        upload = arrange(box, [ReceivedPart(None, StagedFile(tar, "", tar.stat().st_size))])
    assert upload.files["model.onnx.data"].size == SIZE and not tar.exists()
    assert peak() < BOUND, peak()


def external_graph(directory: Path, data: Path) -> Path:
    """A graph whose one tensor lies in ``data`` (all of it), by hand: no copy of it in memory."""
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[SIZE // 4])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in {"location": data.name, "offset": "0", "length": str(SIZE)}.items():
        tensor.external_data.add(key=key, value=value)
    out = helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [SIZE // 4])
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["out"])], "g", [], [out], initializer=[tensor])
    path = directory / "model.onnx"
    onnx.save_model(helper.make_model(graph), str(path))
    return path


def test_chunking_reads_each_file_in_chunks(tmp_path: Path) -> None:
    data = write_data_file(tmp_path / "model.onnx.data")
    graph = external_graph(tmp_path, data)
    step = ChunkStep(Chunker(ChunkingSettings(**SMALL_CHUNKS)), BlobStore(tmp_path / "blobs"))
    ctx = PushContext("m", "1", {}, graph, "", graph.stat().st_size)
    with peak_memory() as peak:
        step.run(ctx)
    (file,) = ctx.artifact_refs["fp32"].files
    assert file.path == "model.onnx.data" and file.size == SIZE and len(file.chunks) > 100
    assert peak() < BOUND, peak()
