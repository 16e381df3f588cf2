"""A stolen edge steering the fleet (issue 24, holes 1, 4, 5 and 7): a real central, a real Mosquitto
and real edges; the test acts as the stolen edge-1 with edge-1's own credentials — it publishes
MQTT messages on edge-1's topics (all edge-1's login may publish under the shipped ACL) and calls
central's gRPC Registry as edge-1. What central believes of those messages must stay about
edge-1: never another node, never the fleet."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from typer.testing import CliRunner

from central.auth import Role
from central.server import CentralServer
from central.storage.files.tokens import TokenStore
from edge_node.server import EdgeServer
from fleetwire.credentials import bearer_metadata
from fleetwire.mqtt.payloads import ArtifactChoiceInfo, Heartbeat, ModelInfo, NodeStatus, ShadowInfo
from fleetwire.mqtt.topics import Topics
from fleetwire.v1 import registry_pb2, registry_pb2_grpc
from modelfleet.cli import app
from modelfleet.zoo import build_drift_classifier, drift_samples
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, events_of, push
from support.wait import wait_for


class StolenLogin:
    """The MQTT side of a stolen edge: publishes heartbeats on its node's own topic."""

    def __init__(self, broker: MosquittoBroker, node_id: str, bdseq: int = 7) -> None:
        self.node_id = node_id
        self.bdseq = bdseq
        self.seq = 0
        self.topics = Topics()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"stolen-{uuid.uuid4().hex[:8]}")
        self.client.connect(broker.host, broker.port, keepalive=10)
        self.client.loop_start()

    def beat(self, **fields: Any) -> None:
        """One heartbeat of ``node_id`` with ``fields`` (models, addresses, ...)."""
        self.seq += 1
        hb = Heartbeat(
            node_id=self.node_id, bdseq=self.bdseq, seq=self.seq, ts=int(time.time() * 1000), interval_s=0.3,
            **fields,
        )  # fmt: skip
        self.publish_heartbeat(hb.model_dump_json())

    def publish_heartbeat(self, payload: str) -> None:
        """Any payload on the node's heartbeat topic (the contract's models refuse to build some)."""
        self.client.publish(self.topics.node_heartbeat(self.node_id), payload, qos=1).wait_for_publish(5)

    def die(self) -> None:
        """The node's death, with the session's own ``bdseq`` (as its Last Will would say)."""
        status = NodeStatus(state="offline", bdseq=self.bdseq, ts=int(time.time() * 1000))
        topic = self.topics.node_status(self.node_id)
        self.client.publish(topic, status.model_dump_json(), qos=1).wait_for_publish(5)

    async def beat_for(self, seconds: float, **fields: Any) -> None:
        """Heartbeats every 0.3 s for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.beat(**fields)
            await asyncio.sleep(0.3)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
async def quantizing_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    mqtt_settings = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    server = CentralServer(
        central_settings(tmp_path / "central", mqtt=mqtt_settings, broker=broker, quantize={"enabled": True})
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def stolen(mosquitto: MosquittoBroker) -> AsyncIterator[StolenLogin]:
    login = StolenLogin(mosquitto, "edge-1")
    yield login
    login.close()


def _served(edge: EdgeServer, model: str) -> str:
    return edge.edge.repository.get(model).artifact


async def test_forged_live_disagreement_from_one_edge_falls_back_only_that_edge(
    quantizing_central: CentralServer,
    mosquitto: MosquittoBroker,
    make_edge: EdgeFactory,
    stolen: StolenLogin,
    tmp_path: Path,
) -> None:
    """Hole 1: edge-1's login reports invented shadow counts (2,000 samples, none agreeing) for
    the INT8 artifact; edge-2 has 24/24 real agreement. Only edge-1 may be flagged and fall back;
    edge-2 keeps INT8 and the pooled verdict is not a fleet flag."""
    central = quantizing_central
    model = build_drift_classifier(tmp_path / "drift")
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    # The real edge-1 runs without heartbeats of its own: its MQTT login is the attacker's.
    await make_edge("edge-1", central, heartbeat={"enabled": False}, inference={"choice": {"enabled": False}})
    edge2 = await make_edge(
        "edge-2", central, heartbeat={"enabled": True, "interval_s": 0.3}, broker=broker,
        inference={"choice": {"enabled": False}, "shadow_sample": 1.0},
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=central.http_url, timeout=120) as api:
        files = {"file": model.onnx_path.read_bytes(), "calibration": model.calibration_path.read_bytes()}
        response = await api.post("/api/v1/models/drift/versions", files=files)
        assert response.status_code == 201, response.text
        int8 = response.json()["manifest"]["artifact"]
        assert int8.startswith("int8-")
        await wait_for(lambda: edge2.edge.repository.ready(), 60, "drift served on edge-2")
        assert _served(edge2, "drift") == int8

        x, _ = drift_samples(model.prototypes, 24, shift=1.0, seed=3)  # calibration-like: INT8 agrees
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge2.http_port}", timeout=30) as client:
            for row in x:
                body = {"inputs": [{"name": model.input_name, "datatype": "FP32", "shape": [1, row.size],
                                    "data": row.tolist()}]}  # fmt: skip
                assert (await client.post("/v2/models/drift/infer", json=body)).status_code == 200

        lie = ModelInfo(
            name="drift", version="1", state="ready",
            choice=ArtifactChoiceInfo(artifact=int8, source="pinned"),
            shadow=ShadowInfo(samples=2000, top1_agree=0, top1_samples=2000),
        )  # fmt: skip
        await stolen.beat_for(2.0, models=[lie])
        deadline = time.monotonic() + 10
        while not await events_of(api, "int8_drift"):
            assert time.monotonic() < deadline, "edge-1's own counts were not even judged"
            await stolen.beat_for(0.6, models=[lie])
        await stolen.beat_for(2.0, models=[lie])  # time for a wrong fleet-wide fallback to land

        assert _served(edge2, "drift") == int8, "edge-2 was moved off INT8 by edge-1's counts"
        report = (await api.get("/api/v1/models/drift/versions/1/agreement")).json()
        assert report["fallback_nodes"] == ["edge-1"]
        assert report["fleet"][int8]["flagged"] is False
        assert report["nodes"]["edge-2"]["verdict"]["flagged"] is False
        drifts = await events_of(api, "int8_drift")
        assert [d["detail"]["nodes"] for d in drifts] == [["edge-1"]] and not drifts[0]["detail"]["fleet"]


@pytest.fixture
async def mqtt_central(tmp_path: Path, mosquitto: MosquittoBroker) -> AsyncIterator[CentralServer]:
    """Central hearing Mosquitto, node tokens required on its gRPC Registry."""
    mqtt_settings = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    settings = central_settings(tmp_path / "central", mqtt=mqtt_settings, broker=broker, auth={"nodes_required": True})
    server = CentralServer(settings)
    await server.start()
    yield server
    await server.stop()


def _token(tmp_path: Path, node_id: str, name: str | None = None) -> str:
    store = TokenStore(tmp_path / "central" / "node_tokens.json")
    return store.create(name or node_id, Role.NODE, node_id=node_id)


async def _node(api: httpx.AsyncClient, node_id: str) -> dict[str, Any] | None:
    response = await api.get("/api/v1/nodes")
    assert response.status_code == 200
    body = response.json()
    nodes = body["nodes"] if isinstance(body, dict) else body
    return next((n for n in nodes if n["node_id"] == node_id), None)


async def _edge(make_edge: EdgeFactory, central: CentralServer, tmp_path: Path, node_id: str, **kw: Any) -> EdgeServer:
    """A real edge with its own node token and no heartbeats of its own (its MQTT login is the
    attacker's in these tests)."""
    return await make_edge(node_id, central, node_token=_token(tmp_path, node_id), heartbeat={"enabled": False}, **kw)


class _Sink:
    """A TCP listener that counts the connections made to it (where a forged address points)."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])


async def test_a_heartbeat_address_carrying_a_path_is_refused_and_never_fetched(
    mqtt_central: CentralServer, make_edge: EdgeFactory, stolen: StolenLogin, tmp_path: Path, small_model_file: Path
) -> None:
    """Hole 5: edge-1's login announces ``http_address`` ``127.0.0.1:<edge-2>/api/v1/status?``;
    central's gateway used to fetch edge-2's status (with its own fleet credentials) and hand it
    to an anonymous metadata request. Such a heartbeat is malformed now: dropped and counted."""
    central = mqtt_central
    edge1 = await _edge(make_edge, central, tmp_path, "edge-1")
    edge2 = await _edge(make_edge, central, tmp_path, "edge-2")
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        assert (await push(api, "m", small_model_file)).status_code == 201
        await wait_for(lambda: edge1.edge.repository.ready() and edge2.edge.repository.ready(), 60, "m served")
        ready = [ModelInfo(name="m", version="1", state="ready")]
        before = (await api.get("/api/v1/membership")).json()["counters"]

        injected = f"127.0.0.1:{edge2.http_port}/api/v1/status?"
        forged = Heartbeat(node_id="edge-1", bdseq=stolen.bdseq, seq=1, ts=int(time.time() * 1000), interval_s=0.3)
        doc = {**forged.model_dump(mode="json"), "models": [m.model_dump(mode="json") for m in ready]}
        for seq in range(1, 8):
            stolen.publish_heartbeat(_json({**doc, "seq": seq, "http_address": injected}))
            await asyncio.sleep(0.1)
        answer = await api.get("/v2/models/m")
        assert "edge-2" not in answer.text and "node_id" not in answer.json(), "edge-2's status came back"
        counters = (await api.get("/api/v1/membership")).json()["counters"]
        assert _dropped(counters) > _dropped(before), "the forged address was not refused as malformed"


async def test_the_gateway_uses_the_address_a_node_registered_not_its_heartbeats(
    mqtt_central: CentralServer, make_edge: EdgeFactory, stolen: StolenLogin, tmp_path: Path, small_model_file: Path
) -> None:
    """Hole 5, the well-formed case: edge-1's login announces another ``host:port``; the gateway
    keeps sending edge-1's requests to the address edge-1 registered over its token-checked gRPC
    ``Register``, and nothing reaches the announced one."""
    central = mqtt_central
    edge1 = await _edge(make_edge, central, tmp_path, "edge-1")
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        assert (await push(api, "m", small_model_file)).status_code == 201
        await wait_for(lambda: edge1.edge.repository.ready(), 60, "m served")
        ready = [ModelInfo(name="m", version="1", state="ready")]
        sink = _Sink()
        elsewhere = f"127.0.0.1:{await sink.start()}"
        # The forged beats go on while the gateway is asked: they are what keeps edge-1 live here
        # (the real edge-1 beats nothing), and a loaded machine can take longer than a suspect
        # timeout over the five requests.
        beating = asyncio.create_task(stolen.beat_for(60, models=ready, http_address=elsewhere))
        try:
            await asyncio.sleep(1.5)
            for _ in range(5):
                answer = await api.get("/v2/models/m")
                assert answer.status_code == 200, answer.text
                assert answer.headers.get("x-modelfleet-node") == "edge-1"
        finally:
            beating.cancel()
            await asyncio.gather(beating, return_exceptions=True)
        assert sink.connections == 0, "the gateway went to the heartbeat's address, not the registered one"
        assert sink.server is not None
        sink.server.close()


def _json(doc: dict[str, Any]) -> str:
    return json.dumps(doc)


def _dropped(counters: dict[str, Any]) -> int:
    return sum(int(v) for k, v in counters.items() if "malformed" in k)


async def test_a_verdict_is_attributed_to_the_node_that_reported_it(
    mqtt_central: CentralServer,
    make_edge: EdgeFactory,
    stolen: StolenLogin,
    tmp_path: Path,
    small_model_file: Path,
) -> None:
    """Hole 7: edge-1's token re-registers it with edge-2's hardware class, and its login reports
    a timed choice ``from_node: edge-2``: the verdict is edge-1's, never edge-2's."""
    central = mqtt_central
    edge1 = await _edge(make_edge, central, tmp_path, "edge-1")
    await _edge(make_edge, central, tmp_path, "edge-2")
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        assert (await push(api, "m", small_model_file)).status_code == 201
        await wait_for(lambda: edge1.edge.repository.ready(), 60, "m served")
        registered = await _node(api, "edge-1")
        edge2 = await _node(api, "edge-2")
        assert registered is not None and edge2 is not None and edge2["hardware_class"]
        hw = edge2["hardware_class"]

        # The stolen token re-registers edge-1 (its own id: allowed) as edge-2's class.
        async with grpc.aio.insecure_channel(central.grpc_address) as channel:
            stub = registry_pb2_grpc.RegistryStub(channel)
            node = registry_pb2.NodeInfo(
                node_id="edge-1", grpc_address=registered["grpc_address"], http_address=registered["http_address"],
                capacity=1, hardware_class=hw,
            )  # fmt: skip
            md = bearer_metadata(_token(tmp_path, "edge-1", "edge-1-copy"))  # as good as edge-1's own
            assert (await stub.Register(registry_pb2.RegisterRequest(node=node), metadata=md)).accepted
        choice = ArtifactChoiceInfo(artifact="fp32", hardware_class=hw, source="measured", from_node="edge-2")
        claim = [ModelInfo(name="m", version="1", state="ready", choice=choice)]
        verdicts: list[dict[str, Any]] = []
        deadline = time.monotonic() + 10
        while not verdicts:
            assert time.monotonic() < deadline, "no verdict recorded"
            await stolen.beat_for(0.6, models=claim, hardware_class=hw)
            verdicts = (await api.get("/api/v1/verdicts")).json()
        assert [(v["hardware_class"], v["node_id"]) for v in verdicts] == [(hw, "edge-1")], verdicts


async def test_a_node_that_dies_and_rejoins_on_mqtt_is_what_it_registered(
    mqtt_central: CentralServer, make_edge: EdgeFactory, stolen: StolenLogin, tmp_path: Path
) -> None:
    """Hole 7, the rejoin: edge-1's login publishes edge-1's death, then heartbeats of a new
    session with other addresses and no hardware class. Central used to re-register edge-1 from
    that heartbeat (hardware class "", the heartbeat's addresses) without any token-checked call;
    the rejoined edge-1 is now exactly what it registered over gRPC."""
    central = mqtt_central
    await _edge(make_edge, central, tmp_path, "edge-1")
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        registered = await _node(api, "edge-1")
        for _ in range(100):
            if registered is not None:
                break
            await asyncio.sleep(0.1)
            registered = await _node(api, "edge-1")
        assert registered is not None and registered["hardware_class"]
        await stolen.beat_for(0.9)  # alive on MQTT
        stolen.die()
        deadline = time.monotonic() + 10
        while await _node(api, "edge-1") is not None:
            assert time.monotonic() < deadline, "edge-1 was not evicted by its death"
            await asyncio.sleep(0.1)
        stolen.bdseq += 1
        await stolen.beat_for(1.5, http_address="127.0.0.1:9", grpc_address="127.0.0.1:9")
        rejoined = await _node(api, "edge-1")
        assert rejoined is not None, "edge-1 did not rejoin"
        assert (
            rejoined["hardware_class"] == registered["hardware_class"]
            and rejoined["http_address"] == registered["http_address"]
        )
        assert rejoined["grpc_address"] == registered["grpc_address"]


async def test_a_retained_status_with_a_huge_bdseq_is_dropped_and_the_api_keeps_answering(
    quantizing_central: CentralServer, stolen: StolenLogin
) -> None:
    """Hole 4: edge-1's login leaves a retained birth with ``bdseq`` 2^64 on its own status topic.
    Central drops it as a contract breach: the membership API and ``modelfleet nodes`` keep
    answering (they answered 500, orjson refusing the integer), and no event keeps the number."""
    topic = stolen.topics.node_status("edge-1")
    forged = json.dumps({"state": "online", "bdseq": 2**64, "ts": int(time.time() * 1000)})
    stolen.client.publish(topic, forged, qos=1, retain=True).wait_for_publish(5)
    stolen.bdseq = 3
    await stolen.beat_for(1.0)  # a real session of the node beside the forgery
    async with httpx.AsyncClient(base_url=quantizing_central.http_url, timeout=30) as api:
        response = await api.get("/api/v1/membership")
        assert response.status_code == 200, response.text
        nodes = {n["node_id"]: n for n in response.json()["nodes"]}
        assert nodes["edge-1"]["bdseq"] == 3
        events = (await api.get("/api/v1/events")).json()
        assert str(2**64) not in json.dumps(events)
    result = await asyncio.to_thread(CliRunner().invoke, app, ["nodes", "--central", quantizing_central.http_url])
    assert result.exit_code == 0, result.output
    stolen.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)  # leave the broker clean
