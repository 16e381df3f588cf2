"""A central and four edges on loopback: a push reaches every edge byte for byte,
with the origin sending each chunk about once."""

from __future__ import annotations

from pathlib import Path

import httpx

from central.server import CentralServer
from support.fleet import EdgeFactory, push, version_state
from support.wait import wait_for


async def test_push_reaches_every_edge_byte_for_byte(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path
) -> None:
    edges = [await make_edge(f"edge-{i}", central) for i in range(4)]
    await wait_for(lambda: len(central.central.directory.nodes()) == 4, what="four registered edges")

    response = await push(api, "mlp", model_file)
    assert response.status_code == 201, response.text
    manifest = response.json()["manifest"]

    await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), what="rollout")
    expected = model_file.read_bytes()
    for edge in edges:
        assert edge.edge.files.model_path("mlp", "1").read_bytes() == expected

    origin = (await api.get("/api/v1/stats")).json()["origin"]
    size = manifest["size"]
    peer_errors = sum(sum(e.edge.fetcher.stats.peer_errors.values()) for e in edges)
    from_origin = sum(e.edge.fetcher.stats.bytes_from_origin for e in edges)
    from_peers = sum(e.edge.fetcher.stats.bytes_from_peers for e in edges)
    assert from_origin + from_peers == 4 * size  # every edge fetched each byte exactly once
    if peer_errors == 0:
        # Each chunk left the origin once, to its first owner; the rest came from peers.
        assert origin["bytes_sent"] == from_origin == size
    else:
        # A peer that timed out on a loaded machine sends its requester to the origin for
        # that chunk only; the fleet still stays near one copy from the origin.
        assert size <= from_origin <= origin["bytes_sent"] <= 1.25 * size


async def test_every_chunk_has_two_distinct_owners_spread_over_the_fleet(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path
) -> None:
    for i in range(4):
        await make_edge(f"edge-{i}", central)
    await wait_for(lambda: len(central.central.directory.nodes()) == 4, what="four registered edges")
    assert (await push(api, "mlp", model_file)).status_code == 201

    nodes = (await api.get("/api/v1/nodes")).json()
    owned = {n["node_id"]: n["owned_chunks"] for n in nodes}
    placement = central.central.placement.placement(("mlp", "1"))
    assert placement and all(len(set(owners)) == 2 for owners in placement.values())
    total = sum(owned.values())
    assert total == 2 * len(placement)
    cap = -(-125 * total // (100 * 4))  # ceil(1.25 × average)
    assert max(owned.values()) <= cap


async def test_a_new_version_replaces_the_old_one_on_every_edge(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, model_file: Path, tmp_path: Path
) -> None:
    from modelfleet.zoo import build_mlp

    edges = [await make_edge(f"edge-{i}", central) for i in range(2)]
    assert (await push(api, "mlp", model_file)).status_code == 201
    await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), what="v1")
    v2 = build_mlp(tmp_path / "v2.onnx", width=384, hidden_layers=4, head_seed=7)
    assert (await push(api, "mlp", v2)).status_code == 201
    await wait_for(lambda: all(version_state(e, "mlp", "2") == "complete" for e in edges), what="v2")
    for edge in edges:
        assert edge.edge.files.model_path("mlp", "2").read_bytes() == v2.read_bytes()
        assert version_state(edge, "mlp", "1") is None  # no longer desired
