"""Open Inference Protocol v2 on a real edge: every endpoint, the error shape, the
binary tensor extension, and input checks that answer 400 with the reason."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import orjson
import pytest

from central.server import CentralServer
from edge_node.server import EdgeServer
from support.fleet import EdgeFactory, push
from support.wait import wait_for


@pytest.fixture
async def serving_edge(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path
) -> EdgeServer:
    """An edge with model "tiny" version 1 ready."""
    edge = await make_edge("edge-0", central)
    assert (await push(api, "tiny", small_model_file)).status_code == 201
    await wait_for(lambda: edge.edge.repository.ready(), what="tiny ready on the edge")
    return edge


@pytest.fixture
async def oip(serving_edge: EdgeServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the serving edge."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{serving_edge.http_port}", timeout=30) as client:
        yield client


def _reference(edge: EdgeServer, x: np.ndarray) -> np.ndarray:
    """What ONNX Runtime says for the file the edge serves."""
    session = ort.InferenceSession(str(edge.edge.files.model_path("tiny", "1")), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input": x})[0]


def _json_request(x: np.ndarray, **extra: object) -> dict[str, object]:
    tensor = {"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    return {"inputs": [tensor], **extra}


async def test_health_and_server_metadata(oip: httpx.AsyncClient) -> None:
    assert (await oip.get("/v2/health/live")).json() == {"live": True}
    ready = await oip.get("/v2/health/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True}
    meta = (await oip.get("/v2")).json()
    assert meta["name"] == "modelfleet-edge" and "binary_tensor_data" in meta["extensions"] and meta["version"]


async def test_model_metadata_and_readiness(oip: httpx.AsyncClient) -> None:
    meta = (await oip.get("/v2/models/tiny")).json()
    assert meta["name"] == "tiny" and meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 32]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert (await oip.get("/v2/models/tiny/versions/1")).json() == meta
    assert (await oip.get("/v2/models/tiny/ready")).json() == {"name": "tiny", "ready": True}
    assert (await oip.get("/v2/models/tiny/versions/1/ready")).status_code == 200
    for path in ("/v2/models/nope", "/v2/models/tiny/versions/9", "/v2/models/nope/ready"):
        response = await oip.get(path)
        assert response.status_code == 404 and response.json()["error"]


async def test_model_config_in_tritons_shape(oip: httpx.AsyncClient) -> None:
    """Triton's model configuration: dims without the batch axis, as max_batch_size > 0 means."""
    config = (await oip.get("/v2/models/tiny/config")).json()
    assert config == {
        "name": "tiny",
        "platform": "onnxruntime_onnx",
        "backend": "onnxruntime",
        "max_batch_size": 32,
        "input": [{"name": "input", "data_type": "TYPE_FP32", "dims": [32]}],
        "output": [{"name": "logits", "data_type": "TYPE_FP32", "dims": [10]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 5000},
    }
    assert (await oip.get("/v2/models/tiny/versions/1/config")).json() == config
    for path in ("/v2/models/nope/config", "/v2/models/tiny/versions/9/config"):
        response = await oip.get(path)
        assert response.status_code == 404 and response.json()["error"]
    assert "model_configuration" in (await oip.get("/v2")).json()["extensions"]


async def test_json_inference_echoes_the_id_and_matches_onnx_runtime(
    oip: httpx.AsyncClient, serving_edge: EdgeServer
) -> None:
    x = np.random.default_rng(0).standard_normal((3, 32), dtype=np.float32)
    for path in ("/v2/models/tiny/infer", "/v2/models/tiny/versions/1/infer"):
        response = await oip.post(path, json=_json_request(x, id="req-42"))
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["id"] == "req-42" and doc["model_name"] == "tiny" and doc["model_version"] == "1"
        (out,) = doc["outputs"]
        assert out["name"] == "logits" and out["datatype"] == "FP32" and out["shape"] == [3, 10]
        np.testing.assert_allclose(np.array(out["data"]).reshape(3, 10), _reference(serving_edge, x), rtol=1e-5)


async def test_nested_data_and_requested_outputs(oip: httpx.AsyncClient) -> None:
    x = np.ones((2, 32), dtype=np.float32)
    request = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 32], "data": x.tolist()}],
        "outputs": [{"name": "logits"}],
    }
    doc = (await oip.post("/v2/models/tiny/infer", json=request)).json()
    assert [o["name"] for o in doc["outputs"]] == ["logits"] and "id" not in doc
    request["outputs"] = [{"name": "nope"}]
    bad = await oip.post("/v2/models/tiny/infer", json=request)
    assert bad.status_code == 400 and "nope" in bad.json()["error"]


