"""Peer stream caps on a real edge: one calling node cannot hold more than its share of
chunk streams (RESOURCE_EXHAUSTED beyond, with the reason) while other nodes are still
served, and the total cap holds across nodes; slots come back when streams end. A node is
who its client certificate says (mutual TLS, as every TLS fleet's Peer service requires),
never the ``requester`` it names in a request (issue 24, hole 8); a requester other than
the certificate's node is refused outright (issue 28).

Streams are held open by asking for chunks the edge owns but cannot get yet: central's
egress is capped at 1 byte/s once its burst is spent, so the edge's own fetches of a
second model stall and every stream relaying one of those chunks waits on them."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from fleetwire.v1 import peer_pb2, peer_pb2_grpc
from support.certs import CertAuthority
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for

FETCH = {"attempts": 100, "backoff_s": 1.0, "backoff_max_s": 1.0}


async def _drain(stub: peer_pb2_grpc.PeerStub, digest: str, requester: str) -> bytes:
    request = peer_pb2.PeerFetchRequest(digest=digest, requester=requester)
    return b"".join([piece.data async for piece in stub.FetchChunk(request, timeout=10)])


@pytest.fixture
def pki(tmp_path: Path) -> CertAuthority:
    return CertAuthority(tmp_path / "pki")


@pytest.fixture
async def slow_central(tmp_path: Path, pki: CertAuthority) -> AsyncIterator[CentralServer]:
    """A TLS central whose origin sends its 256 KiB burst, then 1 byte/s."""
    tls = pki.issue("central").tls(require_client_cert=True)
    server = CentralServer(central_settings(tmp_path / "central", tls=tls, origin={"egress_bytes_s": 1}))
    await server.start()
    yield server
    await server.stop()


async def _stuck_edge(
    central: CentralServer, pki: CertAuthority, make_edge: EdgeFactory, small: Path, large: Path, limits: dict[str, int]
) -> tuple[EdgeServer, str, bytes, list[str]]:
    """An edge holding "tiny" (its first chunk's digest and bytes) and owning three chunks of
    "mlp" it cannot get: a stream asking for one of those stays open."""
    tls = pki.issue("edge-0", node_id="edge-0").tls(require_client_cert=True)
    edge = await make_edge("edge-0", central, tls=tls, limits=limits, fetch=FETCH)
    verify = ssl.create_default_context(cafile=str(pki.ca_file))
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30, verify=verify) as api:
        first = (await push(api, "tiny", small)).json()["manifest"]["chunks"][0]
        await wait_for(lambda: version_state(edge, "tiny", "1") == "complete", what="rollout")
        chunks = (await push(api, "mlp", large)).json()["manifest"]["chunks"]
    # The last chunks of the ~2.7 MB model: far past the burst, so the edge cannot have them.
    stuck = [c["digest"] for c in chunks[-3:]]
    await wait_for(lambda: all(edge.edge.view.owners(d) == ["edge-0"] for d in stuck), what="the edge owning them")
    assert not edge.edge.store.has_many(stuck)
    return edge, first["digest"], small.read_bytes()[: first["size"]], stuck


def _as(pki: CertAuthority, node: str, edge: EdgeServer) -> grpc.aio.Channel:
    """A channel to ``edge``'s Peer service showing the fleet certificate of node ``node``."""
    leaf = pki.issue(node, node_id=node)
    creds = grpc.ssl_channel_credentials(
        pki.ca_file.read_bytes(), leaf.key_file.read_bytes(), leaf.cert_file.read_bytes()
    )
    return grpc.aio.secure_channel(f"127.0.0.1:{edge.grpc_port}", creds)


async def test_streams_over_the_per_node_and_total_caps_are_refused(
    slow_central: CentralServer, pki: CertAuthority, make_edge: EdgeFactory, small_model_file: Path, model_file: Path
) -> None:
    limits = {"max_peer_streams_per_node": 2, "max_peer_streams": 3}
    edge, held, held_bytes, stuck = await _stuck_edge(
        slow_central, pki, make_edge, small_model_file, model_file, limits
    )
    limiter = edge.edge.peer_servicer.limiter
    async with _as(pki, "greedy", edge) as greedy, _as(pki, "polite", edge) as polite, _as(pki, "other", edge) as other:
        greedy_stub, polite_stub = peer_pb2_grpc.PeerStub(greedy), peer_pb2_grpc.PeerStub(polite)
        open_streams = [
            greedy_stub.FetchChunk(peer_pb2.PeerFetchRequest(digest=d, requester="greedy")) for d in stuck[:2]
        ]
        await wait_for(lambda: limiter.open_streams == 2, what="two streams of one node open")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(greedy_stub, held, "greedy")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams_per_node" in (err.value.details() or "")
        assert await _drain(polite_stub, held, "polite") == held_bytes

        third = peer_pb2_grpc.PeerStub(other).FetchChunk(peer_pb2.PeerFetchRequest(digest=stuck[2], requester="other"))
        await wait_for(lambda: limiter.open_streams == 3, what="the total cap reached")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(polite_stub, held, "polite")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams)" in (err.value.details() or "")

        for call in [*open_streams, third]:
            call.cancel()
        await wait_for(lambda: limiter.open_streams == 0, what="slots given back")
        assert await _drain(greedy_stub, held, "greedy") == held_bytes


async def test_the_per_node_cap_counts_the_callers_certificate_and_other_requesters_are_refused(
    slow_central: CentralServer, pki: CertAuthority, make_edge: EdgeFactory, small_model_file: Path, model_file: Path
) -> None:
    """A stolen edge's certificate naming a new ``requester`` in every call (which got one
    share of the cap per name before issue 24) is refused for any name but its own node's,
    taking no slot, and under its own gets ``max_peer_streams_per_node`` streams; another
    node is served meanwhile."""
    limits = {"max_peer_streams_per_node": 2, "max_peer_streams": 8}
    edge, held, held_bytes, stuck = await _stuck_edge(
        slow_central, pki, make_edge, small_model_file, model_file, limits
    )
    limiter = edge.edge.peer_servicer.limiter
    async with _as(pki, "edge-stolen", edge) as stolen, _as(pki, "edge-1", edge) as honest:
        stub = peer_pb2_grpc.PeerStub(stolen)
        for name in ("node-0", "node-1", "edge-1"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _drain(stub, stuck[0], name)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "'edge-stolen'" in (err.value.details() or "") and repr(name) in (err.value.details() or "")
        assert limiter.open_streams == 0
        request = peer_pb2.PeerFetchRequest
        calls = [stub.FetchChunk(request(digest=stuck[i], requester="edge-stolen")) for i in (0, 1)]
        await wait_for(lambda: limiter.open_streams == 2, what="two streams open")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _drain(stub, stuck[2], "edge-stolen")
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_peer_streams_per_node" in (err.value.details() or "")
        assert "edge-stolen" in (err.value.details() or "")
        assert await _drain(peer_pb2_grpc.PeerStub(honest), held, "edge-1") == held_bytes
        for call in calls:
            call.cancel()
        await wait_for(lambda: limiter.open_streams == 0, what="slots given back")
    assert edge.edge.peer_servicer.claims.refused == 3
