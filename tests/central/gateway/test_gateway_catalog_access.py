"""Issue 24, hole 9: with ``auth.protect_reads`` the gateway describes a model no node serves
(pushed, never activated) only to callers with an operator token; an anonymous caller gets the
same 404 as for a name nothing has, over REST and over the KServe v2 gRPC port alike. (With reads
open, everyone gets the registry's description: ``test_gateway_metadata.py``.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from fleetwire.credentials import bearer_metadata
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve import grpc_predict_v2_pb2_grpc
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings
from support.wait import wait_for


@pytest.fixture
async def guarded(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    settings = central_settings(
        tmp_path / "central", auth={"enabled": True, "protect_reads": True},
        mqtt={"enabled": True, "default_interval_s": 0.3}, broker={"host": mosquitto.host, "port": mosquitto.port},
    )  # fmt: skip
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


def _tokens(tmp_path: Path) -> TokenStore:
    return TokenStore(tmp_path / "central" / "tokens.json")


async def test_a_model_no_node_serves_is_described_only_to_readers(
    guarded: CentralServer, tmp_path: Path, small_model_file: Path, make_edge: EdgeFactory, mosquitto: MosquittoBroker
) -> None:
    admin = _tokens(tmp_path).create("ci", Role.ADMIN)
    viewer = _tokens(tmp_path).create("dash", Role.VIEWER)
    async with httpx.AsyncClient(base_url=guarded.http_url, timeout=30) as api:
        pushed = await api.post(
            "/api/v1/models/secret/versions", params={"activate": "false"}, content=small_model_file.read_bytes(),
            headers={"Authorization": f"Bearer {admin}"},
        )  # fmt: skip
        assert pushed.status_code == 201, pushed.text

        for path in ("/v2/models/secret", "/v2/models/secret/versions/1"):
            anonymous = await api.get(path)
            unknown = await api.get(path.replace("secret", "ghost"))
            assert anonymous.status_code == unknown.status_code == 404, anonymous.text
            assert anonymous.json()["error"] == unknown.json()["error"].replace("ghost", "secret")
            revoked = await api.get(path, headers={"Authorization": "Bearer mft_not-a-token"})
            assert revoked.status_code == 404
            for token in (viewer, admin):
                read = await api.get(path, headers={"Authorization": f"Bearer {token}"})
                assert read.status_code == 200, read.text
                assert read.json()["versions"] == ["1"] and read.json()["inputs"]

        # A model a node serves is that node's answer, to anyone (the gateway is open by design).
        pushed = await api.post(
            "/api/v1/models/public/versions", content=small_model_file.read_bytes(),
            headers={"Authorization": f"Bearer {admin}"},
        )  # fmt: skip
        assert pushed.status_code == 201, pushed.text
        broker = {"host": mosquitto.host, "port": mosquitto.port}
        edge = await make_edge("edge-0", guarded, heartbeat={"enabled": True, "interval_s": 0.3}, broker=broker)
        await wait_for(lambda: edge.edge.repository.ready(), 60, "public served")
        for _ in range(100):
            served = await api.get("/v2/models/public")
            if served.status_code == 200:
                break
            await asyncio.sleep(0.1)
        assert served.status_code == 200 and served.headers.get("x-modelfleet-node") == "edge-0", served.text
        assert (await api.get("/v2/models/secret")).status_code == 404

    assert guarded.infer_grpc_address is not None
    async with grpc.aio.insecure_channel(guarded.infer_grpc_address) as channel:
        stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name in ("secret", "ghost"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ModelMetadata(pb.ModelMetadataRequest(name=name))
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND
        meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="secret"), metadata=bearer_metadata(viewer))
        assert list(meta.versions) == ["1"] and meta.inputs
