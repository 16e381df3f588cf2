"""Turns an HTTP push request (raw body or multipart) into a staged upload plus
its metadata, enforcing the size limit while the body arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.types import Message, Receive

from central.errors import BadRequest, TooLarge
from central.registry.staging import StagedUpload, Staging

_READ = 1024 * 1024


@dataclass
class PushRequest:
    """A received push: the staged file and the metadata that came with it."""

    upload: StagedUpload
    version: str | None
    labels: dict[str, str]


def parse_labels(raw: list[str]) -> dict[str, str]:
    """``["k=v", "a=b,c=d"]`` → ``{"k": "v", "a": "b", "c": "d"}``; 400 on a malformed pair."""
    labels: dict[str, str] = {}
    for item in raw:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise BadRequest(f"label {pair!r} is not of the form key=value")
            labels[key.strip()] = value.strip()
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


async def _read_upload(file: UploadFile) -> AsyncIterator[bytes]:
    while block := await file.read(_READ):
        yield block


def _check_length(request: Request, limit: int) -> None:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLarge(f"upload of {length} bytes exceeds the limit of {limit} bytes")


async def receive_push(request: Request, staging: Staging) -> PushRequest:
    """Stage the model file of a push request and collect version and labels."""
    _check_length(request, staging.limit)
    # The multipart envelope adds a little; the file itself is checked by Staging.
    limited = Request(request.scope, _limited(request.receive, staging.limit + 64 * 1024))
    version = request.query_params.get("version")
    labels = request.query_params.getlist("labels") + request.query_params.getlist("label")
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        parsed = parse_labels(labels)
        return PushRequest(upload=await staging.receive(limited.stream()), version=version, labels=parsed)
    form = await limited.form(max_files=1, max_fields=32)
    try:
        file = form.get("file")
        if not isinstance(file, UploadFile):
            raise BadRequest("multipart push needs the model in a file field named 'file'")
        field_version = form.get("version")
        if isinstance(field_version, str) and field_version:
            version = field_version
        labels += [v for v in form.getlist("labels") + form.getlist("label") if isinstance(v, str)]
        parsed = parse_labels(labels)
        return PushRequest(upload=await staging.receive(_read_upload(file)), version=version, labels=parsed)
    finally:
        await form.close()
