"""A central and two sites of two edges on loopback: with site-aware placement each chunk
enters each site once (from origin into one site, from that site into the other), and
the rest of a site's bytes come from inside it. Site awareness off, some chunks have both
owners in one site and the other site's two edges each pull them across."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.fleet import EdgeFactory, central_settings, push, version_state
from support.wait import wait_for

SITES = {"east-1": "east", "east-2": "east", "west-1": "west", "west-2": "west"}


@pytest.fixture(params=[True, False], ids=["site-aware", "one-ring"])
async def sited_central(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[CentralServer]:
    """A central with site awareness on or off."""
    settings = central_settings(tmp_path / "central", placement={"site_aware": request.param})
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


def into_site(edges: list[EdgeServer], site: str) -> int:
    """Bytes the site's edges got from outside it: from origin or from other sites' edges."""
    stats = [e.edge.fetcher.stats for e in edges if e.settings.site == site]
    return sum(s.bytes_from_origin + s.bytes_from_other_sites for s in stats)


async def test_each_chunk_crosses_into_each_site_once(
    sited_central: CentralServer, make_edge: EdgeFactory, model_file: Path
) -> None:
    central = sited_central
    edges = [await make_edge(node, central, site=site) for node, site in SITES.items()]
    await wait_for(lambda: len(central.central.directory.nodes()) == 4, what="four registered edges")
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30.0) as api:
        response = await push(api, "mlp", model_file)
        assert response.status_code == 201, response.text
        chunks = {c["digest"]: c["size"] for c in response.json()["manifest"]["chunks"]}
        await wait_for(lambda: all(version_state(e, "mlp", "1") == "complete" for e in edges), what="rollout")
        nodes = {n["node_id"]: n["site"] for n in (await api.get("/api/v1/nodes")).json()}
    assert nodes == SITES
    async with httpx.AsyncClient(base_url=edges[0].http_url, timeout=10.0) as client:
        status = (await client.get("/api/v1/status")).json()
    assert status["site"] == SITES[status["node_id"]]
    fetch = status["fetch"]
    assert fetch["bytes_from_own_site"] + fetch["bytes_from_other_sites"] == fetch["bytes_from_peers"]

    unique = sum(chunks.values())
    peer_errors = sum(sum(e.edge.fetcher.stats.peer_errors.values()) for e in edges)
    crossed = {site: into_site(edges, site) for site in ("east", "west")}
    if central.central.placement.site_aware:
        if peer_errors == 0:
            assert crossed == {"east": unique, "west": unique}
        else:  # a peer timed out on a loaded machine: that chunk only went round it
            assert all(unique <= n <= 1.25 * unique for n in crossed.values()), crossed
    else:
        # The baseline: a chunk whose owners are all in one site enters the other twice.
        assert sum(crossed.values()) > 2 * unique, crossed
