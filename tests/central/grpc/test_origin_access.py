"""A stolen edge reads only what its desired state holds. With ``auth.nodes_required`` a node
gets the manifests of versions in its desired state and, of their chunks, every chunk of a
version it serves and the chunks it owns (seeds) of the others; anything else is
PERMISSION_DENIED, asked before whether it exists. A canary's version is readable whole by
the canary and only in its owned chunks by the rest; a version replaced while a node still
fetches for it stays readable by that node for ``origin.replaced_state_grace_s``.

Real central (gRPC on port 0, real registry, rollouts and placement) and raw Registry clients
holding node tokens, as a stolen edge would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from fleetwire.credentials import bearer_metadata
from fleetwire.v1 import registry_pb2
from fleetwire.v1.registry_pb2_grpc import RegistryStub
from modelfleet.zoo import build_mlp
from support.fleet import central_settings, push

Metadata = tuple[tuple[str, str], ...]
DENIED = grpc.StatusCode.PERMISSION_DENIED


@contextlib.asynccontextmanager
async def _guarded(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[CentralServer, RegistryStub]]:
    """Central requiring node and operator tokens, one owner per chunk; and a Registry client."""
    auth = {"enabled": True, "nodes_required": True}
    server = CentralServer(central_settings(tmp_path / "central", auth=auth, placement={"replicas": 1}, **overrides))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.grpc_address) as channel:
            yield server, RegistryStub(channel)
    finally:
        await server.stop()


def _admin(server: CentralServer, tmp_path: Path) -> httpx.AsyncClient:
    token = TokenStore(tmp_path / "central" / "tokens.json").create("ops", Role.ADMIN)
    return httpx.AsyncClient(base_url=server.http_url, timeout=60, headers={"Authorization": f"Bearer {token}"})


class Node:
    """A node as a thief holding its token would drive it: registered, watching, fetching."""

    def __init__(self, stub: RegistryStub, tmp_path: Path, node_id: str) -> None:
        self.stub, self.id = stub, node_id
        store = TokenStore(tmp_path / "central" / "node_tokens.json")
        self.md: Metadata = bearer_metadata(store.create(node_id, Role.NODE, node_id=node_id))
        self.watch: Any = None

    async def join(self, **labels: str) -> registry_pb2.DesiredState:
        info = registry_pb2.NodeInfo(node_id=self.id, grpc_address="127.0.0.1:1", capacity=1, labels=labels)
        assert (await self.stub.Register(registry_pb2.RegisterRequest(node=info), metadata=self.md)).accepted
        self.watch = self.stub.WatchDesiredState(registry_pb2.WatchRequest(node_id=self.id), metadata=self.md)
        state: registry_pb2.DesiredState = await self.watch.read()
        return state

    async def state_until(self, ok: Callable[[registry_pb2.DesiredState], bool]) -> registry_pb2.DesiredState:
        """Read the watch stream until a state satisfies ``ok``."""
        while True:
            state: registry_pb2.DesiredState = await asyncio.wait_for(self.watch.read(), timeout=20)
            if ok(state):
                return state

    async def manifest(self, name: str, version: str) -> grpc.StatusCode:
        request = registry_pb2.GetManifestRequest(name=name, version=version)
        try:
            await self.stub.GetManifest(request, metadata=self.md)
        except grpc.aio.AioRpcError as err:
            return err.code()
        return grpc.StatusCode.OK

    async def chunk(self, digest: str, failed: tuple[str, ...] = ("a", "b")) -> grpc.StatusCode:
        """Fetch as if every owner had failed (so the owner-first rule never decides)."""
        request = registry_pb2.OriginFetchRequest(digest=digest, node_id=self.id, failed_owners=list(failed))
        try:
            data = b"".join([p.data async for p in self.stub.FetchChunk(request, metadata=self.md)])
        except grpc.aio.AioRpcError as err:
            return err.code()
        assert data
        return grpc.StatusCode.OK


def _serves(state: registry_pb2.DesiredState, name: str, version: str) -> bool | None:
    """Whether the state says serve (True) or seed (False) the version; None when absent."""
    found = [v.serve for v in state.versions if (v.manifest.name, v.manifest.version) == (name, version)]
    return found[0] if found else None


async def test_a_node_reads_only_its_desired_state_and_a_canary_version_only_where_it_serves_or_owns(
    tmp_path: Path,
    small_model_file: Path,
    model_file: Path,
) -> None:
    async with _guarded(tmp_path) as (guarded, stub):
        a, b = Node(stub, tmp_path, "a"), Node(stub, tmp_path, "b")
        await a.join(ring="canary")
        await b.join(ring="main")
        async with _admin(guarded, tmp_path) as api:
            v1 = (await push(api, "mlp", small_model_file)).json()["manifest"]
            v2 = (await push(api, "mlp", model_file, activate="false")).json()["manifest"]
            hidden = (await push(api, "hidden", small_model_file, version="9", activate="false")).json()["manifest"]
            for node in (a, b):
                await node.state_until(lambda s: _serves(s, "mlp", "1") is True)

            for node in (a, b):
                assert await node.manifest("mlp", "1") == grpc.StatusCode.OK
                assert await node.chunk(v1["chunks"][0]["digest"]) == grpc.StatusCode.OK
                # stored but in no one's desired state: neither the manifest nor a byte, and no hint
                # whether it exists (an unknown version answers the same)
                for name, version in (("mlp", "2"), ("hidden", "9"), ("nope", "1")):
                    assert await node.manifest(name, version) == DENIED, (node.id, name, version)
                assert await node.chunk(v2["chunks"][0]["digest"]) == DENIED
                assert await node.chunk("0" * 64) == DENIED
                assert await node.manifest("mlp", "1\n") == grpc.StatusCode.INVALID_ARGUMENT
            # hidden shares its only chunk with mlp:1 (same file): readable as mlp:1's, not as hidden's
            assert hidden["chunks"] == v1["chunks"]

            body = {"version": "2", "canary": 1.0, "selector": {"ring": "canary"}}
            assert (await api.post("/api/v1/models/mlp/rollouts", json=body)).status_code == 201
        await a.state_until(lambda s: _serves(s, "mlp", "2") is True)
        await b.state_until(lambda s: _serves(s, "mlp", "2") is False)  # b holds v2 only to seed its chunks

        owners = guarded.central.placement.placement(("mlp", "2"))
        of_a = [d for d, o in owners.items() if o == ["a"]]
        of_b = [d for d, o in owners.items() if o == ["b"]]
        assert of_a and of_b, owners  # one owner per chunk: the chunks are split between the two
        assert await a.manifest("mlp", "2") == await b.manifest("mlp", "2") == grpc.StatusCode.OK
        for digest in (of_a[0], of_b[0]):
            assert await a.chunk(digest) == grpc.StatusCode.OK  # the canary serves v2: every chunk
        assert await b.chunk(of_b[0]) == grpc.StatusCode.OK  # b seeds what it owns
        assert await b.chunk(of_a[0]) == DENIED  # but is given nothing else of a version it does not serve
        assert guarded.central.origin.stats.denied >= 1

        # Without credentials the same central still refuses every Registry call.
        anonymous = registry_pb2.OriginFetchRequest(digest=of_a[0], node_id="b", failed_owners=["a"])
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.FetchChunk(anonymous).read()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_version_replaced_while_a_node_fetches_stays_readable_by_that_node_for_the_grace(
    tmp_path: Path, small_model_file: Path
) -> None:
    grace = 1.5
    other = build_mlp(tmp_path / "other.onnx", width=48, hidden_layers=1)
    async with _guarded(tmp_path, origin={"replaced_state_grace_s": grace}) as (server, stub):
        a, late = Node(stub, tmp_path, "a"), Node(stub, tmp_path, "b")
        await a.join()
        async with _admin(server, tmp_path) as api:
            v1 = (await push(api, "tiny", small_model_file)).json()["manifest"]
            await a.state_until(lambda s: _serves(s, "tiny", "1") is True)
            assert (await push(api, "tiny", other)).status_code == 201  # v2 replaces v1 everywhere
        # Central has sent a's new state (a read it: the state a still acted on is replaced).
        await a.state_until(lambda s: _serves(s, "tiny", "1") is None)
        await late.join()  # a node that joined after the change was never given v1

        digest = v1["chunks"][0]["digest"]
        assert await a.manifest("tiny", "1") == grpc.StatusCode.OK  # a request that lost the race
        assert await a.chunk(digest, failed=("a",)) == grpc.StatusCode.OK
        assert await late.chunk(digest, failed=("a", "b")) == DENIED
        assert await late.manifest("tiny", "1") == DENIED

        await asyncio.sleep(grace + 0.2)
        assert await a.manifest("tiny", "1") == DENIED
        assert await a.chunk(digest, failed=("a",)) == DENIED
