"""``/api/v1/transfer``: edges' chunk byte-rate caps, read and replaced live. Bad input
gets a 4xx with the field at fault; writes need an admin token; a change reaches a
connected edge's desired state, node over site over fleet, and the edge puts it in force."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from edge_node.server import EdgeServer
from fleetwire.transfer import TransferCaps
from support.fleet import EdgeFactory, central_settings
from support.metrics import metric_samples, sample
from support.wait import wait_for

EMPTY = {
    "fleet": {"serve_bytes_per_s": None, "fetch_bytes_per_s": None, "busy_serve_bytes_per_s": None},
    "sites": {},
    "nodes": {},
}


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"fleet": {"serve_bytes_per_s": -1}}, "body.fleet.serve_bytes_per_s"),
        ({"fleet": {"serve_bytes_per_s": "fast"}}, "body.fleet.serve_bytes_per_s"),
        ({"fleet": {"serve_bytes_per_s": 2**60}}, "body.fleet.serve_bytes_per_s"),
        ({"fleet": {"upload_bytes_per_s": 1}}, "body.fleet.upload_bytes_per_s"),
        ({"sites": {"bad site!": {}}}, "body.sites"),
        ({"nodes": {"": {"fetch_bytes_per_s": 1}}}, "body.nodes"),
        ({"regions": {}}, "body.regions"),
        ([1, 2], "body"),
    ],
)
async def test_bad_caps_are_refused_with_the_field_at_fault(
    api: httpx.AsyncClient, body: Any, where: str, central: CentralServer
) -> None:
    response = await api.put("/api/v1/transfer", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"].startswith(where), response.json()
    assert (await api.get("/api/v1/transfer")).json() == EMPTY  # nothing half-applied


async def test_a_body_that_is_not_json_is_refused(api: httpx.AsyncClient) -> None:
    response = await api.put("/api/v1/transfer", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and "error" in response.json()


async def test_caps_start_from_the_settings(tmp_path: Path) -> None:
    transfer = {"fleet": {"fetch_bytes_per_s": 5_000_000}, "sites": {"lab": {"serve_bytes_per_s": 0}}}
    server = CentralServer(central_settings(tmp_path / "central", transfer=transfer))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.http_url) as api:
            body = (await api.get("/api/v1/transfer")).json()
    finally:
        await server.stop()
    assert body["fleet"]["fetch_bytes_per_s"] == 5_000_000
    assert body["sites"] == {"lab": {"serve_bytes_per_s": 0, "fetch_bytes_per_s": None, "busy_serve_bytes_per_s": None}}


async def test_replaced_caps_outlive_a_restart(tmp_path: Path) -> None:
    """An operator's replacement is kept: the restarted central sends it, not the settings'."""
    settings = central_settings(tmp_path / "central", transfer={"fleet": {"fetch_bytes_per_s": 5_000_000}})
    for attempt in range(2):
        server = CentralServer(settings)
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=server.http_url) as api:
                if attempt == 0:
                    put = await api.put("/api/v1/transfer", json={"nodes": {"e1": {"serve_bytes_per_s": 1000}}})
                    assert put.status_code == 200, put.text
                body = (await api.get("/api/v1/transfer")).json()
        finally:
            await server.stop()
        assert body["fleet"]["fetch_bytes_per_s"] is None and body["nodes"]["e1"]["serve_bytes_per_s"] == 1000


@pytest.fixture
async def secured(tmp_path: Path) -> AsyncIterator[CentralServer]:
    server = CentralServer(central_settings(tmp_path / "central", auth={"enabled": True}))
    await server.start()
    yield server
    await server.stop()


async def test_changing_caps_needs_an_admin_token(secured: CentralServer, tmp_path: Path) -> None:
    tokens = TokenStore(tmp_path / "central" / "tokens.json")
    admin, viewer = tokens.create("ops", Role.ADMIN), tokens.create("dash", Role.VIEWER)
    body = {"fleet": {"fetch_bytes_per_s": 1_000_000}}
    async with httpx.AsyncClient(base_url=secured.http_url) as api:
        assert (await api.put("/api/v1/transfer", json=body)).status_code == 401
        refused = await api.put("/api/v1/transfer", json=body, headers={"Authorization": f"Bearer {viewer}"})
        assert refused.status_code == 403
        assert (await api.get("/api/v1/transfer")).json() == EMPTY
        done = await api.put("/api/v1/transfer", json=body, headers={"Authorization": f"Bearer {admin}"})
        assert done.status_code == 200 and done.json()["fleet"]["fetch_bytes_per_s"] == 1_000_000
        events = (await api.get("/api/v1/events")).json()
    changed = [e for e in events if e["type"] == "transfer_caps_changed"]
    assert len(changed) == 1 and changed[0]["actor"] == "ops"


def in_force(edge: EdgeServer) -> TransferCaps:
    return edge.edge.transfer.caps


async def test_a_change_reaches_connected_edges_node_over_site_over_fleet(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory
) -> None:
    own = {"serve_bytes_per_s": 7_000, "fetch_bytes_per_s": 8_000, "busy_serve_bytes_per_s": 9_000}
    a = await make_edge("edge-a", central, site="lab", transfer=own)
    b = await make_edge("edge-b", central, site="lab", transfer=own)
    c = await make_edge("edge-c", central, transfer=own)
    await wait_for(lambda: all(e.edge.follower.connected.is_set() for e in (a, b, c)), what="edges connected")
    assert in_force(a) == TransferCaps(7_000, 8_000, 9_000)  # central sets nothing: the edge's own

    policy = {
        "fleet": {"fetch_bytes_per_s": 1_000_000, "serve_bytes_per_s": 0},
        "sites": {"lab": {"fetch_bytes_per_s": 2_000_000}},
        "nodes": {"edge-a": {"fetch_bytes_per_s": 3_000_000, "busy_serve_bytes_per_s": 100_000}},
    }
    assert (await api.put("/api/v1/transfer", json=policy)).status_code == 200
    want = {
        a: TransferCaps(0, 3_000_000, 100_000),
        b: TransferCaps(0, 2_000_000, 9_000),
        c: TransferCaps(0, 1_000_000, 9_000),
    }
    await wait_for(lambda: all(in_force(e) == caps for e, caps in want.items()), timeout=10, what="caps in force")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.http_port}") as client:
        status = (await client.get("/api/v1/status")).json()
        samples = metric_samples((await client.get("/metrics")).text)
    assert sample(samples, "modelfleet_transfer_cap_bytes_per_second", direction="fetch") == 3_000_000
    assert status["transfer"]["caps"] == {
        "serve_bytes_per_s": 0,
        "fetch_bytes_per_s": 3_000_000,
        "busy_serve_bytes_per_s": 100_000,
    }

    assert (await api.put("/api/v1/transfer", json={})).status_code == 200  # back to the edges' own
    await wait_for(lambda: in_force(a) == TransferCaps(7_000, 8_000, 9_000), timeout=10, what="own caps again")
