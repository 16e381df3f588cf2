"""The gateway of a real central tells a model the registry has never heard of (404, gRPC
NOT_FOUND) from a known model no node serves yet (503)."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx

from central.server import CentralServer
from fleetwire.kserve import grpc_predict_v2_pb2 as pb
from fleetwire.kserve import grpc_predict_v2_pb2_grpc as pb_grpc
from support.fleet import push

_BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}]}


async def test_an_unknown_model_is_not_found_over_rest(api: httpx.AsyncClient, small_model_file: Path) -> None:
    r = await api.post("/v2/models/does-not-exist/infer", json=_BODY)
    assert r.status_code == 404, r.text
    assert r.json() == {"error": "unknown model 'does-not-exist'"}
    await push(api, "tiny", small_model_file)
    r = await api.post("/v2/models/tiny/versions/9/infer", json=_BODY)
    assert r.status_code == 404 and r.json() == {"error": "model 'tiny' has no version '9'"}, r.text
    r = await api.post("/v2/models/tiny/infer", json=_BODY)  # known, but no node serves it yet
    assert r.status_code == 503 and r.json()["error"].startswith("no node can serve model 'tiny'"), r.text
    assert r.headers["Retry-After"] == "1"  # a known model: worth retrying, unlike the 404s


async def test_an_unknown_model_is_not_found_over_grpc(
    central: CentralServer, api: httpx.AsyncClient, small_model_file: Path
) -> None:
    await push(api, "tiny", small_model_file)
    assert central.infer_grpc_address is not None
    async with grpc.aio.insecure_channel(central.infer_grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for model, code in (("does-not-exist", grpc.StatusCode.NOT_FOUND), ("tiny", grpc.StatusCode.UNAVAILABLE)):
            request = pb.ModelInferRequest(
                model_name=model,
                inputs=[pb.ModelInferRequest.InferInputTensor(name="input", datatype="FP32", shape=[1, 4])],
                raw_input_contents=[b"\0" * 16],
            )
            try:
                await stub.ModelInfer(request)
            except grpc.aio.AioRpcError as error:
                assert error.code() is code, (model, error)
            else:
                raise AssertionError(f"{model}: no error")
