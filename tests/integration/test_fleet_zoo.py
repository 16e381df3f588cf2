"""Every trained zoo model through a whole fleet: pushed with its calibration and eval data,
quantized and guarded at central, distributed to two edges, and served through an edge and
through central's gateway, the answers checked against FP32 ONNX Runtime on the original
model. One fleet (a private Mosquitto, central with quantization on, two edges) serves the
whole module.

Edge ``edge-0`` serves central's default artifact (the INT8 path under test), ``edge-1``
times the candidates and serves the fastest on this CPU, as a real node does; the answers of
both must agree with FP32. Bad requests to the transformer (an id past its vocabulary, a mask
of another length) are a 400 on the edge and through the gateway, and a burst of them takes
no model down: every model is still served through the gateway right after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import pytest_asyncio

from central.server import CentralServer
from edge_node.server import EdgeServer
from modelfleet.zoo import ZooModel
from modelfleet.zoo.artifact import LABEL_KEY
from modelfleet.zoo.catalog import zoo_entry
from modelfleet.zoo.digits_data import VOCAB
from support.brokers import MosquittoBroker
from support.fleet import central_settings, edge_settings
from support.wait import wait_for

ZOO = ("mlp-digits", "resnet-digits", "transformer-digits", "transformer-digits-external")
#: Eval samples sent for inference, in batches of ``BATCH``.
SAMPLES = 96
BATCH = 32
#: Quick timing on edge-1: four versions, a couple of seconds each at most.
QUICK_CHOICE = {"budget_s": 1.0, "min_rounds": 2, "max_rounds": 4}
HEARTBEAT = {"enabled": True, "interval_s": 0.3}

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]


@dataclass
class ZooFleet:
    """The module's fleet and what each push answered."""

    central: CentralServer
    edges: list[EdgeServer]
    models: dict[str, ZooModel]
    pushed: dict[str, httpx.Response] = field(default_factory=dict)

    @property
    def gateway_url(self) -> str:
        return self.central.http_url

    def edge_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.edges[index].http_port}"


def _push_files(model: ZooModel) -> list[tuple[str, tuple[str, bytes]]]:
    """The multipart parts ``modelfleet push`` sends: the graph, its data files, calibration, eval."""
    assert model.calibration_path is not None and model.eval_path is not None
    parts = [("file", (model.onnx_path.name, model.onnx_path.read_bytes()))]
    parts += [("data", (p.name, p.read_bytes())) for p in model.data_files]
    parts.append(("calibration", ("calibration.npz", model.calibration_path.read_bytes())))
    parts.append(("eval", ("eval.npz", model.eval_path.read_bytes())))
    return parts


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ZooFleet]:
    cache = tmp_path_factory.getbasetemp() / "zoo-cache"  # shared with the zoo's own tests
    models = {name: zoo_entry(name).build(cache) for name in ZOO}
    root = tmp_path_factory.mktemp("zoo-fleet")
    with MosquittoBroker() as broker:
        where = {"host": broker.host, "port": broker.port}
        mqtt = {"enabled": True, "default_interval_s": 0.3}
        central = CentralServer(central_settings(root / "central", quantize={"enabled": True}, mqtt=mqtt, broker=where))
        await central.start()
        edges: list[EdgeServer] = []
        try:
            choices = [{"enabled": False}, QUICK_CHOICE]
            for i, choice in enumerate(choices):
                settings = edge_settings(
                    f"edge-{i}",
                    central.grpc_address,
                    root / f"edge-{i}",
                    heartbeat=HEARTBEAT,
                    broker=where,
                    inference={"choice": choice},
                )
                edges.append(EdgeServer(settings))
                await edges[-1].start()
            zoo = ZooFleet(central, edges, models)
            async with httpx.AsyncClient(base_url=central.http_url, timeout=300) as api:
                for name, model in models.items():
                    zoo.pushed[name] = await api.post(f"/api/v1/models/{name}/versions", files=_push_files(model))
            yield zoo
        finally:
            for edge in edges:
                await edge.stop()
            await central.stop()


