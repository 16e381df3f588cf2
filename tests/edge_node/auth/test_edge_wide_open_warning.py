"""An edge says so, in one line per listener, when it starts listening beyond loopback
without TLS (the Peer service) or without client certificates (the HTTP API and the gRPC
inference port), naming the
settings that close it; on loopback it says nothing."""

from __future__ import annotations

import logging

import pytest

from central.server import CentralServer
from support.fleet import EdgeFactory


async def test_an_edge_on_every_address_without_tls_warns_once_per_listener(
    central: CentralServer, make_edge: EdgeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edge_node.server")
    quiet = await make_edge("edge-lo", central)
    assert [r for r in caplog.records if r.name == "edge_node.server"] == []

    edge = await make_edge("edge-any", central, http_host="0.0.0.0", grpc_host="[::]", advertise_host="127.0.0.1")
    http, inference, peer = [r.getMessage() for r in caplog.records if r.name == "edge_node.server"]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "edge_node.server")
    assert http.startswith(f"WIDE OPEN: edge edge-any HTTP API listens on 0.0.0.0:{edge.http_port},")
    assert "MODELFLEET_TLS__REQUIRE_CLIENT_CERT=true" in http and "MODELFLEET_TLS__ENABLED=true" in http
    assert inference.startswith(f"WIDE OPEN: edge edge-any gRPC inference listens on 0.0.0.0:{edge.infer_grpc_port},")
    assert "MODELFLEET_TLS__REQUIRE_CLIENT_CERT=true" in inference  # guarded as the HTTP API beside it
    assert peer.startswith(f"WIDE OPEN: edge edge-any Peer gRPC listens on [::]:{edge.grpc_port},")
    assert peer.count("MODELFLEET_TLS__ENABLED=true") == 1  # one setting closes both of its gaps
    assert quiet.http_port != edge.http_port
