"""The registry through central's real REST API: pushes, reads, deletes and every way
a push can be refused (with nothing left behind)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.server import CentralServer
from modelfleet.zoo import build_mlp
from support.fleet import central_settings, push

# --------------------------------------------------------------------------- helpers


def data_dir(central: CentralServer) -> Path:
    return central.settings.data_dir


def blob_path(central: CentralServer, digest: str) -> Path:
    return data_dir(central) / "blobs" / "sha256" / digest[:2] / digest


def blob_files(central: CentralServer) -> set[str]:
    """Names of every file under blobs/ (temp files included)."""
    root = data_dir(central) / "blobs"
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def staging_files(central: CentralServer) -> list[str]:
    return sorted(p.name for p in (data_dir(central) / "staging").iterdir())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_error(response: httpx.Response, status: int, *needles: str) -> str:
    """A JSON ``{"error": "..."}`` with ``status``; the message mentions every needle."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"], body
    assert "internal error" not in body["error"]
    for needle in needles:
        assert needle.lower() in body["error"].lower(), (needle, body["error"])
    return body["error"]


def assert_manifest_matches_file(central: CentralServer, manifest: dict[str, Any], path: Path) -> None:
    """Whole-file digest, size and chunk blobs that reassemble the file byte for byte."""
    data = path.read_bytes()
    assert manifest["sha256"] == sha256(data)
    assert manifest["size"] == len(data)
    assert manifest["chunks"], "a manifest has at least one chunk"
    assembled = bytearray()
    for chunk in manifest["chunks"]:
        blob = blob_path(central, chunk["digest"]).read_bytes()
        assert len(blob) == chunk["size"]
        assert sha256(blob) == chunk["digest"]
        assembled += blob
    assert bytes(assembled) == data


async def assert_nothing_stored(
    api: httpx.AsyncClient, central: CentralServer, name: str, blobs_before: set[str]
) -> None:
    """A refused push leaves no version, no new blob and no staging file."""
    r = await api.get(f"/api/v1/models/{name}/versions")
    assert_error(r, 404)
    assert name not in [m["name"] for m in (await api.get("/api/v1/models")).json()]
    assert blob_files(central) == blobs_before
    assert staging_files(central) == []


