"""Peer certificates are bound to node ids (issue 28): under TLS an edge's Peer service takes
a request's ``requester`` only from the node its client certificate names, and a node
calling peer X accepts only X's certificate. Real gRPC servers (a TLS central and a TLS
edge) with certificates of a private CA on loopback; clients are the project's own
``PeerClient`` and raw stubs showing other nodes' certificates."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from edge_node.fetch.sources import ChannelPool, PeerClient, wrong_certificate
from edge_node.server import EdgeServer
from fleetwire.peer_identity import node_dns_name, node_uri
from fleetwire.tls import TlsSettings, grpc_channel_credentials
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from support.certs import CertAuthority, LeafFiles
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.metrics import metric_samples, sample
from support.wait import wait_for


def _creds(leaf: LeafFiles) -> grpc.ChannelCredentials:
    return grpc_channel_credentials(TlsSettings.model_validate(leaf.tls()).material())


async def _fetch(stub: peer_pb2_grpc.PeerStub, digest: str, requester: str) -> bytes | grpc.StatusCode:
    try:
        request = peer_pb2.PeerFetchRequest(digest=digest, requester=requester)
        return b"".join([piece.data async for piece in stub.FetchChunk(request, timeout=10)])
    except grpc.aio.AioRpcError as exc:
        return exc.code()


async def _has(stub: peer_pb2_grpc.PeerStub, digest: str, requester: str) -> list[str] | grpc.StatusCode:
    try:
        reply = await stub.HasChunks(peer_pb2.HasChunksRequest(digests=[digest], requester=requester), timeout=10)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return list(reply.present)


@pytest.fixture
async def tls_edge(
    tmp_path: Path, make_edge: EdgeFactory, small_model_file: Path
) -> AsyncIterator[tuple[CertAuthority, EdgeServer, str, bytes]]:
    """A TLS central and edge-0 (certificate bound to its id) holding "tiny": the CA, the
    edge, the first chunk's digest and its bytes."""
    pki = CertAuthority(tmp_path / "pki")
    central = CentralServer(central_settings(tmp_path / "central", tls=pki.issue("central").tls()))
    await central.start()
    edge = await make_edge("edge-0", central, tls=pki.issue("edge-0", node_id="edge-0").tls())
    verify = ssl.create_default_context(cafile=str(pki.ca_file))
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30, verify=verify) as api:
        chunk = (await push(api, "tiny", small_model_file)).json()["manifest"]["chunks"][0]
    await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="edge-0 holding tiny:1")
    yield pki, edge, chunk["digest"], small_model_file.read_bytes()[: chunk["size"]]
    await edge.stop()
    await central.stop()


def test_a_node_certificate_carries_its_id_as_a_uri_and_a_dns_name(tmp_path: Path) -> None:
    from cryptography import x509

    leaf = CertAuthority(tmp_path / "pki").issue("edge-0", node_id="Edge_0.a")
    cert = x509.load_pem_x509_certificate(leaf.cert_file.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://modelfleet/node/Edge_0.a"]
    assert node_uri("Edge_0.a") == "spiffe://modelfleet/node/Edge_0.a"
    dns = sans.get_values_for_type(x509.DNSName)
    assert dns == ["localhost", node_dns_name("Edge_0.a")]
    assert node_dns_name("Edge_0.a") != node_dns_name("edge_0.a")  # ids differing in case stay apart
    with pytest.raises(ValueError, match="node id"):
        CertAuthority(tmp_path / "pki2").issue("x", node_id="bad/id")
    with pytest.raises(ValueError, match="only come with node_id"):
        CertAuthority(tmp_path / "pki3").issue("x", sans=(node_dns_name("edge-0"),))


async def test_a_certificate_claiming_another_node_is_refused_and_the_honest_one_is_served(
    tls_edge: tuple[CertAuthority, EdgeServer, str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    pki, edge, digest, data = tls_edge
    address = f"127.0.0.1:{edge.grpc_port}"
    edge_1, operator = pki.issue("edge-1", node_id="edge-1"), pki.issue("operator")
    servicer = edge.edge.peer_servicer
    caplog.set_level(logging.WARNING, logger="edge_node.peer.identity")
    async with (
        grpc.aio.secure_channel(address, _creds(edge_1)) as as_edge_1,
        grpc.aio.secure_channel(address, _creds(operator)) as as_operator,
    ):
        stub = peer_pb2_grpc.PeerStub(as_edge_1)
        # edge-1's certificate claiming to be edge-2: refused, with the reason
        with pytest.raises(grpc.aio.AioRpcError) as err:
            request = peer_pb2.PeerFetchRequest(digest=digest, requester="edge-2")
            [piece async for piece in stub.FetchChunk(request, timeout=10)]
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert err.value.details() == (
            "the client certificate is node 'edge-1''s, but the request claims node 'edge-2'"
            " (peer certificates are bound to node ids)"
        )
        assert await _has(stub, digest, "edge-2") == grpc.StatusCode.PERMISSION_DENIED
        assert servicer.chunks_served == 0 and servicer.limiter.open_streams == 0
        # the honest case: edge-1 as edge-1
        assert await _fetch(stub, digest, "edge-1") == data
        assert await _has(stub, digest, "edge-1") == [digest]
        assert await _has(stub, digest, "") == [digest]  # presence only: a claim is optional here
        # a fleet certificate that names no node fetches as nobody
        operator_stub = peer_pb2_grpc.PeerStub(as_operator)
        assert await _fetch(operator_stub, digest, "edge-1") == grpc.StatusCode.PERMISSION_DENIED
        assert await _fetch(operator_stub, digest, "") == grpc.StatusCode.PERMISSION_DENIED
        assert await _fetch(stub, digest, "") == grpc.StatusCode.PERMISSION_DENIED  # edge-1 must say so
    assert servicer.chunks_served == 1
    assert servicer.claims.refused == 5
    refusals = [r.getMessage() for r in caplog.records if r.name == "edge_node.peer.identity"]
    assert refusals and "claims node 'edge-2'" in refusals[0], refusals  # then at most one line per 10 s
    verify = ssl.create_default_context(cafile=str(pki.ca_file))
    async with httpx.AsyncClient(verify=verify, timeout=10) as client:
        metrics = metric_samples((await client.get(f"{edge.http_url}/metrics")).text)
    assert sample(metrics, "modelfleet_peer_claims_refused_total") == 5


async def test_a_node_calling_peer_x_accepts_only_xs_certificate(
    tls_edge: tuple[CertAuthority, EdgeServer, str, bytes],
) -> None:
    """edge-1 dials the address of edge-0. Expecting edge-0 there it gets the chunk;
    expecting edge-2 there (a placement saying so, or someone at edge-2's address with
    edge-0's certificate) the handshake fails before any request is sent."""
    pki, edge, digest, data = tls_edge
    address = f"127.0.0.1:{edge.grpc_port}"
    pool = ChannelPool(_creds(pki.issue("edge-1", node_id="edge-1")))
    client = PeerClient(pool, "edge-1")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.fetch("edge-2", address, digest, len(data), ["edge-2"], timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and wrong_certificate(err.value), err.value
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.has_chunks("edge-2", address, [digest])
        assert wrong_certificate(err.value)
        assert edge.edge.peer_servicer.chunks_served == 0  # nothing reached it
        assert await client.fetch("edge-0", address, digest, len(data), ["edge-0"], timeout=10) == data
        assert await client.has_chunks("edge-0", address, [digest]) == {digest}
    finally:
        await pool.close()
