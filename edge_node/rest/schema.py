"""The shapes of the edge's OIP REST answers, declared for the OpenAPI document (clients and
the fuzz suite read which statuses a route answers). Bodies are written with orjson, never
through these models: this is the hot path."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = [
    "GENERATE",
    "INFER",
    "INFER_BODY",
    "LOOKUP",
    "METADATA",
    "NOT_READY",
    "ErrorBody",
    "ModelMetadata",
    "ServerMetadata",
]


class ErrorBody(BaseModel):
    """The OIP error shape: ``{"error": "…"}``."""

    error: str


class ReadyBody(BaseModel):
    """A readiness answer that is "no": ``{"ready": false}`` (with the model's name for a model)."""

    name: str | None = None
    ready: bool


class TensorMetadata(BaseModel):
    """One input or output in OIP metadata."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    """The OIP model metadata document (written with orjson; declared for the OpenAPI document)."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    """The OIP server metadata document."""

    name: str
    version: str
    extensions: list[str]


#: Error answers declared in the OpenAPI document, so clients (and the fuzz suite) know them.
#: 422: a model name or version that breaks the fleet's name rule (no model has one).
LOOKUP: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody},
    422: {"model": ErrorBody},
    503: {"model": ErrorBody},
}
METADATA: dict[int | str, dict[str, Any]] = {200: {"model": ModelMetadata}, **LOOKUP}
#: OIP generate: a bad body or parameter (400), the KV budget or the edge full (429, Retry-After).
GENERATE: dict[int | str, dict[str, Any]] = {400: {"model": ErrorBody}, 429: {"model": ErrorBody}, **LOOKUP}
NOT_READY: dict[int | str, dict[str, Any]] = {400: {"model": ReadyBody}}
#: 500: the node failed to run a request it accepted (out of memory, a failed device).
INFER: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    413: {"model": ErrorBody},
    **LOOKUP,
    500: {"model": ErrorBody},
}
#: The OIP v2 JSON request (binary tensor data is also accepted; the body is read raw).
INFER_BODY: dict[str, Any] = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "inputs": {"type": "array", "items": {"type": "object"}},
                        "outputs": {"type": "array", "items": {"type": "object"}},
                        "parameters": {"type": "object"},
                    },
                }
            }
        }
    }
}
