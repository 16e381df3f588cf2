"""The error shape of the OpenAI-compatible API (``/v1/...``), served by every edge and by
central's gateway: ``{"error": {"message", "type", "param", "code"}}``. Declared here so both
OpenAPI documents say what an error of those routes looks like (clients and the fuzz suite
read it); the bodies themselves are written by the routes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = ["OPENAI_ERRORS", "OpenAIError", "OpenAIErrorBody"]


class OpenAIError(BaseModel):
    """What went wrong, OpenAI's way."""

    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class OpenAIErrorBody(BaseModel):
    """``{"error": {...}}``."""

    error: OpenAIError


#: The statuses a text route answers with an error body (429 and 503 with Retry-After).
OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIErrorBody} for code in (400, 404, 409, 413, 422, 429, 502, 503, 504)
}
