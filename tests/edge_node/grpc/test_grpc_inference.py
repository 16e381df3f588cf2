"""KServe v2 gRPC inference on a real edge (``inference.GRPCInferenceService`` on its own
port), with the generated stubs as the client: every RPC, raw and typed contents, FP32 and
INT64 inputs, requested outputs, every error code a client can meet, and the in-flight cap
that the gRPC and REST transports share. Outputs are compared with ONNX Runtime's on the
same files."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from central.server import CentralServer
from edge_node.server import EdgeServer
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve import grpc_predict_v2_pb2_grpc as pb_grpc
from support.fleet import EdgeFactory, push
from support.request_models import VOCAB, _save, build_fill_model, build_token_model
from support.wait import wait_for

LIMITS = {"max_infer_body_bytes": 64 * 1024, "max_tensor_elements": 1000, "max_inflight_infer_requests": 1}
Files = dict[str, Path]


def _build_two_outputs(path: Path) -> Path:
    """``x`` (FP32, [batch, 4]) → ``double`` (x + x) and ``negated`` (-x)."""
    nodes = [helper.make_node("Add", ["x", "x"], ["double"]), helper.make_node("Neg", ["x"], ["negated"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("double", "negated")]
    return _save(helper.make_graph(nodes, "two", [x], outs), path)


@pytest.fixture
async def served(
    central: CentralServer, api: httpx.AsyncClient, make_edge: EdgeFactory, small_model_file: Path, tmp_path: Path
) -> tuple[EdgeServer, Files]:
    """An edge with small limits serving "tiny" (FP32), "tokens" (INT64), "two" (two outputs), "fill"."""
    edge = await make_edge("edge-0", central, limits=LIMITS)
    files = {
        "tiny": small_model_file,
        "tokens": build_token_model(tmp_path / "tokens.onnx"),
        "two": _build_two_outputs(tmp_path / "two.onnx"),
        "fill": build_fill_model(tmp_path / "fill.onnx"),
    }
    for name, path in files.items():
        assert (await push(api, name, path)).status_code == 201
    await wait_for(lambda: len(edge.edge.repository.models()) == len(files), what="four models loaded")
    await wait_for(edge.edge.repository.ready, what="every model ready")
    return edge, files


@pytest.fixture
async def stub(served: tuple[EdgeServer, Files]) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    edge, _ = served
    assert edge.infer_grpc_port and edge.infer_grpc_port not in (edge.http_port, edge.grpc_port)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}") as rest:  # the status names it
        assert (await rest.get("/api/v1/status")).json()["ports"]["infer_grpc"] == edge.infer_grpc_port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{edge.infer_grpc_port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def _reference(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed))


def _tensor(name: str, array: np.ndarray, datatype: str) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=list(array.shape))


def _raw_request(model: str, feed: dict[str, tuple[np.ndarray, str]], **fields: Any) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[_tensor(n, a, d) for n, (a, d) in feed.items()],
        raw_input_contents=[a.tobytes() for a, _ in feed.values()],
        **fields,
    )


def _outputs(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    assert len(response.raw_output_contents) == len(response.outputs) and not any(
        o.HasField("contents") for o in response.outputs
    )
    return {
        o.name: np.frombuffer(raw, dtype=np.float32).reshape(list(o.shape))
        for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
        if o.datatype == "FP32"
    }


async def _code(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


async def test_health_and_metadata_rpcs(
    stub: pb_grpc.GRPCInferenceServiceStub, served: tuple[EdgeServer, Files]
) -> None:
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    meta = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert meta.name == "modelfleet-edge" and "binary_tensor_data" in meta.extensions
    version = served[0].edge.repository.get("tokens", None).version
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="tokens"))).ready
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="tokens", version=version))).ready
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="ghost"))).ready  # as Triton's clients read REST 404
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="tokens", version="999"))).ready
    code, details = await _code(stub.ModelReady(pb.ModelReadyRequest(name="bad/name")))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "model name" in details

    model = await stub.ModelMetadata(pb.ModelMetadataRequest(name="tokens"))
    assert model.name == "tokens" and model.platform == "onnxruntime_onnx" and list(model.versions) == [version]
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [
        ("input_ids", "INT64", [-1, -1]),
        ("attention_mask", "INT64", [-1, -1]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in model.outputs] == [("logits", "FP32", [-1, 4])]
    code, details = await _code(stub.ModelMetadata(pb.ModelMetadataRequest(name="ghost")))
    assert code is grpc.StatusCode.NOT_FOUND and "ghost" in details


async def test_raw_and_typed_inputs_match_onnx_runtime(
    stub: pb_grpc.GRPCInferenceServiceStub, served: tuple[EdgeServer, Files]
) -> None:
    _, files = served
    x = np.random.default_rng(1).standard_normal((3, 32)).astype(np.float32)
    (want,) = _reference(files["tiny"], {"input": x})
    raw = await stub.ModelInfer(_raw_request("tiny", {"input": (x, "FP32")}, id="req-1"))
    assert raw.id == "req-1" and raw.model_name == "tiny" and raw.model_version
    assert [(o.name, o.datatype, list(o.shape)) for o in raw.outputs] == [("logits", "FP32", [3, 10])]
    np.testing.assert_allclose(_outputs(raw)["logits"], want, rtol=1e-5, atol=1e-5)

    typed = pb.ModelInferRequest(
        model_name="tiny", model_version=raw.model_version, inputs=[_tensor("input", x, "FP32")]
    )
    typed.inputs[0].contents.fp32_contents.extend(x.ravel().tolist())
    np.testing.assert_allclose(_outputs(await stub.ModelInfer(typed))["logits"], want, rtol=1e-5, atol=1e-5)

    ids = np.array([[1, 5, VOCAB - 1, 0], [7, 7, 2, 3]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=np.int64)
    (want,) = _reference(files["tokens"], {"input_ids": ids, "attention_mask": mask})
    feed = {"input_ids": (ids, "INT64"), "attention_mask": (mask, "INT64")}
    got = _outputs(await stub.ModelInfer(_raw_request("tokens", feed)))["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    typed = pb.ModelInferRequest(model_name="tokens", inputs=[_tensor(n, a, d) for n, (a, d) in feed.items()])
    typed.inputs[0].contents.int64_contents.extend(ids.ravel().tolist())
    typed.inputs[1].contents.int64_contents.extend(mask.ravel().tolist())
    typed.parameters["priority"].int64_param = 1
    np.testing.assert_allclose(_outputs(await stub.ModelInfer(typed))["logits"], want, rtol=1e-5, atol=1e-5)


async def test_requested_outputs_are_the_only_ones_answered(
    stub: pb_grpc.GRPCInferenceServiceStub, served: tuple[EdgeServer, Files]
) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    both = _outputs(await stub.ModelInfer(_raw_request("two", {"x": (x, "FP32")})))
    assert set(both) == {"double", "negated"}
    np.testing.assert_array_equal(both["double"], x + x)
    only = _raw_request(
        "two", {"x": (x, "FP32")}, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="negated")]
    )
    answer = await stub.ModelInfer(only)
    assert [o.name for o in answer.outputs] == ["negated"] and len(answer.raw_output_contents) == 1
    np.testing.assert_array_equal(_outputs(answer)["negated"], -x)
    wrong = _raw_request(
        "two", {"x": (x, "FP32")}, outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="nope")]
    )
    code, details = await _code(stub.ModelInfer(wrong))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "no output 'nope'" in details


async def test_every_refusal_has_its_code_and_the_edge_keeps_serving(
    stub: pb_grpc.GRPCInferenceServiceStub, served: tuple[EdgeServer, Files]
) -> None:
    x = np.zeros((2, 32), dtype=np.float32)
    ids = np.array([[1, VOCAB + 1]], dtype=np.int64)
    two_raw = _raw_request("tiny", {"input": (x, "FP32")})
    two_raw.raw_input_contents.append(b"")
    fp16 = pb.ModelInferRequest(model_name="tiny", inputs=[_tensor("input", x, "FP16")])
    cases: list[tuple[pb.ModelInferRequest, grpc.StatusCode, str]] = [
        (_raw_request("bad/name", {"input": (x, "FP32")}), grpc.StatusCode.INVALID_ARGUMENT, "model name"),
        (_raw_request("ghost", {"input": (x, "FP32")}), grpc.StatusCode.NOT_FOUND, "ghost"),
        (_raw_request("tiny", {"input": (x.astype(np.float64), "FP64")}), grpc.StatusCode.INVALID_ARGUMENT, "FP32"),
        (_raw_request("tiny", {"input": (x[:, :31].copy(), "FP32")}), grpc.StatusCode.INVALID_ARGUMENT, "dimension 1"),
        (_raw_request("tiny", {"wrong": (x, "FP32")}), grpc.StatusCode.INVALID_ARGUMENT, "no input 'wrong'"),
        (
            _raw_request("tiny", {"input": (np.zeros((40, 32), np.float32), "FP32")}),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "1000 elements",
        ),
        (two_raw, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents holds 2 tensors for 1 inputs"),
        (fp16, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
        (
            _raw_request("tokens", {"input_ids": (ids, "INT64"), "attention_mask": (np.ones_like(ids), "INT64")}),
            grpc.StatusCode.INVALID_ARGUMENT,
            str(VOCAB + 1),
        ),
        (_raw_request("fill", {"shape": (np.array([2**30, 2**30], np.int64), "INT64")}), grpc.StatusCode.INTERNAL, ""),
    ]
    for request, want, words in cases:
        code, details = await _code(stub.ModelInfer(request))
        assert code is want and words in details, (request.model_name, code, details)
    # bigger than limits.max_infer_body_bytes: refused by gRPC before any of it is decoded
    big = _raw_request("tiny", {"input": (x, "FP32")})
    big.raw_input_contents[0] = b"\0" * (80 * 1024)
    code, _ = await _code(stub.ModelInfer(big))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(_outputs(await stub.ModelInfer(_raw_request("tiny", {"input": (x, "FP32")})))["logits"]) == 2


async def test_the_in_flight_cap_counts_both_transports(
    stub: pb_grpc.GRPCInferenceServiceStub, served: tuple[EdgeServer, Files]
) -> None:
    edge, _ = served
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b'{"inputs": ['
        await release.wait()
        yield b'{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": [' + b"0," * 31 + b"0]}]}"

    x = np.zeros((1, 32), dtype=np.float32)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{edge.http_port}", timeout=30) as rest:
        held = asyncio.create_task(rest.post("/v2/models/tiny/infer", content=slow_body()))
        await asyncio.sleep(0.2)  # a REST body still arriving holds no place: gRPC is served
        assert len((await stub.ModelInfer(_raw_request("tiny", {"input": (x, "FP32")}))).raw_output_contents) == 1
        with edge.edge.plane.admitted("tiny", None):  # the one place taken (as by a request of either transport)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(_raw_request("tiny", {"input": (x, "FP32")}))
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE and "max_inflight" in (info.value.details() or "")
            assert dict(info.value.trailing_metadata() or ())["retry-after"] == "1"
            refused = await rest.post("/v2/models/tiny/infer", json={"inputs": []})
            assert refused.status_code == 503 and "max_inflight" in refused.json()["error"]
        release.set()
        assert (await held).status_code == 200
    assert edge.edge.plane.inflight == 0
    await stub.ModelInfer(_raw_request("tiny", {"input": (x, "FP32")}))
    assert edge.edge.plane.inflight == 0
