"""Malformed gRPC requests against real servers: unknown or malformed digests, huge or
empty node ids, huge sizes and garbage lists get a status that says what was wrong
(NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION), never UNKNOWN or INTERNAL."""

from __future__ import annotations

import hashlib
from pathlib import Path

import grpc
import httpx
import pytest

from central.server import CentralServer
from fleetwire.v1 import peer_pb2, peer_pb2_grpc, registry_pb2, registry_pb2_grpc
from support.fleet import EdgeFactory, push
from support.wait import wait_for

CLIENT_ERRORS = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
UNKNOWN = hashlib.sha256(b"never pushed").hexdigest()
HUGE = "n" * 100_000


async def _code(call: object) -> grpc.StatusCode:
    """The status a unary or streaming call ends with."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        if hasattr(call, "__aiter__"):
            async for _ in call:  # type: ignore[attr-defined]
                pass
        else:
            await call  # type: ignore[misc]
    return err.value.code()


async def test_central_answers_malformed_registry_requests_with_client_errors(
    central: CentralServer, api: httpx.AsyncClient, small_model_file: Path
) -> None:
    manifest = (await push(api, "tiny", small_model_file, version="v1")).json()["manifest"]
    real = manifest["chunks"][0]["digest"]
    fetch = registry_pb2.OriginFetchRequest
    cases = {
        "unknown digest": (fetch(digest=UNKNOWN, node_id="n1"), grpc.StatusCode.NOT_FOUND),
        "malformed digest": (fetch(digest="../../etc/passwd", node_id="n1"), grpc.StatusCode.INVALID_ARGUMENT),
        "upper-case digest": (fetch(digest=UNKNOWN.upper()), grpc.StatusCode.INVALID_ARGUMENT),
        "empty digest": (fetch(digest=""), grpc.StatusCode.INVALID_ARGUMENT),
        "huge digest": (fetch(digest="a" * 1_000_000), grpc.StatusCode.INVALID_ARGUMENT),
        "unknown digest, huge node id": (fetch(digest=UNKNOWN, node_id=HUGE), grpc.StatusCode.NOT_FOUND),
        "unknown digest, garbage owners": (
            fetch(digest=UNKNOWN, node_id="\u2603", failed_owners=["", HUGE, "\x00"]),
            grpc.StatusCode.NOT_FOUND,
        ),
    }
    async with grpc.aio.insecure_channel(central.grpc_address) as channel:
        stub = registry_pb2_grpc.RegistryStub(channel)
        for what, (request, expected) in cases.items():
            assert await _code(stub.FetchChunk(request)) in (expected if isinstance(expected, set) else {expected}), (
                what
            )
        for name, version in (("tiny", "v9"), ("nope", "v1"), ("", ""), (HUGE, "v1"), ("../x", "\u00e9")):
            code = await _code(stub.GetManifest(registry_pb2.GetManifestRequest(name=name, version=version)))
            assert code in CLIENT_ERRORS, (name[:20], version, code)
        for node_id in ("unregistered", "", HUGE, "\u00e9\u2603"):
            code = await _code(stub.WatchDesiredState(registry_pb2.WatchRequest(node_id=node_id)))
            assert code in CLIENT_ERRORS, (node_id[:20], code)
        for node_id in ("", HUGE, "a/b", "\x00"):
            node = registry_pb2.NodeInfo(node_id=node_id, grpc_address="127.0.0.1:1")
            code = await _code(stub.Register(registry_pb2.RegisterRequest(node=node)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (node_id[:20], code)
        # A real chunk for a well-formed outsider is still served after all of that.
        pieces = [p.data async for p in stub.FetchChunk(fetch(digest=real, node_id=""))]
        assert hashlib.sha256(b"".join(pieces)).hexdigest() == real


async def test_edge_peer_service_answers_malformed_requests_with_client_errors(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    manifest = (await push(api, "tiny", small_model_file, version="v1")).json()["manifest"]
    edge = await make_edge("peer-fuzzed", central)
    await wait_for(lambda: edge.edge.repository.ready(), what="the edge serving tiny")
    held = [c["digest"] for c in manifest["chunks"]]
    fetch = peer_pb2.PeerFetchRequest
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.grpc_port}") as channel:
        stub = peer_pb2_grpc.PeerStub(channel)
        cases = {
            "unknown digest": (fetch(digest=UNKNOWN), grpc.StatusCode.NOT_FOUND),
            "unknown digest, huge size, other owners": (
                fetch(digest=UNKNOWN, size=2**63, owners=["elsewhere", HUGE]),
                grpc.StatusCode.NOT_FOUND,
            ),
            "malformed digest": (fetch(digest="zz" * 32), grpc.StatusCode.INVALID_ARGUMENT),
            "huge digest": (fetch(digest="a" * 1_000_000), grpc.StatusCode.INVALID_ARGUMENT),
            "empty digest": (fetch(digest=""), grpc.StatusCode.INVALID_ARGUMENT),
            "long digest": (fetch(digest="b" * 100_000), grpc.StatusCode.INVALID_ARGUMENT),
            "unknown digest it owns, huge size": (
                # It tries its sources first (central answers NOT_FOUND); what it reports is
                # retryable, not a crash.
                fetch(digest=UNKNOWN, size=2**63, owners=[edge.node_id]),
                {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE},
            ),
        }
        for what, (request, expected) in cases.items():
            assert await _code(stub.FetchChunk(request)) in (expected if isinstance(expected, set) else {expected}), (
                what
            )
        garbage = ["", "x" * 10_000, "../../etc", "\u2603" * 64, UNKNOWN.upper()]
        many = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(5000)]
        reply = await stub.HasChunks(peer_pb2.HasChunksRequest(digests=[*garbage, *many, *held]))
        assert list(reply.present) == held  # only what it holds; garbage and unknowns left out
