"""Pushes of models that keep their weights in ONNX external data, through central's real
REST API: multipart with every file, a tar (plain or gzipped) of the model's directory,
every way such a push can be wrong (400, nothing left in staging), the size and disk
limits, chunks shared across versions, and garbage collection that keeps data files."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from support.external_data import DATA_FILE, build_external_mlp, model_files, set_location, tar_of
from support.fleet import central_settings

PUSH = "/api/v1/models/{}/versions"


def staging_entries(server: CentralServer) -> list[str]:
    return sorted(p.name for p in (server.settings.data_dir / "staging").iterdir())


def blob(server: CentralServer, digest: str) -> Path:
    return server.settings.data_dir / "blobs" / "sha256" / digest[:2] / digest


def reassembled(server: CentralServer, file: dict[str, Any]) -> bytes:
    return b"".join(blob(server, c["digest"]).read_bytes() for c in file["chunks"])


def multipart(graph: Path, *extra: tuple[str, str, bytes]) -> list[tuple[str, tuple[str, bytes]]]:
    """Every file next to ``graph`` as multipart parts (the graph as ``file``, the others as
    ``data``), plus ``extra`` (field, filename, content) parts."""
    parts = [("file", (graph.name, graph.read_bytes()))]
    parts += [("data", (name, data)) for name, data in model_files(graph).items() if name != graph.name]
    return parts + [(f, (n, d)) for f, n, d in extra]


def error_of(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert "internal error" not in message
    return str(message)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[CentralServer]:
    central = CentralServer(central_settings(tmp_path / "central"))
    await central.start()
    yield central
    await central.stop()


@pytest.fixture
async def client(server: CentralServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as api:
        yield api


@pytest.fixture
def external(tmp_path: Path) -> Path:
    """An MLP (~1.1 MB of weights, dozens of 64 KiB chunks) with its weights in model.onnx.data."""
    return build_external_mlp(tmp_path / "model", width=512, hidden_layers=1)


def assert_stored(server: CentralServer, manifest: dict[str, Any], graph: Path) -> None:
    """The manifest names the graph and its data file, and the stored chunks rebuild both."""
    data = (graph.parent / DATA_FILE).read_bytes()
    assert manifest["sha256"] == hashlib.sha256(graph.read_bytes()).hexdigest()
    assert [f["path"] for f in manifest["files"]] == [DATA_FILE]
    (file,) = manifest["files"]
    assert file["size"] == len(data) and file["sha256"] == hashlib.sha256(data).hexdigest()
    assert reassembled(server, file) == data
    assert reassembled(server, manifest) == graph.read_bytes()
    assert len(file["chunks"]) > 5  # the weights are the bulk: many chunks


async def test_a_multipart_push_with_its_data_file_is_stored_file_by_file(
    server: CentralServer, client: httpx.AsyncClient, external: Path
) -> None:
    response = await client.post(PUSH.format("ext"), files=multipart(external), data={"version": "v1"})
    assert response.status_code == 201, response.text
    manifest = response.json()["manifest"]
    assert manifest["version"] == "v1" and manifest["artifact"] == "fp32" and manifest["alternatives"] == []
    assert_stored(server, manifest, external)
    assert response.json()["report"]["files"] == 2
    assert staging_entries(server) == []
    listed = (await client.get("/api/v1/models/ext/versions")).json()
    total = external.stat().st_size + (external.parent / DATA_FILE).stat().st_size
    assert listed[0]["files"] == [DATA_FILE] and listed[0]["total_size"] == total


@pytest.mark.parametrize("gz", [False, True], ids=["tar", "tar.gz"])
async def test_a_tar_of_the_model_directory_is_pushed_like_its_files(
    server: CentralServer, client: httpx.AsyncClient, external: Path, gz: bool
) -> None:
    files: dict[str, bytes | None] = {"exported/": None}
    files |= {f"exported/{name}": data for name, data in model_files(external).items()}
    body = tar_of(files, gz=gz)
    response = await client.post(PUSH.format("ext"), content=body)
    assert response.status_code == 201, response.text
    assert_stored(server, response.json()["manifest"], external)
    assert staging_entries(server) == []

    # A tar sent as the one file of a multipart works the same, here without a directory.
    flat = tar_of(model_files(external), gz=gz)
    response = await client.post(PUSH.format("ext"), files={"file": ("model.tar", flat)})
    assert response.status_code == 201, response.text
    assert_stored(server, response.json()["manifest"], external)


def _escaping(tmp_path: Path, location: str) -> list[tuple[str, tuple[str, bytes]]]:
    graph = build_external_mlp(tmp_path / "esc", width=16)
    set_location(graph, location)
    return [("file", ("model.onnx", graph.read_bytes())), ("data", ("x.data", (graph.parent / DATA_FILE).read_bytes()))]


BAD_MULTIPARTS = {
    "missing data file": (lambda g, t: [("file", (g.name, g.read_bytes()))], "model.onnx.data", "not uploaded"),
    "extra file": (lambda g, t: multipart(g, ("data", "notes.txt", b"hello")), "notes.txt", "references no such"),
    "location with ..": (lambda g, t: _escaping(t, "../x.data"), "escapes"),
    "absolute location": (lambda g, t: _escaping(t, "/etc/x.data"), "absolute"),
    "location in a subdirectory": (lambda g, t: _escaping(t, "weights/x.data"), "subdirectory"),
    "two graphs": (lambda g, t: multipart(g, ("file", "other.onnx", g.read_bytes())), "2 .onnx files"),
    "data file name with a slash": (lambda g, t: multipart(g, ("data", "sub/x.data", b"x")), "not a plain file"),
    "hidden data file": (lambda g, t: multipart(g, ("data", ".x.data", b"x")), "must not start with a dot"),
    "several files, no .onnx": (
        lambda g, t: [("file", ("graph.bin", g.read_bytes())), ("data", (DATA_FILE, b"x"))],
        "ends in .onnx",
    ),
    "data file too short": (lambda g, t: [("file", (g.name, g.read_bytes())), ("data", (DATA_FILE, b"x"))], "reads"),
}


@pytest.mark.parametrize("case", BAD_MULTIPARTS.values(), ids=BAD_MULTIPARTS.keys())
async def test_a_bad_multipart_push_is_a_400_that_leaves_nothing_in_staging(
    server: CentralServer, client: httpx.AsyncClient, external: Path, tmp_path: Path, case: tuple[Any, ...]
) -> None:
    build, *needles = case
    response = await client.post(PUSH.format("ext"), files=build(external, tmp_path))
    message = error_of(response)
    for needle in needles:
        assert needle in message, message
    assert staging_entries(server) == []
    assert (await client.get("/api/v1/models")).json() == []


def _tar_with(kind: bytes, name: str = "link", **fields: Any) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        for key, value in fields.items():
            setattr(info, key, value)
        tar.addfile(info)
    return out.getvalue()


def _join(*tars: bytes) -> bytes:
    """Concatenate tars, keeping the members of all (tarfile stops at the first end blocks,
    so each one but the last is cut just after its last member)."""
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as joined:
        for data in tars:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar.getmembers():
                    joined.addfile(member, tar.extractfile(member) if member.isreg() else None)
    return out.getvalue()


def bad_tars(files: dict[str, bytes]) -> dict[str, tuple[bytes, str]]:
    import tarfile

    return {
        "symlink": (_join(tar_of(files), _tar_with(tarfile.SYMTYPE, linkname="/etc/passwd")), "symbolic link"),
        "hard link": (_join(tar_of(files), _tar_with(tarfile.LNKTYPE, linkname="model.onnx")), "hard link"),
        "device": (_join(tar_of(files), _tar_with(tarfile.CHRTYPE, name="null")), "character device"),
        "fifo": (_join(tar_of(files), _tar_with(tarfile.FIFOTYPE, name="pipe")), "FIFO"),
        "absolute path": (tar_of({f"/tmp/{n}": d for n, d in files.items()}), "absolute path"),
        "dot-dot": (tar_of({f"../{n}": d for n, d in files.items()}), "outside its directory"),
        "subdirectory": (tar_of({**files, f"a/b/{DATA_FILE}": files[DATA_FILE]}), "subdirectory"),
        "two directories": (tar_of({f"a/{n}": d for n, d in files.items()} | {"b/x.data": b"1"}), "more than one"),
        "two graphs": (tar_of({**files, "other.onnx": files["model.onnx"]}), "2 .onnx files"),
        "missing data file": (tar_of({"model.onnx": files["model.onnx"]}), "not uploaded"),
        "extra file": (tar_of({**files, "README.md": b"hi"}), "references no such"),
        "truncated gzip": (tar_of(files, gz=True)[:-200], "not a readable tar"),
        "only a directory": (tar_of({"exported/": None}), "no file"),
    }


async def test_a_bad_tar_is_a_400_that_leaves_nothing_in_staging(
    server: CentralServer, client: httpx.AsyncClient, external: Path
) -> None:
    for case, (body, needle) in bad_tars(model_files(external)).items():
        response = await client.post(PUSH.format("ext"), content=body)
        assert needle in error_of(response), (case, response.text)
        assert staging_entries(server) == [], case
    assert (await client.get("/api/v1/models")).json() == []


async def test_the_size_limit_counts_every_file_and_a_full_disk_is_a_507(tmp_path: Path) -> None:
    graph = build_external_mlp(tmp_path / "model", width=256)
    data_size = (graph.parent / DATA_FILE).stat().st_size
    # The graph alone fits and the data file alone fits, but not both.
    settings = central_settings(tmp_path / "small", max_upload_bytes=data_size + graph.stat().st_size // 2)
    small = CentralServer(settings)
    await small.start()
    try:
        async with httpx.AsyncClient(base_url=small.http_url, timeout=60) as api:
            refused = await api.post(PUSH.format("ext"), files=multipart(graph))
            assert "exceeds the limit" in error_of(refused, 413)
            assert staging_entries(small) == []
    finally:
        await small.stop()

    full = CentralServer(central_settings(tmp_path / "full", min_free_disk_bytes=1 << 60))  # never that much free
    await full.start()
    try:
        async with httpx.AsyncClient(base_url=full.http_url, timeout=60) as api:
            refused = await api.post(PUSH.format("ext"), files=multipart(graph))
            assert "free" in error_of(refused, 507) and "min_free_disk_bytes" in refused.json()["error"]
            assert staging_entries(full) == []
    finally:
        await full.stop()


async def test_versions_share_the_chunks_of_unchanged_weights_and_gc_keeps_what_is_used(tmp_path: Path) -> None:
    server = CentralServer(central_settings(tmp_path / "central"))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as client:
            f2 = await _push_two_versions_and_delete_the_first(tmp_path, server, client)
    finally:
        await server.stop()
    # A restart's orphan sweep counts data-file chunks as used.
    again = CentralServer(server.settings)
    await again.start()
    try:
        assert reassembled(again, f2) == (tmp_path / "v2" / DATA_FILE).read_bytes()
    finally:
        await again.stop()


async def _push_two_versions_and_delete_the_first(
    tmp_path: Path, server: CentralServer, client: httpx.AsyncClient
) -> dict[str, Any]:
    # Same hidden layers, another head: only the tail of the data file differs.
    v1 = build_external_mlp(tmp_path / "v1", width=512, hidden_layers=2, head_seed=1)
    v2 = build_external_mlp(tmp_path / "v2", width=512, hidden_layers=2, head_seed=2)
    data_size = (v1.parent / DATA_FILE).stat().st_size
    assert data_size > 20 * 64 * 1024  # many times the chunk size
    first = await client.post(PUSH.format("ext"), files=multipart(v1))
    second = await client.post(PUSH.format("ext"), files=multipart(v2))
    assert first.status_code == second.status_code == 201, (first.text, second.text)
    (f1,), (f2,) = first.json()["manifest"]["files"], second.json()["manifest"]["files"]
    assert f1["sha256"] != f2["sha256"]
    d1, d2 = {c["digest"] for c in f1["chunks"]}, {c["digest"] for c in f2["chunks"]}
    assert len(d1 & d2) >= 0.8 * len(d1)  # the unchanged layers' chunks are shared
    assert second.json()["report"]["new_chunk_bytes"] < data_size / 4

    # Deleting v1 removes only the chunks v2 does not use; v2 still rebuilds byte for byte.
    assert (await client.delete("/api/v1/models/ext/versions/1")).status_code == 204
    assert all(not blob(server, d).exists() for d in d1 - d2)
    assert reassembled(server, f2) == (v2.parent / DATA_FILE).read_bytes()
    return dict(f2)
