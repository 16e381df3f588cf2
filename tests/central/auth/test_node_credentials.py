"""Node credentials on central's gRPC Registry API with ``auth.nodes_required``: a call
without a valid node token is UNAUTHENTICATED (operator tokens included), a node token
acts only for its own node id (PERMISSION_DENIED otherwise), a revoked token stops working
without a restart, the store holds no plaintext, and a real edge with its token registers,
fetches from the origin and serves, while an edge with another node's token is refused,
says so in one log line and keeps retrying."""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from typer.testing import CliRunner, Result

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from fleetwire.credentials import bearer_metadata
from fleetwire.v1 import registry_pb2, registry_pb2_grpc
from modelfleet.cli import app
from support.fleet import EdgeFactory, central_settings, push, version_state, wait_serving
from support.wait import wait_for

Metadata = tuple[tuple[str, str], ...]


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[CentralServer]:
    """Central requiring node tokens on its Registry and operator tokens for REST writes."""
    settings = central_settings(tmp_path / "central", auth={"enabled": True, "nodes_required": True})
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def stub(guarded: CentralServer) -> AsyncIterator[registry_pb2_grpc.RegistryStub]:
    async with grpc.aio.insecure_channel(guarded.grpc_address) as channel:
        yield registry_pb2_grpc.RegistryStub(channel)


def node_tokens(tmp_path: Path) -> TokenStore:
    return TokenStore(tmp_path / "central" / "node_tokens.json")


async def cli(*args: str) -> Result:
    """``modelfleet ARGS`` in a worker thread (central keeps serving on the loop)."""
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def node(node_id: str) -> registry_pb2.NodeInfo:
    return registry_pb2.NodeInfo(node_id=node_id, grpc_address="127.0.0.1:1", capacity=1)


