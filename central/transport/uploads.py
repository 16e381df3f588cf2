"""Turns an HTTP push request (raw body or multipart) into a staged upload plus
its metadata, enforcing the size limit while the body arrives."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.types import Message, Receive

from central.errors import BadRequest, TooLarge
from central.registry.staging import StagedUpload, Staging
from fleetwire.names import InvalidName, check_label

_READ = 1024 * 1024


@dataclass
class PushRequest:
    """A received push: the staged file and the metadata that came with it."""

    upload: StagedUpload
    version: str | None
    labels: dict[str, str]
    calibration: StagedUpload | None = None
    keep_fp32: bool = False
    #: The ``eval`` part: inputs plus a ``label`` array the accuracy guard judges on.
    eval_data: StagedUpload | None = None

    def discard(self) -> None:
        """Delete every staged file of this request."""
        self.upload.discard()
        for extra in (self.calibration, self.eval_data):
            if extra is not None:
                extra.discard()


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
    keep_fp32 = parse_flag("keep_fp32", request.query_params.get("keep_fp32"))
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        parsed = parse_labels(labels)
        upload = await staging.receive(limited.stream())
        return PushRequest(upload=upload, version=version, labels=parsed, keep_fp32=keep_fp32)
    form = await limited.form(max_files=3, max_fields=32)
    try:
        return await _from_form(form, staging, version, labels, keep_fp32)
    finally:
        await form.close()


async def _from_form(
    form: FormData, staging: Staging, version: str | None, labels: list[str], keep_fp32: bool
) -> PushRequest:
    file = form.get("file")
    if not isinstance(file, UploadFile):
        raise BadRequest("multipart push needs the model in a file field named 'file'")
    calibration = form.get("calibration")
    if calibration is not None and not isinstance(calibration, UploadFile):
        raise BadRequest("'calibration' must be a file (an .npz of arrays named after the model's inputs)")
    field_version = form.get("version")
    if isinstance(field_version, str) and field_version:
        version = field_version
    flag = form.get("keep_fp32")
    keep_fp32 = keep_fp32 or parse_flag("keep_fp32", flag if isinstance(flag, str) else None)
    parsed = parse_labels(labels + [v for v in form.getlist("labels") + form.getlist("label") if isinstance(v, str)])
    eval_part = form.get("eval")
    if eval_part is not None and not isinstance(eval_part, UploadFile):
        raise BadRequest("'eval' must be a file (an .npz of the model's inputs plus a 'label' array)")
    upload = await staging.receive(_read_upload(file))
    staged_calibration = staged_eval = None
    try:
        staged_calibration = await staging.receive(_read_upload(calibration)) if calibration else None
        staged_eval = await staging.receive(_read_upload(eval_part)) if eval_part else None
    except BaseException:
        upload.discard()
        if staged_calibration is not None:
            staged_calibration.discard()
        raise
    return PushRequest(upload, version, parsed, staged_calibration, keep_fp32, staged_eval)
