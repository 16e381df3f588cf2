"""The gateway's KServe v2 / Triton health and metadata: its own liveness, readiness and
server metadata; a model's readiness from the nodes that serve it; a model's metadata and
Triton configuration as a node that serves it answers them, even when another is gone."""

from __future__ import annotations

from pathlib import Path

import httpx

from central.gateway import Candidate, StaticNodeSource, create_gateway
from central.server import CentralServer
from central.settings import GatewaySettings
from modelfleet.up.ports import free_port
from support.fleet import EdgeFactory, push
from support.gateway_harness import candidate, serve_gateway
from support.wait import wait_for


async def test_health_server_metadata_and_models_through_the_gateway(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    edge = await make_edge("edge-0", central)
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny ready")
    gone = Candidate("edge-gone", f"127.0.0.1:{free_port()}")
    source = StaticNodeSource([gone, candidate(edge)])
    proxy = create_gateway(source, GatewaySettings())
    async with serve_gateway(proxy) as gw, httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}") as direct:
        assert (await gw.get("/v2/health/live")).json() == {"live": True}
        assert (await gw.get("/v2/health/ready")).json() == {"ready": True}
        server = (await gw.get("/v2")).json()
        assert server["name"] == "modelfleet-gateway" and "binary_tensor_data" in server["extensions"]

        for path in ("/v2/models/tiny", "/v2/models/tiny/versions/1", "/v2/models/tiny/config"):
            for _ in range(3):  # whichever node comes first, the one that is gone is skipped
                r = await gw.get(path)
                assert r.status_code == 200, (path, r.text)
                assert r.json() == (await direct.get(path)).json() and r.headers["X-Modelfleet-Node"] == "edge-0"
        config = (await gw.get("/v2/models/tiny/versions/1/config")).json()
        assert config["platform"] == "onnxruntime_onnx" and config["input"][0]["data_type"] == "TYPE_FP32"

        assert (await gw.get("/v2/models/tiny/ready")).json() == {"name": "tiny", "ready": True}
        assert (await gw.get("/v2/models/tiny/versions/1/ready")).status_code == 200
        assert proxy.stats.attempts == 0  # none of this ran a model

        r = await gw.get("/v2/models/tiny/versions/9")
        assert r.status_code == 404 and "version '9'" in r.json()["error"]  # the node's own 404
        source.set_model("ghost", [])
        r = await gw.get("/v2/models/ghost")
        assert r.status_code == 404 and r.json()["error"] == "model 'ghost' is not served by any alive node"
        r = await gw.get("/v2/models/ghost/ready")
        assert r.status_code == 400 and r.json() == {"name": "ghost", "ready": False}
        assert (await gw.get("/v2/models/bad%0A/ready")).status_code == 422

        source.set([gone])
        r = await gw.get("/v2/models/tiny/config")
        assert r.status_code == 503 and "cannot connect" in r.json()["error"]


async def test_before_any_node_serves_a_model_its_metadata_comes_from_the_registry(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    stored = {}
    for path in ("/v2/models/tiny", "/v2/models/tiny/versions/1"):
        r = await api.get(path)  # central's gateway, no edge anywhere
        assert r.status_code == 200, (path, r.text)
        assert "X-Modelfleet-Node" not in r.headers
        stored[path] = r.json()
    assert stored["/v2/models/tiny"]["versions"] == ["1"]
    assert stored["/v2/models/tiny"]["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 32]}]
    for path, status in (
        ("/v2/models/tiny/versions/9", 404),
        ("/v2/models/ghost", 404),
        ("/v2/models/tiny/config", 404),
    ):
        r = await api.get(path)
        assert r.status_code == status and "is not served by any alive node" in r.json()["error"], (path, r.text)

    # The same document an edge answers once it serves the model.
    edge = await make_edge("edge-0", central)
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny served")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}") as direct:
        for path, document in stored.items():
            assert (await direct.get(path)).json() == document