async def code_of(call: object) -> grpc.StatusCode:
    """The status a unary call or the first read of a stream ends with."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if isinstance(call, grpc.aio.UnaryStreamCall):
            await call.read()
        else:
            await call  # type: ignore[misc]
    return err.value.code()


def every_rpc(stub: registry_pb2_grpc.RegistryStub, md: Metadata, node_id: str) -> dict[str, object]:
    return {
        "Register": stub.Register(registry_pb2.RegisterRequest(node=node(node_id)), metadata=md),
        "Unregister": stub.Unregister(registry_pb2.UnregisterRequest(node_id=node_id), metadata=md),
        "GetManifest": stub.GetManifest(registry_pb2.GetManifestRequest(name="m", version="1"), metadata=md),
        "FetchChunk": stub.FetchChunk(registry_pb2.OriginFetchRequest(digest="0" * 64, node_id=node_id), metadata=md),
        "WatchDesiredState": stub.WatchDesiredState(registry_pb2.WatchRequest(node_id=node_id), metadata=md),
    }


async def test_every_registry_call_needs_a_node_token_and_operator_tokens_are_not_one(
    tmp_path: Path, guarded: CentralServer, stub: registry_pb2_grpc.RegistryStub
) -> None:
    admin = TokenStore(tmp_path / "central" / "tokens.json").create("ci", Role.ADMIN)
    for md in ((), bearer_metadata("mft_not-a-token"), bearer_metadata(admin), (("authorization", f"Basic {admin}"),)):
        codes = {name: await code_of(call) for name, call in every_rpc(stub, md, "edge-a").items()}
        assert set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}, (md, codes)
    assert guarded.central.directory.get("edge-a") is None

    # Nor is a node token an operator: not from its own store, not copied into the operator one.
    node_token = node_tokens(tmp_path).create("edge-a", Role.NODE, node_id="edge-a")
    copied = TokenStore(tmp_path / "central" / "tokens.json").create("edge-b", Role.NODE, node_id="edge-b")
    async with httpx.AsyncClient(base_url=guarded.http_url, timeout=30) as api:
        for token in (node_token, copied):
            response = await api.delete("/api/v1/models/m/versions/1", headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 401, response.text


async def test_a_node_token_acts_only_for_its_own_node_and_revocation_is_immediate(
    tmp_path: Path, guarded: CentralServer, stub: registry_pb2_grpc.RegistryStub
) -> None:
    data_dir = str(tmp_path / "central")
    created = await cli("node-token", "create", "--node", "edge-a", "--data-dir", data_dir)
    assert created.exit_code == 0, created.output
    a = bearer_metadata(created.stdout.strip())
    b_token = node_tokens(tmp_path).create("edge-b", Role.NODE, node_id="edge-b")
    path = tmp_path / "central" / "node_tokens.json"
    stored = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert created.stdout.strip() not in stored and b_token not in stored and '"node_id": "edge-a"' in stored

    # edge-a's token may not register, watch, unregister or fetch as edge-b.
    codes = {name: await code_of(call) for name, call in every_rpc(stub, a, "edge-b").items() if name != "GetManifest"}
    assert set(codes.values()) == {grpc.StatusCode.PERMISSION_DENIED}, codes
    assert guarded.central.directory.get("edge-b") is None

    assert (await stub.Register(registry_pb2.RegisterRequest(node=node("edge-a")), metadata=a)).accepted
    assert (
        await stub.Register(registry_pb2.RegisterRequest(node=node("edge-b")), metadata=bearer_metadata(b_token))
    ).accepted
    watch = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="edge-b"), metadata=a)
    assert await code_of(watch) == grpc.StatusCode.PERMISSION_DENIED
    own_watch = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="edge-a"), metadata=a)
    assert isinstance(await own_watch.read(), registry_pb2.DesiredState)
    # Past the credential check, a node reads only manifests of its own desired state; whether
    # another version exists is not told (this one does not): tests/central/rest/test_origin_access.py.
    manifest = stub.GetManifest(registry_pb2.GetManifestRequest(name="m", version="1"), metadata=a)
    assert await code_of(manifest) == grpc.StatusCode.PERMISSION_DENIED

    revoked = await cli("node-token", "revoke", "--node", "edge-a", "--data-dir", data_dir)
    assert revoked.exit_code == 0, revoked.output
    register = stub.Register(registry_pb2.RegisterRequest(node=node("edge-a")), metadata=a)
    assert await code_of(register) == grpc.StatusCode.UNAUTHENTICATED
    # The stream edge-a opened before gets no further state: the next change ends it.
    d = bearer_metadata(node_tokens(tmp_path).create("edge-d", Role.NODE, node_id="edge-d"))
    assert (await stub.Register(registry_pb2.RegisterRequest(node=node("edge-d")), metadata=d)).accepted
    assert await code_of(own_watch) == grpc.StatusCode.UNAUTHENTICATED
    listed = await cli("node-token", "list", "--json", "--data-dir", data_dir)
    assert '"node_id": "edge-b"' in listed.stdout and "edge-a" not in listed.stdout


async def test_an_edge_with_its_token_serves_and_one_with_another_nodes_token_is_refused(
    tmp_path: Path,
    guarded: CentralServer,
    make_edge: EdgeFactory,
    small_model_file: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = node_tokens(tmp_path)
    token_file = tmp_path / "edge-a.token"
    token_file.write_text(store.create("edge-a", Role.NODE, node_id="edge-a") + "\n")
    edge = await make_edge("edge-a", guarded, node_token_file=token_file)
    caplog.set_level(logging.INFO, logger="edge_node.sync.follower")
    impostor = await make_edge("edge-c", guarded, node_token=token_file.read_text().strip())
    await wait_for(edge.edge.follower.connected.is_set, what="edge-a registered")

    admin = TokenStore(tmp_path / "central" / "tokens.json").create("ci", Role.ADMIN)
    headers = {"Authorization": f"Bearer {admin}"}
    async with httpx.AsyncClient(base_url=guarded.http_url, timeout=30, headers=headers) as api:
        assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="tiny on edge-a")
    await wait_serving(edge, "tiny", "1")
    assert edge.edge.fetcher.stats.bytes_from_origin > 0  # origin fetches carried the token too
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.5] * 32}]}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as client:
        assert (await client.post("/v2/models/tiny/infer", json=body)).status_code == 200

    # edge-c presented edge-a's token: refused on every retry, one error line, never registered.
    await wait_for(lambda: impostor.edge.follower.refusal is not None, what="edge-c refused")
    await asyncio.sleep(1.0)  # several retries at the test's 0.5 s backoff cap
    refused = [r for r in caplog.records if "refused this node's credential" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR and refused[0].exc_info is None
    assert "PERMISSION_DENIED" in refused[0].getMessage() and "'edge-a'" in refused[0].getMessage()
    assert not impostor.edge.follower.connected.is_set() and guarded.central.directory.get("edge-c") is None
    assert [n.node_id for n in guarded.central.directory.nodes()] == ["edge-a"]
