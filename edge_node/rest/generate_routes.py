"""The Open Inference Protocol's generate extension: ``POST /v2/models/{m}/generate`` and
``/generate_stream`` (``text_input`` and ``parameters`` in; ``text_output`` out, streamed as
server-sent events of such objects). A thin transport over
:class:`~edge_node.generation.service.LanguageModels`; errors in the OIP shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from edge_node.errors import EdgeError
from edge_node.generation.service import LanguageModel, LanguageModels
from edge_node.rest.routes import error_response, json_response
from edge_node.rest.schema import GENERATE
from edge_node.rest.textgen import FieldError, Started, get_typed, read_json, sampling, sse, start_stream

__all__ = ["create_generate_routes"]


def create_generate_routes(service: LanguageModels) -> APIRouter:
    """The generate routes over ``service``."""
    router = APIRouter(tags=["oip-generate"])
    limit = service.plane.limits.max_body_bytes

    async def begin(name: str, request: Request) -> tuple[LanguageModel, Started]:
        doc = await read_json(request, limit)
        model = service.get(name)
        text = doc.get("text_input")
        if not isinstance(text, str):
            raise FieldError("text_input must be a string", param="text_input")
        prompt = model.engine.tokenizer.encode(text)
        parameters = get_typed(doc, "parameters", dict, {})
        params = sampling(parameters, len(prompt), model.engine.context_length)
        return model, await start_stream(service, model, prompt, params)

    def output(model: LanguageModel, text: str, finish: str | None) -> dict[str, Any]:
        return {"model_name": model.name, "model_version": model.version, "text_output": text, "finish_reason": finish}

    @router.post("/v2/models/{name}/generate", responses=GENERATE)
    async def generate(name: str, request: Request) -> Response:
        try:
            model, started = await begin(name, request)
            parts, finish = [], None
            async for step in started.steps():
                parts.append(step.text)
                finish = step.finish_reason
        except EdgeError as exc:
            return error_response(exc)
        return json_response(output(model, "".join(parts), finish))

    @router.post("/v2/models/{name}/generate_stream", responses=GENERATE)
    async def generate_stream(name: str, request: Request) -> Response:
        try:
            model, started = await begin(name, request)
        except EdgeError as exc:
            return error_response(exc)

        async def events() -> AsyncIterator[dict[str, Any]]:
            try:
                async for step in started.steps():
                    if step.text or step.finish_reason is not None:
                        yield output(model, step.text, step.finish_reason)
            except EdgeError as exc:
                yield {"error": str(exc)}

        return StreamingResponse(sse(events(), done=False), media_type="text/event-stream",
                                 background=BackgroundTask(started.close))  # fmt: skip

    return router
