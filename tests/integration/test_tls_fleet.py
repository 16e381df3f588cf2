"""A fleet with TLS on: central's gRPC and HTTPS, edges' Peer service (mutual TLS) and
HTTPS API, all with certificates made here by a private CA. Chunks move between edges
over mutual TLS, inference goes through central's HTTPS gateway to edges that demand a
client certificate, and clients without the CA or without a fleet certificate are
refused."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from central.server import CentralServer
from fleetwire.kserve import grpc_predict_v2_pb2, grpc_predict_v2_pb2_grpc
from fleetwire.v1 import peer_pb2, peer_pb2_grpc, registry_pb2, registry_pb2_grpc
from support.brokers import MosquittoBroker
from support.certs import CertAuthority, LeafFiles
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for


@pytest.fixture
def pki(tmp_path: Path) -> CertAuthority:
    return CertAuthority(tmp_path / "pki")


@pytest.fixture
async def tls_central(tmp_path: Path, pki: CertAuthority, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    """Central with TLS on and client certificates required on gRPC; one owner per chunk,
    so every edge fetches the chunks it does not own from the other edge."""
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    tls = pki.issue("central").tls(require_client_cert=True)
    server = CentralServer(
        central_settings(tmp_path / "central", tls=tls, mqtt=mqtt, broker=broker, placement={"replicas": 1})
    )
    await server.start()
    yield server
    await server.stop()


def _trusting(pki: CertAuthority, leaf: LeafFiles | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_file))
    if leaf is not None:
        context.load_cert_chain(leaf.cert_file, leaf.key_file)
    return context


def _grpc_creds(pki: CertAuthority, leaf: LeafFiles | None = None) -> grpc.ChannelCredentials:
    if leaf is None:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca_file.read_bytes())
    return grpc.ssl_channel_credentials(
        pki.ca_file.read_bytes(), leaf.key_file.read_bytes(), leaf.cert_file.read_bytes()
    )


async def _has_chunks(address: str, creds: grpc.ChannelCredentials) -> grpc.StatusCode:
    async with grpc.aio.secure_channel(address, creds) as channel:
        try:
            await peer_pb2_grpc.PeerStub(channel).HasChunks(peer_pb2.HasChunksRequest(digests=[]), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def _server_live(address: str, creds: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """ServerLive on a KServe v2 gRPC inference port (plaintext without ``creds``)."""
    channel = grpc.aio.secure_channel(address, creds) if creds is not None else grpc.aio.insecure_channel(address)
    async with channel:
        try:
            stub = grpc_predict_v2_pb2_grpc.GRPCInferenceServiceStub(channel)
            await stub.ServerLive(grpc_predict_v2_pb2.ServerLiveRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def _get_manifest(channel: grpc.aio.Channel) -> grpc.StatusCode:
    try:
        request = registry_pb2.GetManifestRequest(name="absent", version="1")
        await registry_pb2_grpc.RegistryStub(channel).GetManifest(request, timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_a_tls_fleet_moves_chunks_over_mutual_tls_and_serves_through_the_https_gateway(
    tls_central: CentralServer, pki: CertAuthority, mosquitto: MosquittoBroker, make_edge: EdgeFactory, model_file: Path
) -> None:
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    edges = [
        await make_edge(
            name,
            tls_central,
            tls=pki.issue(name, node_id=name).tls(require_client_cert=True),
            heartbeat=heartbeat,
            broker=broker,
        )
        for name in ("edge-0", "edge-1")
    ]
    assert tls_central.http_url.startswith("https://")
    async with httpx.AsyncClient(base_url=tls_central.http_url, verify=_trusting(pki), timeout=30) as api:
        assert (await push(api, "mlp", model_file)).status_code == 201
        await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), 30, "both edges")
        for edge in edges:  # the chunks it does not own came from the other edge, none refused
            assert edge.edge.fetcher.stats.chunks_from_peers > 0, edge.edge.fetcher.stats.as_dict()
            assert not edge.edge.fetcher.stats.peer_errors, edge.edge.fetcher.stats.as_dict()
        assert sum(e.edge.peer_servicer.chunks_served for e in edges) > 0

        tracker = tls_central.central.liveness
        await wait_for(lambda: len(tracker.ready_endpoints("mlp")) == 2, 20, "mlp ready in heartbeats")
        body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 384], "data": np.ones(384).tolist()}]}
        response = await api.post("/v2/models/mlp/infer", json=body)
        assert response.status_code == 200, response.text  # central → edge over HTTPS with its client cert
        serving = next(e for e in edges if e.node_id == response.headers["X-Modelfleet-Node"])
    # the gateway keeps an idle HTTPS connection to that edge, which never answers the edge's
    # close_notify: the edge aborts it instead of waiting asyncio's 30 s TLS shutdown timeout
    started = time.monotonic()
    await serving.stop()
    assert time.monotonic() - started < 10


async def test_tls_servers_refuse_clients_without_the_ca_or_a_fleet_certificate(
    tls_central: CentralServer, pki: CertAuthority, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edge = await make_edge(
        "edge-0", tls_central, tls=pki.issue("edge-0", node_id="edge-0").tls(require_client_cert=True)
    )
    await wait_for(edge.edge.follower.connected.is_set, 10, "the edge connected to central over mutual TLS")
    fleet_member = pki.issue("operator-tool")
    stranger = CertAuthority(tmp_path / "other-pki", name="other").issue("stranger")

    # central's gRPC: plaintext and certificate-less clients never reach the servicer
    async with grpc.aio.insecure_channel(tls_central.grpc_address) as channel:
        assert await _get_manifest(channel) == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.secure_channel(tls_central.grpc_address, _grpc_creds(pki)) as channel:
        assert await _get_manifest(channel) == grpc.StatusCode.UNAVAILABLE
    async with grpc.aio.secure_channel(tls_central.grpc_address, _grpc_creds(pki, fleet_member)) as channel:
        assert await _get_manifest(channel) == grpc.StatusCode.NOT_FOUND  # reached it: the model is unknown

    # an edge's Peer service: only a client with a certificate from the fleet CA
    peer = f"127.0.0.1:{edge.grpc_port}"
    assert await _has_chunks(peer, _grpc_creds(pki)) == grpc.StatusCode.UNAVAILABLE
    assert await _has_chunks(peer, _grpc_creds(pki, stranger)) == grpc.StatusCode.UNAVAILABLE
    assert await _has_chunks(peer, _grpc_creds(pki, fleet_member)) == grpc.StatusCode.OK

    # gRPC inference: the edge's as its HTTP API (a fleet certificate with require_client_cert);
    # central's gateway as its REST API (server TLS only: inference clients show no certificate)
    infer = edge.infer_grpc_address
    assert infer is not None and tls_central.infer_grpc_address is not None
    assert await _server_live(infer, None) == grpc.StatusCode.UNAVAILABLE
    assert await _server_live(infer, _grpc_creds(pki)) == grpc.StatusCode.UNAVAILABLE
    assert await _server_live(infer, _grpc_creds(pki, stranger)) == grpc.StatusCode.UNAVAILABLE
    assert await _server_live(infer, _grpc_creds(pki, fleet_member)) == grpc.StatusCode.OK
    assert await _server_live(tls_central.infer_grpc_address, None) == grpc.StatusCode.UNAVAILABLE
    assert await _server_live(tls_central.infer_grpc_address, _grpc_creds(pki)) == grpc.StatusCode.OK

    # HTTPS: a client that does not trust the fleet CA fails verification
    async with httpx.AsyncClient(trust_env=False) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.get(f"{tls_central.http_url}/healthz")
    async with httpx.AsyncClient(verify=_trusting(pki)) as client:
        assert (await client.get(f"{tls_central.http_url}/healthz")).status_code == 200
    # an edge with require_client_cert: a client trusting the CA but showing no certificate is refused
    async with httpx.AsyncClient(verify=_trusting(pki)) as client:
        with pytest.raises(httpx.TransportError):
            await client.get(f"{edge.http_url}/v2/health/live")
    async with httpx.AsyncClient(verify=_trusting(pki, fleet_member)) as client:
        assert (await client.get(f"{edge.http_url}/v2/health/live")).status_code == 200