async def test_binary_tensor_extension_round_trip(oip: httpx.AsyncClient, serving_edge: EdgeServer) -> None:
    x = np.random.default_rng(1).standard_normal((4, 32), dtype=np.float32)
    header = orjson.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [4, 32], "parameters": {"binary_data_size": x.nbytes}}
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    )
    response = await oip.post(
        "/v2/models/tiny/infer",
        content=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    json_length = int(response.headers["Inference-Header-Content-Length"])
    doc = orjson.loads(response.content[:json_length])
    (out,) = doc["outputs"]
    assert out["parameters"]["binary_data_size"] == 4 * 10 * 4 and "data" not in out
    logits = np.frombuffer(response.content[json_length:], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(logits, _reference(serving_edge, x), rtol=1e-5)


async def test_binary_output_for_all_outputs_by_request_parameter(oip: httpx.AsyncClient) -> None:
    x = np.zeros((1, 32), dtype=np.float32)
    response = await oip.post("/v2/models/tiny/infer", json=_json_request(x, parameters={"binary_data_output": True}))
    json_length = int(response.headers["Inference-Header-Content-Length"])
    assert len(response.content) == json_length + 40


def _tensor(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.0] * 32}
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": [_tensor(name="x")]}, "no input 'x'"),
        ({"inputs": [_tensor(datatype="FP64")]}, "datatype FP64"),
        ({"inputs": [_tensor(datatype="FLOAT")]}, "unknown datatype"),
        ({"inputs": [_tensor(shape=[32], data=[0.0] * 32)]}, "rank"),
        ({"inputs": [_tensor(shape=[1, 31], data=[0.0] * 31)]}, "dimension 1 is 31"),
        ({"inputs": [_tensor(data=[0.0] * 30)]}, "needs 32 elements"),
        ({"inputs": [_tensor(data=["a"] * 32)]}, "does not match datatype"),
        ({"inputs": [_tensor(shape=[0, 32], data=[])]}, "empty"),
        ({"inputs": []}, "non-empty list"),
        ({"inputs": [_tensor(shape="1x32")]}, "shape must be"),
        ({"inputs": [_tensor(), _tensor()]}, "twice"),
    ],
)
async def test_bad_tensors_are_400_with_the_reason(
    oip: httpx.AsyncClient, body: dict[str, object], message: str
) -> None:
    response = await oip.post("/v2/models/tiny/infer", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]


async def test_malformed_bodies_and_binary_headers_are_400(oip: httpx.AsyncClient) -> None:
    for content, headers in (
        (b"{not json", {}),
        (b"[1, 2]", {}),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "-3"}),
    ):
        response = await oip.post("/v2/models/tiny/infer", content=content, headers=headers)
        assert response.status_code == 400 and response.json()["error"], (content, response.text)
    header = orjson.dumps({"inputs": [_tensor(data=None, parameters={"binary_data_size": 128})]})
    short = await oip.post(
        "/v2/models/tiny/infer",
        content=header + b"\x00" * 100,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert short.status_code == 400 and "binary_data_size" in short.json()["error"]


async def test_unknown_model_inference_is_404(oip: httpx.AsyncClient) -> None:
    response = await oip.post("/v2/models/nope/infer", json={"inputs": [_tensor()]})
    assert response.status_code == 404 and "nope" in response.json()["error"]


async def test_metrics_count_requests(oip: httpx.AsyncClient) -> None:
    await oip.post("/v2/models/tiny/infer", json={"inputs": [_tensor()]})
    text = (await oip.get("/metrics")).text
    assert 'modelfleet_inference_requests_total{model="tiny"' in text


def test_bytes_elements_codec_round_trip() -> None:
    from edge_node.inference.request import InferRequest
    from edge_node.rest.codec import decode_request, encode_response

    words = [b"edge", b"", "\u00fcber".encode()]
    raw = b"".join(struct.pack("<I", len(w)) + w for w in words)
    header = orjson.dumps(
        {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(raw)}}]}
    )
    decoded = decode_request(header + raw, len(header))
    assert decoded.inputs["s"].tolist() == words
    request = InferRequest(id=None, inputs={}, requested_outputs=None, binary_default=True)
    body, json_length = encode_response("m", "1", request, {"s": decoded.inputs["s"]})
    assert json_length is not None and body[json_length:] == raw


@pytest.mark.parametrize("warnings_as", ["error", "ignore"])
@pytest.mark.parametrize(("datatype", "value"), [("FP32", 1e39), ("FP16", 70000.0), ("FP32", -3.5e38)])
def test_a_json_value_a_float_datatype_cannot_hold_is_refused(datatype: str, value: float, warnings_as: str) -> None:
    """Whether numpy's overflow warning is an error (tests) or only printed (production)."""
    import warnings

    from edge_node.errors import InvalidRequest
    from edge_node.rest.codec import decode_request

    body = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 2], "data": [0.5, value]}]})
    with warnings.catch_warnings():
        warnings.simplefilter(warnings_as, RuntimeWarning)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match=f"'x': a value is outside the range of {datatype}"):
            decode_request(body, None)
    ok = decode_request(
        orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": [0.5, 1]}]}), None
    )
    assert ok.inputs["x"].tolist() == [0.5, 1.0]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v2/models/tiny%0a"),
        ("GET", "/v2/models/tiny/versions/1%0a"),
        ("GET", "/v2/models/tiny%0a/ready"),
        ("GET", "/v2/models/tiny/versions/1%0a/ready"),
        ("POST", "/v2/models/tiny%0a/infer"),
        ("POST", "/v2/models/tiny/versions/1%0a/infer"),
        ("POST", "/v2/models/tiny/versions/1%0d%0aX-Injected:%201/infer"),
    ],
)
async def test_a_name_or_version_with_a_trailing_newline_is_422_with_the_rule(
    oip: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await oip.request(method, path, json={"inputs": [_tensor()]} if method == "POST" else None)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "\\n" in error and "may only use letters, digits" in error, error  # the newline shown, and the rule
    assert (await oip.post("/v2/models/tiny/versions/1/infer", json={"inputs": [_tensor()]})).status_code == 200


async def test_an_inference_header_length_of_non_ascii_digits_is_400(oip: httpx.AsyncClient) -> None:
    # "²".isdigit() is True but int("²") raises: the header is checked as ASCII digits.
    body = orjson.dumps({"inputs": [_tensor()]})
    response = await oip.post(
        "/v2/models/tiny/infer", content=body, headers={"Inference-Header-Content-Length": "²".encode("latin-1")}
    )
    assert response.status_code == 400, response.text
    assert "non-negative integer" in response.json()["error"]
