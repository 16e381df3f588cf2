"""Central assigns each node only what its own ONNX Runtime loads, end to end (central,
Mosquitto, a real edge that registers with its runtime capped at opset 18, as an operator
pinning an older format would): a version at opset 21 that ONNX's converter can bring down is
served there as an artifact central converted for it; one it cannot (an operator new after
opset 18) is never assigned to it and fails there with reason ``runtime`` (the rollout, the
nodes API and ``modelfleet nodes`` say so); an edge that says nothing of its runtime is taken
to run central's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from fleetwire.v1 import registry_pb2, registry_pb2_grpc
from modelfleet.cli.operator import _node_row
from modelfleet.cli.rollout import describe
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, push, wait_rollout
from support.onnx_versions import dense_model, gelu_model, save
from support.wait import wait_for

pytestmark = pytest.mark.fleet

#: The newest ai.onnx opset the test edge reports (the zoo's MLP is at opset 17).
EDGE_OPSET = 18


async def _old_edge(make_edge: EdgeFactory, central: CentralServer, mosquitto: MosquittoBroker) -> EdgeServer:
    return await make_edge(
        "edge-0",
        central,
        heartbeat={"enabled": True, "interval_s": 0.3},
        broker={"host": mosquitto.host, "port": mosquitto.port},
        inference={"runtime_max_opset": EDGE_OPSET},
    )


def _assigned(edge: EdgeServer, version: str) -> tuple[bool, bool] | None:
    """``(serve, stage)`` of ``tiny:version`` in the edge's desired state; None when absent."""
    state = edge.edge.follower.state
    found = next((v for v in state.versions if v.manifest.key == ("tiny", version)), None) if state else None
    return (found.serve, found.stage) if found is not None else None


async def test_a_version_the_node_runtime_cannot_load_is_not_assigned_and_fails_with_reason_runtime(
    fleet_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edge = await _old_edge(make_edge, fleet_central, mosquitto)
    await wait_for(edge.edge.follower.connected.is_set, 10, "the edge registered")
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30) as api:
        nodes = (await api.get("/api/v1/nodes")).json()
        runtime: dict[str, Any] = nodes[0]["runtime"]
        assert runtime["max_opsets"][""] == EDGE_OPSET and runtime["runtime"].endswith("(capped)")
        assert edge.edge.status()["runtime"] == runtime

        v1 = build_mlp(tmp_path / "v1.onnx", width=32, hidden_layers=1)  # opset 17: loads
        assert (await push(api, "tiny", v1, version="1")).status_code == 201
        await wait_for(lambda: len(fleet_central.central.liveness.ready_endpoints("tiny", "1")) == 1, 30, "v1 ready")

        # Gelu is new in opset 20: nothing converts this model to opset 18.
        v2 = save(gelu_model(21), tmp_path / "v2.onnx")
        response = await push(api, "tiny", v2, version="2", activate="false")
        assert response.status_code == 201, response.text
        formats = response.json()["manifest"]["quantization"]["formats"]
        assert formats["fp32"]["opsets"][""] == 21
        body = {"version": "2", "canary": 1.0, "failure_threshold": 1.0}
        assert (await api.post("/api/v1/models/tiny/rollouts", json=body)).status_code == 201
        rollout = await wait_rollout(api, "a failed node", lambda r: r["nodes"].get("edge-0") == "failed")
        failure = rollout["failures"]["edge-0"]
        assert failure["reason"] == "runtime", failure
        assert "opset 21 of ai.onnx is newer than opset 18" in failure["error"], failure
        assert "edge-0: failed (runtime: tiny:2" in describe(rollout).plain

        # Never assigned: held (a seed of the chunks it owns) but neither served nor staged.
        assert _assigned(edge, "2") == (False, False)
        assert all(m.version != "2" for m in edge.edge.repository.models())
        listed = (await api.get("/api/v1/nodes")).json()[0]
        assert [(r["version"], r["reason"]) for r in listed["refused"]] == [("2", "runtime")]
        assert "tiny:2 failed (runtime)" in _node_row(listed)[4]