@pytest.fixture(scope="module")
def variant_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same as ``model_file`` except the last layer: shares most chunks with it."""
    return build_mlp(tmp_path_factory.mktemp("variant") / "mlp-ft.onnx", width=384, hidden_layers=4, head_seed=1)


@pytest.fixture
async def small_central(tmp_path: Path) -> AsyncIterator[CentralServer]:
    """A central that takes uploads of at most 100 000 bytes."""
    server = CentralServer(central_settings(tmp_path / "small-central", max_upload_bytes=100_000))
    await server.start()
    yield server
    await server.stop()


# --------------------------------------------------------------------------- pushes


async def test_raw_push_returns_a_manifest_that_matches_the_file(
    api: httpx.AsyncClient, central: CentralServer, model_file: Path
) -> None:
    r = await push(api, "mlp", model_file)
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"manifest", "report"}
    m = body["manifest"]
    assert m["name"] == "mlp"
    assert m["version"] == "1"
    assert_manifest_matches_file(central, m, model_file)
    # ~2.7 MB with 64 KiB average chunks: dozens of chunks, none over the max.
    assert len(m["chunks"]) > 10
    assert all(c["size"] <= 256 * 1024 for c in m["chunks"])
    assert m["inputs"] == [{"name": "input", "dtype": "float32", "shape": [-1, 384]}]
    assert m["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}]
    assert m["labels"] == {}
    assert m["created_at"]
    assert body["report"]["chunks"] == len(m["chunks"])
    assert body["report"]["new_chunk_bytes"] == m["size"] or body["report"]["unique_chunks"] < len(m["chunks"])
    assert staging_files(central) == []


async def test_multipart_push_with_version_and_labels_fields(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    r = await api.post(
        "/api/v1/models/tiny/versions",
        files={"file": ("tiny.onnx", small_model_file.read_bytes(), "application/octet-stream")},
        data={"version": "2024.06-rc1", "labels": "team=vision,stage=canary"},
    )
    assert r.status_code == 201, r.text
    m = r.json()["manifest"]
    assert m["name"] == "tiny"
    assert m["version"] == "2024.06-rc1"
    assert m["labels"] == {"team": "vision", "stage": "canary"}
    assert_manifest_matches_file(central, m, small_model_file)
    assert m["inputs"] == [{"name": "input", "dtype": "float32", "shape": [-1, 32]}]
    assert m["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [-1, 10]}]
    assert staging_files(central) == []

    got = await api.get("/api/v1/models/tiny/versions/2024.06-rc1")
    assert got.status_code == 200
    assert got.json() == m


async def test_multipart_push_without_fields_is_auto_versioned(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    r = await api.post("/api/v1/models/tiny/versions", files={"file": ("x.onnx", small_model_file.read_bytes())})
    assert r.status_code == 201, r.text
    assert r.json()["manifest"]["version"] == "1"
    assert_manifest_matches_file(central, r.json()["manifest"], small_model_file)


async def test_versions_auto_increment(api: httpx.AsyncClient, small_model_file: Path, model_file: Path) -> None:
    versions = []
    for path in (small_model_file, model_file, small_model_file):
        r = await push(api, "m", path)
        assert r.status_code == 201, r.text
        versions.append(r.json()["manifest"]["version"])
    assert versions == ["1", "2", "3"]
    # Another model counts on its own.
    r = await push(api, "other", small_model_file)
    assert r.json()["manifest"]["version"] == "1"


async def test_explicit_version_label_and_query_labels(api: httpx.AsyncClient, small_model_file: Path) -> None:
    r = await push(api, "m", small_model_file, version="v1.2.3_beta", labels="owner=ml-platform, tier=gold")
    assert r.status_code == 201, r.text
    m = r.json()["manifest"]
    assert m["version"] == "v1.2.3_beta"
    assert m["labels"] == {"owner": "ml-platform", "tier": "gold"}

    listed = (await api.get("/api/v1/models/m/versions")).json()
    assert [(v["version"], v["labels"]) for v in listed] == [("v1.2.3_beta", {"owner": "ml-platform", "tier": "gold"})]
    got = (await api.get("/api/v1/models/m/versions/v1.2.3_beta")).json()
    assert got["labels"] == {"owner": "ml-platform", "tier": "gold"}


async def test_repeated_labels_params_are_merged(api: httpx.AsyncClient, small_model_file: Path) -> None:
    r = await api.post(
        "/api/v1/models/m/versions",
        params=[("labels", "a=1"), ("labels", "b=2,c=3")],
        content=small_model_file.read_bytes(),
    )
    assert r.status_code == 201, r.text
    assert r.json()["manifest"]["labels"] == {"a": "1", "b": "2", "c": "3"}


async def test_auto_version_after_an_explicit_numeric_label(api: httpx.AsyncClient, small_model_file: Path) -> None:
    """A push without a version must never be refused because a user picked a number."""
    assert (await push(api, "m", small_model_file, version="2")).status_code == 201
    r = await push(api, "m", small_model_file)
    assert r.status_code == 201, r.text
    assert r.json()["manifest"]["version"] != "2"
    assert len((await api.get("/api/v1/models/m/versions")).json()) == 2


async def test_concurrent_auto_versioned_pushes_all_succeed(
    api: httpx.AsyncClient, model_file: Path, variant_file: Path
) -> None:
    """Two clients pushing a new version of the same model at once both get one."""
    results = await asyncio.gather(push(api, "m", model_file), push(api, "m", variant_file))
    assert [r.status_code for r in results] == [201, 201], [r.text for r in results]
    assert sorted(r.json()["manifest"]["version"] for r in results) == ["1", "2"]


# --------------------------------------------------------------------------- reads


async def test_list_models_and_versions(api: httpx.AsyncClient, small_model_file: Path, model_file: Path) -> None:
    assert (await api.get("/api/v1/models")).json() == []
    await push(api, "beta", small_model_file)
    await push(api, "alpha", small_model_file)
    await push(api, "alpha", model_file, version="big")

    models = (await api.get("/api/v1/models")).json()
    assert [(m["name"], m["versions"], m["latest"]) for m in models] == [("alpha", 2, "big"), ("beta", 1, "1")]

    versions = (await api.get("/api/v1/models/alpha/versions")).json()
    assert [v["version"] for v in versions] == ["1", "big"]
    assert [v["seq"] for v in versions] == [1, 2]
    assert versions[0]["sha256"] == sha256(small_model_file.read_bytes())
    assert versions[1]["size"] == model_file.stat().st_size
    assert versions[1]["chunks"] > 10


async def test_get_manifest_equals_push_response(
    api: httpx.AsyncClient, central: CentralServer, model_file: Path
) -> None:
    pushed = (await push(api, "mlp", model_file)).json()["manifest"]
    got = await api.get("/api/v1/models/mlp/versions/1")
    assert got.status_code == 200
    assert got.json() == pushed
    assert_manifest_matches_file(central, got.json(), model_file)


async def test_health_and_stats(api: httpx.AsyncClient) -> None:
    assert (await api.get("/healthz")).json() == {"status": "ok"}
    stats = await api.get("/api/v1/stats")
    assert stats.status_code == 200
    assert "generation" in stats.json()


# --------------------------------------------------------------------------- deletes


async def test_delete_older_version_removes_only_its_unshared_blobs(
    api: httpx.AsyncClient, central: CentralServer, model_file: Path, variant_file: Path
) -> None:
    v1 = (await push(api, "mlp", model_file)).json()["manifest"]
    v2 = (await push(api, "mlp", variant_file)).json()["manifest"]
    d1 = {c["digest"] for c in v1["chunks"]}
    d2 = {c["digest"] for c in v2["chunks"]}
    shared, only_v1 = d1 & d2, d1 - d2
    assert shared and only_v1, "the fine-tune shares some chunks and changes some"
    assert len(shared) > len(only_v1)

    r = await api.delete("/api/v1/models/mlp/versions/1")
    assert r.status_code == 204
    assert r.content == b""

    assert_error(await api.get("/api/v1/models/mlp/versions/1"), 404)
    assert [v["version"] for v in (await api.get("/api/v1/models/mlp/versions")).json()] == ["2"]
    for digest in only_v1:
        assert not blob_path(central, digest).exists(), digest
    for digest in shared:
        assert blob_path(central, digest).is_file(), digest
    assert_manifest_matches_file(central, v2, variant_file)
    # Deleting again is a 404, not a 500.
    assert_error(await api.delete("/api/v1/models/mlp/versions/1"), 404)


async def test_delete_keeps_blobs_used_by_another_model(
    api: httpx.AsyncClient, central: CentralServer, model_file: Path, small_model_file: Path
) -> None:
    a1 = (await push(api, "a", model_file)).json()["manifest"]
    await push(api, "a", small_model_file)
    await push(api, "b", model_file)  # the very same chunks
    assert (await api.delete("/api/v1/models/a/versions/1")).status_code == 204
    assert_manifest_matches_file(central, {**a1}, model_file)
    b1 = (await api.get("/api/v1/models/b/versions/1")).json()
    assert_manifest_matches_file(central, b1, model_file)


async def test_deleting_the_latest_version_is_a_conflict(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path, model_file: Path
) -> None:
    await push(api, "m", small_model_file)
    assert_error(await api.delete("/api/v1/models/m/versions/1"), 409)  # only version = latest
    v2 = (await push(api, "m", model_file)).json()["manifest"]
    assert_error(await api.delete("/api/v1/models/m/versions/2"), 409)
    assert [v["version"] for v in (await api.get("/api/v1/models/m/versions")).json()] == ["1", "2"]
    assert_manifest_matches_file(central, v2, model_file)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "payload",
    [
        b"this is not an ONNX model at all\n",
        b"\x00" * 64,
        bytes(range(256)) * 40,
        b"\x08\x07\x12\x04junk",  # a valid-looking protobuf prefix without a graph
    ],
    ids=["text", "zeros", "binary", "protobuf-no-graph"],
)
async def test_non_onnx_bytes_are_refused_and_nothing_is_stored(
    api: httpx.AsyncClient, central: CentralServer, payload: bytes
) -> None:
    before = blob_files(central)
    assert_error(await api.post("/api/v1/models/junk/versions", content=payload), 400, "onnx")
    await assert_nothing_stored(api, central, "junk", before)


async def test_truncated_onnx_is_refused_and_nothing_is_stored(
    api: httpx.AsyncClient, central: CentralServer, model_file: Path
) -> None:
    data = model_file.read_bytes()
    before = blob_files(central)
    assert_error(await api.post("/api/v1/models/cut/versions", content=data[: len(data) // 2]), 400)
    await assert_nothing_stored(api, central, "cut", before)


async def test_truncated_multipart_upload_is_refused(
    api: httpx.AsyncClient, central: CentralServer, model_file: Path
) -> None:
    data = model_file.read_bytes()
    r = await api.post("/api/v1/models/cut/versions", files={"file": ("m.onnx", data[: len(data) // 2])})
    assert_error(r, 400)
    await assert_nothing_stored(api, central, "cut", set())


async def test_empty_body_is_refused(api: httpx.AsyncClient, central: CentralServer) -> None:
    assert_error(await api.post("/api/v1/models/empty/versions", content=b""), 400, "empty")
    await assert_nothing_stored(api, central, "empty", set())


async def test_multipart_without_a_file_field_is_refused(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    r = await api.post("/api/v1/models/m/versions", files={"model": ("m.onnx", small_model_file.read_bytes())})
    assert_error(r, 400, "file")
    await assert_nothing_stored(api, central, "m", set())


async def test_malformed_label_is_refused_and_nothing_is_staged(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    assert_error(await push(api, "m", small_model_file, labels="novalue"), 400, "novalue")
    await assert_nothing_stored(api, central, "m", set())


async def test_existing_model_push_of_junk_leaves_it_unchanged(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    v1 = (await push(api, "m", small_model_file)).json()["manifest"]
    before = blob_files(central)
    assert_error(await api.post("/api/v1/models/m/versions", content=b"garbage" * 100), 400)
    assert [v["version"] for v in (await api.get("/api/v1/models/m/versions")).json()] == ["1"]
    assert (await api.get("/api/v1/models/m/versions/1")).json() == v1
    assert blob_files(central) == before
    assert staging_files(central) == []
    # The failed push did not consume a version number.
    assert (await push(api, "m", small_model_file)).json()["manifest"]["version"] == "2"


@pytest.mark.parametrize(
    ("version", "needle"),
    [
        ("a/b", "path separator"),
        ("a\\b", "path separator"),
        ("..", ".."),
        ("v..1", ".."),
        ("v" * 129, "128"),
        ("with space", "letters"),
        ("-leading-dash", "start"),
        (".hidden", ""),
        ("semi;colon", "letters"),
        ("ünïcode", "letters"),
    ],
)
async def test_invalid_version_label_is_422(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path, version: str, needle: str
) -> None:
    assert_error(await push(api, "m", small_model_file, version=version), 422, needle)
    await assert_nothing_stored(api, central, "m", set())


async def test_invalid_version_in_a_multipart_field_is_422_and_nothing_is_staged(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    r = await api.post(
        "/api/v1/models/m/versions",
        files={"file": ("m.onnx", small_model_file.read_bytes())},
        data={"version": "bad/version"},
    )
    assert_error(r, 422, "path separator")
    await assert_nothing_stored(api, central, "m", set())


async def test_version_of_128_characters_is_fine(api: httpx.AsyncClient, small_model_file: Path) -> None:
    r = await push(api, "m", small_model_file, version="v" * 128)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("raw_name", "needle"),
    [
        ("a%2Fb", "path separator"),
        ("a%5Cb", "path separator"),
        ("a..b", ".."),
        ("n" * 129, "128"),
        ("with%20space", "letters"),
        ("_under", "start"),
    ],
)
async def test_invalid_model_name_is_422(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path, raw_name: str, needle: str
) -> None:
    r = await api.post(f"/api/v1/models/{raw_name}/versions", content=small_model_file.read_bytes())
    assert_error(r, 422, needle)
    assert (await api.get("/api/v1/models")).json() == []
    assert blob_files(central) == set()
    assert staging_files(central) == []


async def test_a_trailing_newline_in_a_version_or_name_is_422_and_nothing_is_stored(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    """``$`` with ``re.match`` matched before a trailing newline: ``?version=v1%0a`` was stored
    as version "v1\\n", a directory name on every edge."""
    body = small_model_file.read_bytes()
    for response in (
        await api.post("/api/v1/models/m/versions?version=v1%0a", content=body),
        await api.post("/api/v1/models/m/versions?version=v1%0d%0a", content=body),
        await api.post("/api/v1/models/m/versions", files={"file": ("m.onnx", body)}, data={"version": "v1\n"}),
        await api.post("/api/v1/models/m%0a/versions", content=body),
    ):
        message = assert_error(response, 422, "may only use letters, digits")
        assert "\\n'" in message, message  # the newline is shown escaped, at the end
    await assert_nothing_stored(api, central, "m", set())
    assert (await api.get("/api/v1/models")).json() == []
    for path in (
        "/api/v1/models/m%0a/versions",
        "/api/v1/models/m/versions/1%0a",
        "/api/v1/models/m%0a/rollout",
    ):
        assert_error(await api.get(path), 422, "may only use letters")
    assert_error(await api.delete("/api/v1/models/m/versions/1%0a"), 422, "may only use letters")
    assert_error(await api.post("/api/v1/models/m%0a/rollout/promote"), 422, "may only use letters")
    assert_error(await api.post("/api/v1/models/m%0a/rollback"), 422, "may only use letters")
    assert_error(await api.post("/api/v1/models/m/rollouts", json={"version": "1\x00"}), 422, "may only use letters")
    # the gateway says which rule, not "503: no node serves it, retry"
    infer = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}
    assert_error(await api.post("/v2/models/m%0a/infer", json=infer), 422, "may only use letters")
    assert_error(await api.post("/v2/models/m/versions/1%0a/infer", json=infer), 422, "may only use letters")


async def test_a_label_with_a_control_character_is_400_and_nothing_is_stored(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path
) -> None:
    for labels in ("site=shop%0aFORGED=1", "si%1bte=x"):
        response = await api.post(f"/api/v1/models/m/versions?labels={labels}", content=small_model_file.read_bytes())
        assert_error(response, 400, "control character")
    await assert_nothing_stored(api, central, "m", set())
    ok = await push(api, "m", small_model_file, labels="site=shop 1")  # spaces are fine in labels
    assert ok.status_code == 201 and ok.json()["manifest"]["labels"] == {"site": "shop 1"}


async def test_invalid_name_on_reads_is_422_not_500(api: httpx.AsyncClient) -> None:
    assert_error(await api.get("/api/v1/models/bad%20name/versions"), 422)
    assert_error(await api.get("/api/v1/models/m/versions/bad%20v"), 422)
    assert_error(await api.delete("/api/v1/models/m/versions/bad%20v"), 422)
    assert_error(await api.get("/api/v1/models/" + "n" * 129 + "/versions"), 422)


async def test_duplicate_version_is_409_and_the_existing_version_is_unchanged(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path, model_file: Path
) -> None:
    v1 = (await push(api, "m", small_model_file, version="stable")).json()["manifest"]
    before = blob_files(central)
    assert_error(await push(api, "m", model_file, version="stable"), 409, "stable")
    assert (await api.get("/api/v1/models/m/versions/stable")).json() == v1
    assert len((await api.get("/api/v1/models/m/versions")).json()) == 1
    assert blob_files(central) == before
    assert staging_files(central) == []
    assert_manifest_matches_file(central, v1, small_model_file)


async def test_duplicate_version_in_multipart_field_is_409(
    api: httpx.AsyncClient, central: CentralServer, small_model_file: Path, model_file: Path
) -> None:
    v1 = (await push(api, "m", small_model_file, version="stable")).json()["manifest"]
    before = blob_files(central)
    r = await api.post(
        "/api/v1/models/m/versions",
        files={"file": ("m.onnx", model_file.read_bytes())},
        data={"version": "stable"},
    )
    assert_error(r, 409, "stable")
    assert (await api.get("/api/v1/models/m/versions/stable")).json() == v1
    assert blob_files(central) == before
    assert staging_files(central) == []


async def test_duplicate_auto_version_number_is_409(api: httpx.AsyncClient, small_model_file: Path) -> None:
    await push(api, "m", small_model_file)
    assert_error(await push(api, "m", small_model_file, version="1"), 409)


# --------------------------------------------------------------------------- size limit


async def test_upload_over_the_limit_is_413(
    small_central: CentralServer, small_model_file: Path, model_file: Path
) -> None:
    async with httpx.AsyncClient(base_url=small_central.http_url, timeout=30.0) as api:
        # Under the limit is fine.
        assert small_model_file.stat().st_size < 100_000
        assert (await push(api, "tiny", small_model_file)).status_code == 201
        before = blob_files(small_central)

        assert_error(await push(api, "big", model_file), 413, "limit")
        # One byte over is refused too.
        assert_error(await api.post("/api/v1/models/big/versions", content=b"\x00" * 100_001), 413)
        await assert_nothing_stored(api, small_central, "big", before)


async def test_multipart_upload_over_the_limit_is_413(small_central: CentralServer, model_file: Path) -> None:
    async with httpx.AsyncClient(base_url=small_central.http_url, timeout=30.0) as api:
        r = await api.post("/api/v1/models/big/versions", files={"file": ("m.onnx", model_file.read_bytes())})
        assert_error(r, 413)
        await assert_nothing_stored(api, small_central, "big", set())


async def test_chunked_upload_without_content_length_over_the_limit_is_413(small_central: CentralServer) -> None:
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(10):
            sent += 16 * 1024
            yield b"\x01" * (16 * 1024)

    async with httpx.AsyncClient(base_url=small_central.http_url, timeout=30.0) as api:
        request = api.build_request("POST", "/api/v1/models/big/versions", content=body())
        assert "content-length" not in request.headers
        assert request.headers.get("transfer-encoding") == "chunked"
        r = await api.send(request)
        assert_error(r, 413, "limit")
        await assert_nothing_stored(api, small_central, "big", set())


async def test_chunked_upload_under_the_limit_is_accepted(small_central: CentralServer, small_model_file: Path) -> None:
    data = small_model_file.read_bytes()

    async def body() -> AsyncIterator[bytes]:
        for i in range(0, len(data), 1000):
            yield data[i : i + 1000]

    async with httpx.AsyncClient(base_url=small_central.http_url, timeout=30.0) as api:
        r = await api.post("/api/v1/models/tiny/versions", content=body())
        assert r.status_code == 201, r.text
        assert_manifest_matches_file(small_central, r.json()["manifest"], small_model_file)


# --------------------------------------------------------------------------- unknown


async def test_unknown_model_or_version_is_404(api: httpx.AsyncClient, small_model_file: Path) -> None:
    assert_error(await api.get("/api/v1/models/nope/versions"), 404, "nope")
    assert_error(await api.get("/api/v1/models/nope/versions/1"), 404)
    assert_error(await api.delete("/api/v1/models/nope/versions/1"), 404)
    await push(api, "m", small_model_file)
    assert_error(await api.get("/api/v1/models/m/versions/7"), 404, "7")
    assert_error(await api.delete("/api/v1/models/m/versions/7"), 404)
    assert_error(await api.get("/api/v1/no/such/route"), 404)


async def test_deleting_a_never_activated_version_succeeds(
    api: httpx.AsyncClient, small_model_file: Path, model_file: Path
) -> None:
    """``push --no-activate`` stores a version nothing serves: it may be deleted; the version
    the fleet serves (the last activated one) stays a conflict."""
    await push(api, "m2", small_model_file)
    await push(api, "m2", model_file, version="2", activate="false")
    assert (await api.delete("/api/v1/models/m2/versions/2")).status_code == 204
    assert [v["version"] for v in (await api.get("/api/v1/models/m2/versions")).json()] == ["1"]
    assert_error(await api.delete("/api/v1/models/m2/versions/1"), 409, "m2:1")
