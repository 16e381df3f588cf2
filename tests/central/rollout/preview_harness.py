"""Shared by the cost-preview tests: preview a rollout over the API, run it, and compare the
preview with each edge's own fetch counters (``GET /api/v1/status`` on the edge)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from edge_node.server import EdgeServer
from support.fleet import version_state
from support.wait import wait_for

#: Worst relative error per node the issue allows (bench.rollout's ``preview_error``).
MAX_ERROR = 0.05


@dataclass
class Comparison:
    """A preview and what the rollout then cost."""

    preview: dict[str, Any]
    #: node → bytes fetched during the rollout (all edges, targeted or not).
    measured: dict[str, int]
    #: Worst relative error per node, preview against measured bytes.
    worst: float


async def fetched(edges: dict[str, EdgeServer]) -> dict[str, dict[str, int]]:
    """Each edge's fetch counters from its own ``/api/v1/status``."""
    out = {}
    for node, edge in edges.items():
        async with httpx.AsyncClient(base_url=edge.http_url, timeout=10.0) as client:
            fetch = (await client.get("/api/v1/status")).json()["fetch"]
        out[node] = {k: int(fetch[k]) for k in ("bytes_fetched", "bytes_from_peers", "bytes_from_origin")}
        out[node]["detours"] = sum(fetch["peer_errors"].values()) + int(fetch["origin_refusals"])
    return out


async def settled(
    edges: dict[str, EdgeServer], model: str, version: str, targets: list[str]
) -> dict[str, dict[str, int]]:
    """Counters once every target serves ``version`` and nothing was fetched for 1 s (seeding done)."""
    await wait_for(lambda: all(version_state(edges[n], model, version) == "complete" for n in targets), 60, version)
    last, since = await fetched(edges), time.monotonic()
    while time.monotonic() - since < 1.0:
        await asyncio.sleep(0.1)
        now = await fetched(edges)
        if now != last:
            last, since = now, time.monotonic()
    return last


def error(predicted: int, measured: int) -> float:
    """Relative error of a prediction (0 when both are 0)."""
    return abs(predicted - measured) / max(measured, predicted, 1)


async def preview_then_roll_out(
    api: httpx.AsyncClient, edges: dict[str, EdgeServer], model: str, version: str, targets: list[str], **body: Any
) -> Comparison:
    """Preview ``version`` of ``model`` (``body``: the rest of the rollout request), check the
    dry run wrote nothing, start it for real with every target at once, and compare. When no
    peer failed and central refused nothing, the split between peers and central per node
    must hold too."""
    before = await fetched(edges)
    rollouts_before = (await api.get("/api/v1/rollouts")).json()
    request = {"version": version, "canary": 1.0, "soak_s": 0, **body}
    url = f"/api/v1/models/{model}/rollouts"
    response = await api.post(url, params={"dry_run": "true"}, json=request)
    assert response.status_code == 200, response.text
    preview = response.json()
    assert (await api.get("/api/v1/rollouts")).json() == rollouts_before  # a dry run writes nothing
    assert preview["refused"] is None and preview["targets"] == targets

    assert (await api.post(url, json=request)).status_code == 201
    after = await settled(edges, model, version, targets)
    measured = {n: after[n]["bytes_fetched"] - before[n]["bytes_fetched"] for n in edges}
    by_node = {n["node_id"]: n for n in preview["nodes"]}
    worst = max(error(by_node[n]["bytes_total"] if n in by_node else 0, measured[n]) for n in edges)
    egress = sum(after[n]["bytes_from_origin"] - before[n]["bytes_from_origin"] for n in edges)
    detours = {n: after[n]["detours"] - before[n]["detours"] for n in edges}
    print(
        f"{model}:{version}: predicted { {n: c['bytes_total'] for n, c in by_node.items()} }, measured {measured},"
        f" worst error {worst:.4f}; central egress predicted {preview['totals']['central_egress_bytes']},"
        f" measured {egress}; peer errors and origin refusals {detours}"
    )
    if not any(detours.values()):
        for node in edges:
            cost = by_node.get(node, {"bytes_from_peers": 0, "bytes_from_central": 0})
            peers = after[node]["bytes_from_peers"] - before[node]["bytes_from_peers"]
            origin = after[node]["bytes_from_origin"] - before[node]["bytes_from_origin"]
            assert error(cost["bytes_from_peers"], peers) <= MAX_ERROR, (node, cost, peers)
            assert error(cost["bytes_from_central"], origin) <= MAX_ERROR, (node, cost, origin)
    return Comparison(preview, measured, worst)