async def _served_everywhere(fleet: ZooFleet, name: str) -> None:
    """Wait until ``name`` runs on both edges and the gateway knows both serve it."""

    def served(edge: EdgeServer) -> bool:
        try:
            return edge.edge.repository.get(name) is not None
        except Exception:
            return False

    tracker = fleet.central.central.liveness
    await wait_for(
        lambda: all(served(e) for e in fleet.edges) and len(tracker.ready_endpoints(name)) == len(fleet.edges),
        120,
        f"{name} served on every edge and known to the gateway",
    )


def _eval_slice(model: ZooModel) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The first ``SAMPLES`` eval inputs (by input name) and their labels."""
    assert model.eval_path is not None
    with np.load(model.eval_path) as data:
        inputs = {n: data[n][:SAMPLES] for n in model.input_names}
        return inputs, data[LABEL_KEY][:SAMPLES]


def _scores_output(session: ort.InferenceSession) -> str:
    names = [o.name for o in session.get_outputs()]
    return next(n for n in ("logits", "probabilities") if n in names)


def _fp32_scores(model: ZooModel, inputs: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    name = _scores_output(session)
    return name, np.asarray(session.run([name], inputs)[0])


_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def _body(inputs: dict[str, np.ndarray], output: str) -> dict[str, Any]:
    tensors = [
        {"name": n, "datatype": _DATATYPES[a.dtype], "shape": list(a.shape), "data": a.ravel().tolist()}
        for n, a in inputs.items()
    ]
    return {"inputs": tensors, "outputs": [{"name": output}]}


async def _scores(url: str, name: str, inputs: dict[str, np.ndarray], output: str) -> tuple[np.ndarray, set[str]]:
    """The scores ``url`` answers for ``inputs``, sent in batches of ``BATCH``, and the nodes
    that answered (the gateway names them)."""
    rows = len(next(iter(inputs.values())))
    answers: list[np.ndarray] = []
    nodes: set[str] = set()
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for start in range(0, rows, BATCH):
            batch = {n: a[start : start + BATCH] for n, a in inputs.items()}
            response = await client.post(f"/v2/models/{name}/infer", json=_body(batch, output))
            assert response.status_code == 200, f"{url}: {response.text}"
            if "x-modelfleet-node" in response.headers:
                nodes.add(response.headers["x-modelfleet-node"])
            (tensor,) = response.json()["outputs"]
            answers.append(np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"]))
    return np.concatenate(answers), nodes


@pytest.mark.parametrize("name", ZOO)
async def test_each_zoo_model_is_guarded_distributed_and_served_like_fp32(fleet: ZooFleet, name: str) -> None:
    model = fleet.models[name]
    pushed = fleet.pushed[name]
    assert pushed.status_code == 201, pushed.text
    manifest, report = pushed.json()["manifest"], pushed.json()["report"]["quantization"]
    assert report["samples_source"] == "eval" and report["family"] == model.family
    assert report["fp32_accuracy"] == pytest.approx(model.fp32_accuracy)
    assert abs(report["accuracy_delta_pp"]) <= 1.0, report
    assert report["candidates"][report["served"]]["guard"]["passed"] is True
    assert manifest["artifact"] == report["served"] and manifest["artifact"].startswith("int8-")
    async with httpx.AsyncClient(base_url=fleet.central.http_url, timeout=30) as api:
        fp32 = (await api.get(f"/api/v1/models/{name}/versions/1", params={"artifact": "fp32"})).json()
    # The FP32 artifact is the upload, every file of it (the INT8 ones are small enough for one file).
    assert [f["path"] for f in fp32.get("files", [])] == [p.name for p in model.data_files]

    await _served_everywhere(fleet, name)
    served = [edge.edge.repository.get(name).manifest.artifact for edge in fleet.edges]
    assert served[0] == manifest["artifact"]  # edge-0 serves central's INT8 default
    choice = fleet.edges[1].edge.status()["artifacts"][f"{name}:1"]  # what /api/v1/status reports
    assert (choice["artifact"], choice["source"]) == (served[1], "measured")  # edge-1 timed the candidates
    for edge, artifact in zip(fleet.edges, served, strict=True):
        assembled = edge.edge.files.model_path(name, "1", artifact).parent
        if artifact == "fp32":  # every file of the upload, assembled next to each other
            for original in model.files:
                assert (assembled / original.name).read_bytes() == original.read_bytes()

    inputs, labels = _eval_slice(model)
    output, fp32 = _fp32_scores(model, inputs)
    fp32_accuracy = float((fp32.argmax(1) == labels).mean())
    urls = [fleet.edge_url(0), fleet.edge_url(1), fleet.gateway_url]
    for url in urls:
        scores, nodes = await _scores(url, name, inputs, output)
        # The gateway's batches go to either edge (in turn while both are healthy; a late
        # heartbeat on a loaded machine may leave one): each answer is checked all the same.
        assert nodes <= {"edge-0", "edge-1"} and (url == fleet.gateway_url) == bool(nodes), (url, nodes)
        assert scores.shape == fp32.shape
        agreement = float((scores.argmax(1) == fp32.argmax(1)).mean())
        accuracy = float((scores.argmax(1) == labels).mean())
        assert agreement >= 0.98, f"{name} via {url}: top-1 agreement with FP32 {agreement:.1%}"
        assert fp32_accuracy - accuracy <= 0.01, f"{name} via {url}: {accuracy:.1%} vs FP32 {fp32_accuracy:.1%}"


def _bad_requests() -> dict[str, dict[str, Any]]:
    """Requests the transformer must refuse: an id past its vocabulary, a mask of another
    length, a fractional id."""
    ids = np.array([[3, 5, 9, 1], [2, 2, 7, 4]], dtype=np.int64)
    mask = np.ones_like(ids)
    past_vocab = ids.copy()
    past_vocab[1, 2] = VOCAB + 7
    fractional = _body({"input_ids": ids, "attention_mask": mask}, "logits")
    fractional["inputs"][0]["data"][1] = 5.5
    return {
        "id past the vocabulary": _body({"input_ids": past_vocab, "attention_mask": mask}, "logits"),
        "mask of another length": _body({"input_ids": ids, "attention_mask": mask[:, :3]}, "logits"),
        "fractional id": fractional,
    }


#: Words each refusal must hold: the input it blames (and the bad value where there is one).
BAD_WORDS = {
    "id past the vocabulary": ("input_ids", str(VOCAB + 7)),
    "mask of another length": ("attention_mask",),
    "fractional id": ("input_ids", "5.5"),
}


async def test_bad_requests_are_400_and_a_burst_of_them_takes_no_model_down(fleet: ZooFleet) -> None:
    for name in ZOO:
        await _served_everywhere(fleet, name)
    stats = fleet.central.central.gateway.stats
    failures_before, unavailable_before = stats.node_failures, stats.unavailable
    bad = _bad_requests()
    async with httpx.AsyncClient(timeout=60) as client:
        for url in (fleet.edge_url(0), fleet.edge_url(1), fleet.gateway_url):
            for what, body in bad.items():
                answer = await client.post(f"{url}/v2/models/transformer-digits/infer", json=body)
                assert answer.status_code == 400, f"{what} via {url}: {answer.status_code} {answer.text}"
                assert all(word in answer.json()["error"] for word in BAD_WORDS[what]), answer.text

        burst = [
            client.post(f"{fleet.gateway_url}/v2/models/{name}/infer", json=body)
            for name in ("transformer-digits", "transformer-digits-external")
            for body in bad.values()
            for _ in range(6)
        ]
        assert {r.status_code for r in await asyncio.gather(*burst)} == {400}

        # Right after the burst every model still answers through the gateway.
        for name in ZOO:
            inputs, _ = _eval_slice(fleet.models[name])
            one = {n: a[:2] for n, a in inputs.items()}
            output = "probabilities" if name == "mlp-digits" else "logits"
            answer = await client.post(f"{fleet.gateway_url}/v2/models/{name}/infer", json=_body(one, output))
            assert answer.status_code == 200, f"{name} after the burst: {answer.status_code} {answer.text}"
    # The refusals were the requests' fault: no node failed, no breaker opened, no 503.
    assert (stats.node_failures, stats.unavailable) == (failures_before, unavailable_before)
