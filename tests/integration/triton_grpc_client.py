"""Triton's own gRPC client (``tritonclient.grpc``) in a process of its own: it registers
the same ``inference.*`` protobuf message names as ``fleetwire.kserve``, so it cannot share
a process with the project's stubs. Run as ``python triton_grpc_client.py '<json>'`` with
``{"url": "host:port", "x": [[...]], "ids": [[...]], "mask": [[...]], "bad_id": n}``; prints
one JSON document of what the client saw (numpy arrays as lists)."""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException


def _input(name: str, array: np.ndarray, datatype: str) -> triton.InferInput:
    tensor = triton.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _refusal(call: Any) -> list[str]:
    try:
        call()
    except InferenceServerException as exc:
        return [str(exc.status()), str(exc.message())]
    return ["no error", ""]


def session(args: dict[str, Any]) -> dict[str, Any]:
    """Everything a Triton user would try over gRPC; what the client saw."""
    client = triton.InferenceServerClient(url=args["url"])
    try:
        metadata = client.get_model_metadata("tokens", as_json=True)
        seen: dict[str, Any] = {
            "live": client.is_server_live(),
            "ready": client.is_server_ready(),
            "server": client.get_server_metadata(as_json=True),
            "model_ready": client.is_model_ready("tiny") and client.is_model_ready("tokens"),
            "ghost_ready": client.is_model_ready("ghost"),
            "metadata": metadata,
        }
        x = np.array(args["x"], dtype=np.float32)
        out = triton.InferRequestedOutput("logits")
        result = client.infer("tiny", [_input("input", x, "FP32")], outputs=[out], request_id="r-1")
        seen["tiny"] = result.as_numpy("logits").tolist()
        seen["tiny_id"] = result.get_response().id

        ids, mask = np.array(args["ids"], dtype=np.int64), np.array(args["mask"], dtype=np.int64)
        version = metadata["versions"][0]
        inputs = [_input("input_ids", ids, "INT64"), _input("attention_mask", mask, "INT64")]
        seen["tokens"] = client.infer("tokens", inputs, model_version=version).as_numpy("logits").tolist()

        bad = ids.copy()
        bad[-1, -1] = args["bad_id"]
        bad_inputs = [_input("input_ids", bad, "INT64"), _input("attention_mask", mask, "INT64")]
        seen["bad"] = _refusal(lambda: client.infer("tokens", bad_inputs))
        seen["ghost"] = _refusal(lambda: client.infer("ghost", [_input("input", x, "FP32")]))
        return seen
    finally:
        client.close()


if __name__ == "__main__":
    json.dump(session(json.loads(sys.argv[1])), sys.stdout)
