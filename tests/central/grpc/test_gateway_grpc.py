"""Central's gateway over KServe v2 gRPC, in front of real edges: each call goes the REST
gateway's way (same proxy, router, breakers, retries and limits), so a node that is down is
skipped, the REST and gRPC requests share ``max_outstanding``, and every refusal carries the
gRPC code of the status the REST gateway answers. Real edges, real uvicorn, real gRPC."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from central.gateway import Candidate, GatewayProxy, StaticNodeSource, create_gateway
from central.grpc.gateway_convert import rest_request
from central.grpc.gateway_servicer import GatewayInferenceServicer
from central.server import CentralServer
from central.settings import GatewaySettings
from edge_node.grpc.converters import decode_infer_request
from edge_node.rest.codec import decode_request
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve import grpc_predict_v2_pb2_grpc as pb_grpc
from fleetwire.kserve.server import InferenceServer
from support.fleet import EdgeFactory, push
from support.gateway_harness import candidate, serve_gateway, silent_node
from support.request_models import VOCAB, build_token_model
from support.wait import wait_for

BODY_LIMIT = 64 * 1024
_TINY_JSON = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [0.0] * 32}]}
Gateway = tuple[GatewayProxy, pb_grpc.GRPCInferenceServiceStub, httpx.AsyncClient]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def gateway(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path, tmp_path: Path
) -> AsyncIterator[Gateway]:
    """The gateway (REST and gRPC on one proxy) over a node that is down and a live edge
    serving "tiny" and "tokens" (at most 1000 elements per tensor)."""
    edge = await make_edge("edge-0", central, limits={"max_tensor_elements": 1000})
    for name, path in {"tiny": small_model_file, "tokens": build_token_model(tmp_path / "tokens.onnx")}.items():
        assert (await push(api, name, path)).status_code == 201
    await wait_for(lambda: len(edge.edge.repository.models()) == 2 and edge.edge.repository.ready(), what="ready")
    source = StaticNodeSource([Candidate("down", f"127.0.0.1:{_closed_port()}"), candidate(edge)])
    source.set_model("ghost", [])  # served nowhere
    settings = GatewaySettings(max_body_bytes=BODY_LIMIT, max_outstanding=1, failure_threshold=1, open_s=60)
    proxy = create_gateway(source, settings)
    server = InferenceServer(GatewayInferenceServicer(proxy), "127.0.0.1", 0, max_message_bytes=BODY_LIMIT)
    port = await server.start()
    try:
        async with (
            serve_gateway(proxy) as rest,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            yield proxy, pb_grpc.GRPCInferenceServiceStub(channel), rest
    finally:
        await server.stop()


def _request(model: str, feed: dict[str, tuple[np.ndarray, str]], **fields: Any) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name=n, datatype=d, shape=list(a.shape)) for n, (a, d) in feed.items()
        ],
        raw_input_contents=[a.tobytes() for a, _ in feed.values()],
        **fields,
    )


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value


async def test_inference_through_the_gateway_skips_a_down_node(gateway: Gateway) -> None:
    proxy, stub, rest = gateway
    x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
    rest_answer = await rest.post(
        "/v2/models/tiny/infer",
        json={"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 32], "data": x.ravel().tolist()}]},
    )
    want = np.array(rest_answer.json()["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
    for _ in range(3):  # whichever node the router tries first, the live edge answers
        call = stub.ModelInfer(_request("tiny", {"input": (x, "FP32")}, id="g-1"))
        answer = await call
        assert answer.id == "g-1" and answer.model_name == "tiny"
        assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [("logits", "FP32", [2, 10])]
        np.testing.assert_allclose(np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(2, 10), want)
        assert dict(await call.trailing_metadata())["x-modelfleet-node"] == "edge-0"
    assert proxy.stats.node_failures == 1  # the down node, once: its breaker is open now

    ids = np.array([[1, 2, 3]], dtype=np.int64)
    typed = pb.ModelInferRequest(
        model_name="tokens",
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name=n, datatype="INT64", shape=[1, 3])
            for n in ("input_ids", "attention_mask")
        ],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="logits")],
    )
    typed.inputs[0].contents.int64_contents.extend([1, 2, 3])
    typed.inputs[1].contents.int64_contents.extend([1, 1, 1])
    by_raw = await stub.ModelInfer(
        _request("tokens", {"input_ids": (ids, "INT64"), "attention_mask": (ids * 0 + 1, "INT64")})
    )
    by_typed = await stub.ModelInfer(typed)
    assert by_typed.raw_output_contents == by_raw.raw_output_contents and len(by_raw.raw_output_contents[0]) == 4 * 4


async def test_health_metadata_and_readiness(gateway: Gateway) -> None:
    _, stub, _ = gateway
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    assert (await stub.ServerMetadata(pb.ServerMetadataRequest())).name == "modelfleet-gateway"
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="tiny"))).ready
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="ghost"))).ready
    assert (
        await _refused(stub.ModelReady(pb.ModelReadyRequest(name="a/b")))
    ).code() is grpc.StatusCode.INVALID_ARGUMENT
    meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="tokens"))
    assert (meta.inputs[0].name, meta.inputs[0].datatype, list(meta.inputs[0].shape)) == (
        "input_ids",
        "INT64",
        [-1, -1],
    )
    assert (
        await _refused(stub.ModelMetadata(pb.ModelMetadataRequest(name="ghost")))
    ).code() is grpc.StatusCode.NOT_FOUND


async def test_refusals_carry_the_rest_gateways_status_as_grpc_codes(gateway: Gateway) -> None:
    proxy, stub, rest = gateway
    x = np.zeros((1, 32), dtype=np.float32)
    ids = np.array([[1, VOCAB + 1]], dtype=np.int64)
    too_big = _request("tiny", {"input": (x, "FP32")})
    too_big.raw_input_contents[0] = b"\0" * (BODY_LIMIT + 1)
    cases = [
        (_request("a/b", {"input": (x, "FP32")}), grpc.StatusCode.INVALID_ARGUMENT, "model name"),
        (_request("ghost", {"input": (x, "FP32")}), grpc.StatusCode.UNAVAILABLE, "no node can serve model 'ghost'"),
        (_request("tiny", {"input": (x.astype(np.float64), "FP64")}), grpc.StatusCode.INVALID_ARGUMENT, "FP32"),
        (_request("tiny", {"input": (np.zeros((40, 32), np.float32), "FP32")}), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "1000 elements"),
        (_request("tokens", {"input_ids": (ids, "INT64"), "attention_mask": (ids, "INT64")}),
         grpc.StatusCode.INVALID_ARGUMENT, str(VOCAB + 1)),
        (too_big, grpc.StatusCode.RESOURCE_EXHAUSTED, ""),  # gRPC's own message size limit
    ]  # fmt: skip
    for request, code, words in cases:
        error = await _refused(stub.ModelInfer(request))
        assert error.code() is code and words in (error.details() or ""), (request.model_name, error)

    source = proxy.router.source
    assert isinstance(source, StaticNodeSource)
    async with silent_node() as silent:  # a whole REST request held at a node that never answers
        source.set_model("tiny", [silent])
        held = asyncio.create_task(rest.post("/v2/models/tiny/infer", json=_TINY_JSON))
        await wait_for(lambda: proxy.outstanding == 1, 5, "the REST request held by the gateway")
        error = await _refused(stub.ModelInfer(_request("tiny", {"input": (x, "FP32")})))
        assert error.code() is grpc.StatusCode.UNAVAILABLE and "max_outstanding=1" in (error.details() or "")
        assert dict(error.trailing_metadata() or ())["retry-after"] == "1"
        source.set_model("tiny", None)
    assert (await held).status_code >= 500  # the silent node went away
    assert len((await stub.ModelInfer(_request("tiny", {"input": (x, "FP32")}))).raw_output_contents) == 1


def _mixed_request(typed: bool) -> pb.ModelInferRequest:
    """INT8, BOOL and BYTES inputs (and FP16, which has no typed field, when raw)."""
    words = [b"caf\xc3\xa9", b""]
    if typed:
        request = pb.ModelInferRequest(model_name="m", id="x")
        request.inputs.add(name="small", datatype="INT8", shape=[1, 2]).contents.int_contents.extend([-128, 127])
        request.inputs.add(name="flag", datatype="BOOL", shape=[1, 2]).contents.bool_contents.extend([True, False])
        request.inputs.add(name="words", datatype="BYTES", shape=[1, 2]).contents.bytes_contents.extend(words)
        return request
    tensors = {
        "half": (np.array([[1.5, -2.0]], np.float16), "FP16"),
        "small": (np.array([[-128, 127]], np.int8), "INT8"),
        "flag": (np.array([[True, False]]), "BOOL"),
    }
    request = _request("m", tensors, id="x")
    request.inputs.add(name="words", datatype="BYTES", shape=[1, 2])
    request.raw_input_contents.append(b"".join(len(w).to_bytes(4, "little") + w for w in words))
    return request


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
def test_the_gateways_rest_body_decodes_on_the_edge_as_the_grpc_request_does(typed: bool) -> None:
    """What the gateway forwards (one binary-extension body) is, to the edge's REST decoder,
    the very request the edge's gRPC decoder reads from the message."""

    request = _mixed_request(typed)
    body, headers = rest_request(request)
    over_rest = decode_request(body, int(headers["inference-header-content-length"]), 1000)
    over_grpc = decode_infer_request(request, 1000)
    assert over_rest.id == over_grpc.id == "x"  # datatypes: the arrays' dtypes, compared below
    assert list(over_rest.inputs) == list(over_grpc.inputs)
    for name, array in over_grpc.inputs.items():
        assert array.dtype == over_rest.inputs[name].dtype and array.shape == over_rest.inputs[name].shape
        assert array.tolist() == over_rest.inputs[name].tolist(), name
    assert over_grpc.inputs["words"].tolist() == [[b"caf\xc3\xa9", b""]]
