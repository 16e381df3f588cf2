"""Turns an HTTP push request into a staged upload plus its metadata, streaming every
file to the push's staging directory and enforcing the size limit while the body arrives.

A push is a raw body (a self-contained ``.onnx``, or a tar of a directory with one
``.onnx`` and its external-data files, plain or gzipped) or a multipart of every file of
the model (see ``central.rest.multipart``). Nothing is held in memory whole; whatever
goes wrong, nothing is left in staging."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.types import Message, Receive

from central.errors import BadRequest, TooLarge
from central.handlers.registry import PushRequest
from central.registry.bundle import ReceivedPart, arrange
from central.registry.staging import Staging
from central.rest.multipart import read_push_form
from fleetwire.names import InvalidName, check_label

#: What a multipart body may add to its files (boundaries, part headers, text fields).
ENVELOPE_BYTES = 2 * 1024 * 1024


_TRUE = {"1", "true", "yes", "on"}


def parse_flag(name: str, raw: str | None) -> bool:
    """A boolean query or form field; 400 on anything but true/false spellings."""
    if raw is None or raw == "":
        return False
    value = raw.strip().lower()
    if value not in _TRUE | {"0", "false", "no", "off"}:
        raise BadRequest(f"{name} must be true or false, got {raw!r}")
    return value in _TRUE


def parse_labels(raw: list[str]) -> dict[str, str]:
    """``["k=v", "a=b,c=d"]`` → ``{"k": "v", "a": "b", "c": "d"}``; 400 on a malformed pair
    or a control character (a newline) in a key or value."""
    labels: dict[str, str] = {}
    for item in raw:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise BadRequest(f"label {pair!r} is not of the form key=value")
            try:
                key, value = check_label(key.strip(), value.strip())
            except InvalidName as exc:
                raise BadRequest(str(exc)) from exc
            labels[key] = value
    return labels


def _limited(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise TooLarge(f"upload exceeds the limit of {limit} bytes")
        return message

    return wrapped


def _check_length(request: Request, staging: Staging) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit():
        staging.check_declared(int(length))


async def receive_push(request: Request, staging: Staging) -> PushRequest:
    """Stage every file of a push request and collect version, labels and flags."""
    _check_length(request, staging)
    # The envelope adds a little to the files; the files themselves are counted by the box.
    limited = Request(request.scope, _limited(request.receive, staging.limit + ENVELOPE_BYTES))
    version = request.query_params.get("version")
    labels = request.query_params.getlist("labels") + request.query_params.getlist("label")
    keep_fp32 = parse_flag("keep_fp32", request.query_params.get("keep_fp32"))
    content_type = request.headers.get("content-type", "")
    box = staging.open()
    try:
        if not content_type.startswith("multipart/form-data"):
            parsed = parse_labels(labels)
            parts = [ReceivedPart(None, await box.receive(limited.stream()))]
            upload = await asyncio.to_thread(arrange, box, parts)
            return PushRequest(upload=upload, version=version, labels=parsed, keep_fp32=keep_fp32)
        form = await read_push_form(limited.stream(), content_type, box)
        if not form.parts:
            raise BadRequest("multipart push needs the model in a file field named 'file'")
        version = form.get("version") or version
        keep_fp32 = keep_fp32 or parse_flag("keep_fp32", form.get("keep_fp32"))
        parsed = parse_labels(labels + form.fields.get("labels", []) + form.fields.get("label", []))
        upload = await asyncio.to_thread(arrange, box, form.parts)
        return PushRequest(upload, version, parsed, form.calibration, keep_fp32, form.eval_data)
    except BaseException:
        box.discard()
        raise
