"""The rollout cost preview on a real fleet (central, Mosquitto, five edges in two sites,
site-aware placement): ``POST …/rollouts?dry_run=true`` says what each node will fetch, from
peers and from central; the rollout then runs and each edge's own fetch counters must agree
within 5 %. A first version is fetched whole by everyone; a delta version (a new head) rolled
out to one site costs its nodes only the new chunks, and the other site's owners seed them."""

from __future__ import annotations

from pathlib import Path

import httpx
from preview_harness import MAX_ERROR, preview_then_roll_out

from central.server import CentralServer
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, push
from support.wait import wait_for

#: Three nodes in east (each chunk has two owners there, so one node is no owner), two in west.
SITES = {"east-1": "east", "east-2": "east", "east-3": "east", "west-1": "west", "west-2": "west"}


async def test_preview_of_a_first_and_a_delta_version_matches_what_the_edges_fetch(
    fleet_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    heartbeat = {"enabled": True, "interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    edges = {
        n: await make_edge(n, fleet_central, heartbeat=heartbeat, broker=broker, site=s, labels={"zone": s})
        for n, s in SITES.items()
    }
    await wait_for(lambda: len(fleet_central.central.directory.nodes()) == len(SITES), what="registered edges")
    v1 = build_mlp(tmp_path / "v1.onnx", width=384, hidden_layers=4)
    v2 = build_mlp(tmp_path / "v2.onnx", width=384, hidden_layers=4, head_seed=1)  # a new head only
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30.0) as api:
        pushed = await push(api, "mlp", v1, version="1", activate="false")
        assert pushed.status_code == 201, pushed.text
        size_v1 = sum(c["size"] for c in pushed.json()["manifest"]["chunks"])

        everyone = sorted(SITES)
        run = await preview_then_roll_out(api, edges, "mlp", "1", everyone)
        first, measured, worst = run.preview, run.measured, run.worst
        assert first["previous_version"] is None
        assert all(n["bytes_reused"] == 0 and n["bytes_total"] == size_v1 for n in first["nodes"])
        assert first["totals"]["central_egress_bytes"] == size_v1  # each chunk leaves central once
        assert {s["site"]: s["bytes_in"] for s in first["sites"]} == {"east": size_v1, "west": size_v1}
        assert worst <= MAX_ERROR, (first["nodes"], measured)

        await wait_for(
            lambda: len(fleet_central.central.liveness.ready_endpoints("mlp", "1")) == len(SITES),
            30,
            "v1 ready in heartbeats",
        )
        pushed = await push(api, "mlp", v2, version="2", activate="false")
        assert pushed.status_code == 201, pushed.text
        east = sorted(n for n, s in SITES.items() if s == "east")
        run = await preview_then_roll_out(api, edges, "mlp", "2", east, selector={"zone": "east"})
        delta, measured, worst = run.preview, run.measured, run.worst
        assert delta["previous_version"] == "1"
        nodes = {n["node_id"]: n for n in delta["nodes"]}
        assert all(0 < n["bytes_total"] < size_v1 / 4 for n in nodes.values())  # only the new head's chunks
        assert all(n["targeted"] == (SITES[name] == "east") for name, n in nodes.items())
        assert all(nodes[n]["bytes_reused"] > 0 for n in delta["targets"])  # what v1 shares is not fetched again
        assert set(nodes) >= {"west-1", "west-2"}  # west owns every chunk twice: it seeds the new ones
        assert worst <= MAX_ERROR, (delta["nodes"], measured)


async def test_dry_run_errors_are_4xx_with_a_message(
    fleet_central: CentralServer, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    await make_edge("east-1", fleet_central, site="east")
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30.0) as api:
        assert (await push(api, "tiny", small_model_file, version="1", activate="false")).status_code == 201
        url = "/api/v1/models/{}/rollouts"
        cases = [
            ("tiny", {"version": "9"}, 404),
            ("nosuch", {"version": "1"}, 404),
            ("tiny", {"version": "1", "selector": "zone"}, 422),
            ("tiny", {"version": "1", "selector": {"zone": 3}}, 422),
            ("tiny", {"version": "1", "canary": 0}, 422),
            ("bad name!", {"version": "1"}, 422),
        ]
        for model, body, status in cases:
            response = await api.post(url.format(model), params={"dry_run": "true"}, json=body)
            assert response.status_code == status, (model, body, response.text)
            assert response.json()["error"], response.text
        response = await api.post(
            url.format("tiny"), params={"dry_run": "true"}, json={"version": "1", "selector": {"zone": "x"}}
        )
        assert response.status_code == 200, response.text
        nobody = response.json()
        assert nobody["targets"] == [] and not any(n["targeted"] for n in nobody["nodes"])  # owners still seed
        assert (await api.get("/api/v1/rollouts")).json() == []
