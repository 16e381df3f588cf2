"""The Registry gRPC service as an edge sees it: registration, manifests, the
owner-first rule on origin fetches, and the desired-state stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.sealing import SealError, open_seal
from fleetwire.v1 import registry_pb2, registry_pb2_grpc
from support.fleet import push


@pytest.fixture
async def stub(central: CentralServer) -> AsyncIterator[registry_pb2_grpc.RegistryStub]:
    async with grpc.aio.insecure_channel(central.grpc_address) as channel:
        yield registry_pb2_grpc.RegistryStub(channel)


async def _register(stub: registry_pb2_grpc.RegistryStub, node_id: str) -> registry_pb2.RegisterReply:
    node = registry_pb2.NodeInfo(node_id=node_id, grpc_address="127.0.0.1:1", capacity=1)
    reply = await stub.Register(registry_pb2.RegisterRequest(node=node))
    assert reply.accepted
    return reply


async def _fetch(stub: registry_pb2_grpc.RegistryStub, digest: str, node: str, failed: list[str]) -> bytes:
    request = registry_pb2.OriginFetchRequest(digest=digest, node_id=node, failed_owners=failed)
    return b"".join([piece.data async for piece in stub.FetchChunk(request)])


async def test_get_manifest_matches_the_rest_manifest(
    stub: registry_pb2_grpc.RegistryStub, api: httpx.AsyncClient, small_model_file: Path
) -> None:
    rest = (await push(api, "tiny", small_model_file)).json()["manifest"]
    pb = await stub.GetManifest(registry_pb2.GetManifestRequest(name="tiny", version="1"))
    assert pb.sha256 == rest["sha256"] and [c.digest for c in pb.chunks] == [c["digest"] for c in rest["chunks"]]
    assert [(i.name, i.dtype, list(i.shape)) for i in pb.inputs] == [("input", "float32", [-1, 32])]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetManifest(registry_pb2.GetManifestRequest(name="tiny", version="9"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_origin_serves_the_first_owner_and_refuses_others_until_owners_failed(
    central: CentralServer, stub: registry_pb2_grpc.RegistryStub, api: httpx.AsyncClient, model_file: Path
) -> None:
    for node in ("a", "b", "c"):
        await _register(stub, node)
    manifest = (await push(api, "mlp", model_file)).json()["manifest"]
    chunk = manifest["chunks"][0]
    first, second = central.central.placement.owners(chunk["digest"])
    outsider = ({"a", "b", "c"} - {first, second}).pop()

    assert len(await _fetch(stub, chunk["digest"], first, [])) == chunk["size"]
    for node, failed in ((second, []), (outsider, [first])):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _fetch(stub, chunk["digest"], node, failed)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert first in (err.value.details() or "")
    assert len(await _fetch(stub, chunk["digest"], second, [first])) == chunk["size"]
    assert len(await _fetch(stub, chunk["digest"], outsider, [first, second])) == chunk["size"]


async def test_origin_rejects_malformed_and_unknown_digests(stub: registry_pb2_grpc.RegistryStub) -> None:
    for digest, code in (
        ("../etc/passwd", grpc.StatusCode.INVALID_ARGUMENT),
        ("0" * 64 + "\n", grpc.StatusCode.INVALID_ARGUMENT),  # a digest is the whole string
        ("0" * 64, grpc.StatusCode.NOT_FOUND),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _fetch(stub, digest, "", [])
        assert err.value.code() == code


async def test_watch_needs_registration_and_sends_a_new_state_on_every_change(
    stub: registry_pb2_grpc.RegistryStub, api: httpx.AsyncClient, small_model_file: Path
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="nobody")):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    await _register(stub, "watcher")
    stream = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="watcher"))
    initial = await stream.read()
    assert isinstance(initial, registry_pb2.DesiredState) and not initial.versions
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    update = await asyncio.wait_for(stream.read(), timeout=10)
    assert isinstance(update, registry_pb2.DesiredState)
    assert update.generation > initial.generation
    assert [(v.manifest.name, v.manifest.version) for v in update.versions] == [("tiny", "1")]
    assert all(list(p.owners) == ["watcher"] for p in update.versions[0].placement)
    stream.cancel()


async def _node_ids(api: httpx.AsyncClient) -> list[str]:
    return [n["node_id"] for n in (await api.get("/api/v1/nodes")).json()]


async def test_a_node_whose_stream_closes_leaves_the_ring(
    api: httpx.AsyncClient, stub: registry_pb2_grpc.RegistryStub
) -> None:
    await _register(stub, "short-lived")
    stream = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="short-lived"))
    await stream.read()
    assert await _node_ids(api) == ["short-lived"]
    stream.cancel()
    for _ in range(100):
        if not await _node_ids(api):
            break
        await asyncio.sleep(0.05)
    assert await _node_ids(api) == []


@pytest.mark.parametrize(
    ("node_id", "labels", "needle"),
    [
        ("../x", {}, "path separator"),
        ("edge-a\n", {}, "may only use letters"),  # ``$`` with re.match let a trailing newline through
        ("edge-a", {"site": "shop-1\nforged=1"}, "control character"),
        ("edge-a", {"si\x1bte": "shop-1"}, "control character"),
    ],
)
async def test_register_rejects_a_bad_node_id_or_label(
    api: httpx.AsyncClient, stub: registry_pb2_grpc.RegistryStub, node_id: str, labels: dict[str, str], needle: str
) -> None:
    node = registry_pb2.NodeInfo(node_id=node_id, grpc_address="127.0.0.1:1", labels=labels)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Register(registry_pb2.RegisterRequest(node=node))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in (err.value.details() or "")
    assert await _node_ids(api) == []


async def test_every_state_is_sealed_for_its_node_and_starts_above_the_edges_generation(
    stub: registry_pb2_grpc.RegistryStub, api: httpx.AsyncClient, small_model_file: Path
) -> None:
    reply = await _register(stub, "sealed")
    held = 1_000_000  # what another replica, or this central before a restart, had reached
    stream = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="sealed", since_generation=held))
    first = await stream.read()
    assert isinstance(first, registry_pb2.DesiredState) and first.generation == held + 1
    seal = open_seal(first, "sealed", reply.manifest_public_key)
    assert seal.generation == first.generation and seal.issued_at_ms > 0
    assert first.seal_root_signature and not first.seal_signature  # the tree form: one signature per batch
    with pytest.raises(SealError):
        open_seal(first, "another-node", reply.manifest_public_key)
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    update = await asyncio.wait_for(stream.read(), timeout=10)
    assert isinstance(update, registry_pb2.DesiredState) and update.generation == held + 2
    assert [(v.name, v.version, v.serve) for v in open_seal(update, "sealed", reply.manifest_public_key).versions] == [
        ("tiny", "1", True)
    ]
    stream.cancel()
