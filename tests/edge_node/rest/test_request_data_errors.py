"""Requests whose data the model refuses, on a real edge: a token id past the embedding's
vocabulary, a mask whose shape disagrees with the ids, a wrong rank, a fraction or an
out-of-range value for an INT64 input. Each is a 400 naming the input, in the OIP error
shape; the model keeps serving, and a bad request batched with good ones fails alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.fleet import EdgeFactory, push
from support.metrics import metric_samples, sample
from support.request_models import BAD_TOKEN_REQUESTS, VOCAB, build_token_model, token_request
from support.wait import wait_for

MODEL = "tokens"


@pytest.fixture
async def token_edge(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, tmp_path: Path
) -> EdgeServer:
    """An edge serving the token model; batches wait up to 200 ms for company."""
    edge = await make_edge("edge-0", central, inference={"batching": {"max_queue_delay_ms": 200}})
    assert (await push(api, MODEL, build_token_model(tmp_path / "tokens.onnx"))).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="the token model ready")
    return edge


def _reference(edge: EdgeServer, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    path = edge.edge.files.model_path(MODEL, "1")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0]


async def test_every_bad_request_is_a_400_naming_the_input_and_the_model_keeps_serving(
    token_edge: EdgeServer,
) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{token_edge.http_port}", timeout=30) as oip:
        for case, (body, words) in BAD_TOKEN_REQUESTS.items():
            response = await oip.post(f"/v2/models/{MODEL}/infer", json=body)
            assert response.status_code == 400, (case, response.status_code, response.text)
            error = response.json()["error"]
            assert all(w in error for w in words), (case, error)
        good = await oip.post(f"/v2/models/{MODEL}/infer", json=token_request([[1, 2, VOCAB - 1]], [[1, 1, 0]]))
        assert good.status_code == 200, good.text
        metrics = metric_samples((await oip.get("/metrics")).text)
    model = token_edge.edge.repository.get(MODEL)
    assert model.errors == 0  # a client's mistake is not the model failing (rollouts judge by this)
    labels = {"model": MODEL, "version": "1"}
    # the three that ONNX Runtime refused (the others never reach the model: the OIP layer refuses them)
    assert sample(metrics, "modelfleet_inference_requests_total", outcome="invalid", **labels) == 3
    assert sample(metrics, "modelfleet_inference_requests_total", outcome="error", **labels) == 0


async def test_a_bad_request_batched_with_good_ones_fails_alone(token_edge: EdgeServer) -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(6, 5), dtype=np.int64)
    mask = rng.integers(0, 2, size=(6, 5), dtype=np.int64)
    bad_ids = ids[2:3].copy()
    bad_ids[0, 4] = VOCAB + 50
    bodies = [token_request(ids[i : i + 1].tolist(), mask[i : i + 1].tolist()) for i in range(6)]
    bodies[2] = token_request(bad_ids.tolist(), mask[2:3].tolist())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{token_edge.http_port}", timeout=30) as oip:
        responses = await asyncio.gather(*(oip.post(f"/v2/models/{MODEL}/infer", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200, 200, 400, 200, 200, 200], [r.text for r in responses]
    assert "input_ids" in responses[2].json()["error"] and str(VOCAB + 50) in responses[2].json()["error"]
    want = _reference(token_edge, ids, mask)
    for i in (0, 1, 3, 4, 5):
        got = np.asarray(responses[i].json()["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(got, want[i], rtol=1e-5, atol=1e-5)