async def test_a_version_the_converter_can_bring_down_is_served_as_an_artifact_converted_for_the_node(
    fleet_central: CentralServer, mosquitto: MosquittoBroker, make_edge: EdgeFactory, tmp_path: Path
) -> None:
    edge = await _old_edge(make_edge, fleet_central, mosquitto)
    await wait_for(edge.edge.follower.connected.is_set, 10, "the edge registered")
    runtime = edge.edge.runtime
    converted = f"fp32-ir{runtime.max_ir_version}-opset{EDGE_OPSET}-ml{runtime.max_opset('ai.onnx.ml')}"
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30) as api:
        assert (await push(api, "tiny", save(dense_model(21), tmp_path / "v1.onnx"), version="1")).status_code == 201
        await wait_for(lambda: len(fleet_central.central.liveness.ready_endpoints("tiny", "1")) == 1, 30, "v1 ready")
        version = (await api.get("/api/v1/models/tiny/versions/1")).json()
        formats = version["quantization"]["formats"]
        assert formats["fp32"]["opsets"][""] == 21 and formats[converted]["opsets"][""] == EDGE_OPSET
        assert (await api.get("/api/v1/nodes")).json()[0]["refused"] == []
    (served,) = [m for m in edge.edge.repository.models() if m.version == "1"]
    assert served.artifact == converted
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
    async with httpx.AsyncClient(base_url=edge.http_url, timeout=30) as client:
        response = await client.post("/v2/models/tiny/infer", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["outputs"][0]["data"]) == 4


async def test_an_edge_that_does_not_report_its_runtime_is_taken_to_run_centrals(
    fleet_central: CentralServer, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=fleet_central.http_url, timeout=30) as api:
        v1 = save(gelu_model(21), tmp_path / "v1.onnx")
        assert (await push(api, "tiny", v1, version="1")).status_code == 201
        async with grpc.aio.insecure_channel(fleet_central.grpc_address) as channel:
            stub = registry_pb2_grpc.RegistryStub(channel)
            node = registry_pb2.NodeInfo(node_id="old-edge", grpc_address="127.0.0.1:1", http_address="127.0.0.1:2")
            await stub.Register(registry_pb2.RegisterRequest(node=node))  # no runtime fields: an older edge
            stream = stub.WatchDesiredState(registry_pb2.WatchRequest(node_id="old-edge"))
            state = await stream.read()
            listed = {n["node_id"]: n for n in (await api.get("/api/v1/nodes")).json()}
            stream.cancel()  # the node leaves
    assert isinstance(state, registry_pb2.DesiredState)
    assert [(v.manifest.version, v.serve, v.force_artifact) for v in state.versions] == [("1", True, "")]
    assert listed["old-edge"]["runtime"] is None and listed["old-edge"]["refused"] == []


@pytest.mark.parametrize(
    ("ir", "opsets", "message"),
    [
        (4_000_000_000, {"": 18}, "max_ir_version 4000000000 is out of range"),
        (2, {"": 18}, "max_ir_version 2 is out of range"),
        (9, {"ai.onnx": 0}, "max_opsets['ai.onnx'] 0 is out of range"),
        (9, {"": 18, "ai.onnx.ml": 4_294_967_295}, "max_opsets['ai.onnx.ml'] 4294967295 is out of range"),
    ],
)
async def test_implausible_runtime_limits_are_refused_at_registration(
    fleet_central: CentralServer, ir: int, opsets: dict[str, int], message: str
) -> None:
    async with grpc.aio.insecure_channel(fleet_central.grpc_address) as channel:
        stub = registry_pb2_grpc.RegistryStub(channel)
        node = registry_pb2.NodeInfo(node_id="liar", grpc_address="127.0.0.1:1", http_address="127.0.0.1:2")
        request = registry_pb2.RegisterRequest(
            node=node, runtime="onnxruntime 9.9", max_ir_version=ir, max_opsets=opsets
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Register(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
