"""A small synchronous client for central's REST API (``/api/v1``), for the CLI.

Every failure becomes a ``CliError`` whose message is the one line the operator
sees: central unreachable (and why), or central's own ``{"error": …}`` message with
the HTTP status. Callers never see an ``httpx`` exception."""

from __future__ import annotations

import json
import re
import ssl
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelfleet.cli.config import CliConfig, load_config

#: JSON as central sends it.
Json = Any
JsonObject = dict[str, Any]

_CHUNK = 256 * 1024
_ERRNO = re.compile(r"^\[Errno -?\d+\]\s*")


class CliError(Exception):
    """A failure to report as one line and exit 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(CliError):
    """The operator's input is wrong (exit 2)."""


class CentralUnreachable(CliError):
    """No answer from central: refused, unknown host, timed out, connection lost."""


class CentralRefused(CliError):
    """Central answered 4xx/5xx; ``message`` is its ``error`` text."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class PushRequest:
    """One model version to push (``modelfleet push``): ``model`` is the graph (or a tar), and
    ``data_files`` the external-data files it references, by the name the graph uses."""

    model: Path
    name: str
    version: str | None = None
    calibration: Path | None = None
    labels: list[str] = field(default_factory=list)
    keep_fp32: bool = False
    #: Refuse (422) rather than serve FP32 when INT8 cannot be made or proven.
    require_int8: bool = False
    activate: bool = True
    #: Quantization options: evaluation data (inputs + ``label``), guard threshold, ``name=size`` dims.
    eval_data: Path | None = None
    threshold: float | None = None
    dims: list[str] = field(default_factory=list)
    data_files: dict[str, Path] = field(default_factory=dict)

    def parts(self) -> list[Part]:
        """Every file of the push as a multipart part: the graph, its data files, calibration, eval."""
        graph = self.model.name if self.model.name.endswith(".onnx") or not self.data_files else "model.onnx"
        parts = [Part("file", graph, self.model)]
        parts += [Part("data", name, path) for name, path in self.data_files.items()]
        if self.calibration is not None:
            parts.append(Part("calibration", "calibration.npz", self.calibration))
        if self.eval_data is not None:
            parts.append(Part("eval", "eval.npz", self.eval_data))
        return parts


def _reason(exc: Exception) -> str:
    """``[Errno 111] Connection refused`` → ``connection refused``."""
    text = _ERRNO.sub("", str(exc).strip()) or type(exc).__name__
    return text[0].lower() + text[1:]


def refusal(response: httpx.Response) -> CentralRefused:
    """Central's ``{"error": …}`` (or the bare status) as a ``CentralRefused``."""
    try:
        body = response.json()
    except ValueError:
        body = None
    message = body.get("error") if isinstance(body, dict) else None
    text = str(message) if message else (response.reason_phrase or "request failed")
    return CentralRefused(f"{text} (HTTP {response.status_code})", response.status_code)


@dataclass(frozen=True)
class Part:
    """One file of a multipart push: its form field, the file name central sees, where it is."""

    field: str
    filename: str
    path: Path


def _quoted(filename: str) -> str:
    """A file name for a Content-Disposition parameter (quotes and line breaks escaped)."""
    return filename.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "")


def multipart(parts: list[Part], on_bytes: Callable[[int], None]) -> tuple[Iterator[bytes], str, int]:
    """A multipart/form-data body read from disk as it is sent: (blocks, content type, length).

    Built by hand rather than by httpx so that ``on_bytes`` fires per block really
    handed to the connection, and the length is known up front (a real progress bar)."""
    boundary = uuid.uuid4().hex
    heads = [
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{part.field}"; filename="{_quoted(part.filename)}"'
            "\r\nContent-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for part in parts
    ]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(h) + part.path.stat().st_size + 2 for h, part in zip(heads, parts, strict=True)) + len(tail)

    def blocks() -> Iterator[bytes]:
        for head, path in zip(heads, (part.path for part in parts), strict=True):
            yield head
            with path.open("rb") as f:
                while block := f.read(_CHUNK):
                    on_bytes(len(block))
                    yield block
            yield b"\r\n"
        yield tail

    return blocks(), f"multipart/form-data; boundary={boundary}", length


def _trust(ca_file: Path) -> ssl.SSLContext:
    """A client context trusting only ``ca_file``; ``UsageError`` when it holds no CA."""
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot use CA file {ca_file} ({_reason(exc)})") from None


class CentralClient:
    """Calls on one central; use as a context manager."""

    def __init__(self, config: CliConfig, timeout: float = 30.0) -> None:
        self.url = config.central_url
        headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        verify = _trust(config.ca_file) if config.ca_file is not None else True
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=verify)

    def __enter__(self) -> CentralClient:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise UsageError(f"invalid central URL {self.url!r}: {_reason(exc)}") from None
        except httpx.TimeoutException:
            raise CentralUnreachable(f"central at {self.url} did not answer in time") from None
        except httpx.ConnectError as exc:
            hint = "; trust its CA with MODELFLEET_CA_FILE" if "CERTIFICATE_VERIFY_FAILED" in str(exc) else ""
            raise CentralUnreachable(f"central at {self.url} is unreachable ({_reason(exc)}){hint}") from None
        except httpx.HTTPError as exc:
            raise CentralUnreachable(f"lost the connection to central at {self.url} ({_reason(exc)})") from None

    def request(self, method: str, path: str, **kwargs: Any) -> Json:
        """One call; the decoded JSON body (None for 204), ``CliError`` otherwise."""
        with self._errors():
            response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise refusal(response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            raise CliError(f"central at {self.url} sent a response that is not JSON") from None

    def health(self) -> JsonObject:
        """``GET /healthz``."""
        return dict(self.request("GET", "/healthz"))

    def models(self) -> list[JsonObject]:
        """Every model with its version count and latest version."""
        return list(self.request("GET", "/api/v1/models"))

    def versions(self, name: str) -> list[JsonObject]:
        """One model's versions, oldest first (404 → ``CentralRefused``)."""
        return list(self.request("GET", f"/api/v1/models/{name}/versions"))

    def nodes(self) -> list[JsonObject]:
        """Registered nodes (addresses, capacity, labels, owned chunks)."""
        return list(self.request("GET", "/api/v1/nodes"))

    def membership(self) -> JsonObject:
        """Heartbeat view: state, heartbeat age, load, models and cache per node."""
        return dict(self.request("GET", "/api/v1/membership"))

    def events(self, limit: int = 100) -> list[JsonObject]:
        """The last ``limit`` fleet events, oldest first."""
        return list(self.request("GET", "/api/v1/events", params={"limit": limit}))

    def rollouts(self) -> list[JsonObject]:
        """Every rollout, newest first."""
        return list(self.request("GET", "/api/v1/rollouts"))

    def rollout(self, name: str) -> JsonObject:
        """The model's current or latest rollout."""
        return dict(self.request("GET", f"/api/v1/models/{name}/rollout"))

    def start_rollout(self, name: str, body: JsonObject) -> JsonObject:
        """Start a staged rollout of one stored version."""
        return dict(self.request("POST", f"/api/v1/models/{name}/rollouts", json=body))

    def promote(self, name: str) -> JsonObject:
        """Send a rollout in state canary to every target."""
        return dict(self.request("POST", f"/api/v1/models/{name}/rollout/promote"))

    def flip(self, name: str, at: str | None) -> JsonObject:
        """Switch a staged rollout's nodes together at ``at`` (ISO 8601; None: as soon as it reaches them)."""
        return dict(self.request("POST", f"/api/v1/models/{name}/rollout/flip", json={"at": at}))

    def retry(self, name: str, nodes: list[str] | None) -> JsonObject:
        """Count a rollout's failed nodes (all, or ``nodes``) again."""
        return dict(self.request("POST", f"/api/v1/models/{name}/rollout/retry", json={"nodes": nodes}))

    def rollback(self, name: str) -> JsonObject:
        """Send the model back to the version before its latest rollout."""
        return dict(self.request("POST", f"/api/v1/models/{name}/rollback"))

    def push(self, push: PushRequest, on_bytes: Callable[[int], None]) -> Iterator[JsonObject]:
        """Upload a model and yield central's progress events (``?progress=ndjson``) as they
        come; the last is ``{"event": "result", …}`` or ``{"event": "error", …}``."""
        body, content_type, length = multipart(push.parts(), on_bytes)
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("progress", "ndjson"),
            *(("labels", label) for label in push.labels),
        ]
        params += [("version", push.version)] if push.version else []
        params += [("keep_fp32", "true")] if push.keep_fp32 else []
        params += [("require_int8", "true")] if push.require_int8 else []
        params += [("activate", "false")] if not push.activate else []
        params += [("threshold", push.threshold)] if push.threshold is not None else []
        params += [("dim", dim) for dim in push.dims]
        headers = {"Content-Type": content_type, "Content-Length": str(length)}
        timeout = httpx.Timeout(30.0, read=None)  # quantizing a large model takes minutes between lines
        with self._errors():
            url = f"/api/v1/models/{push.name}/versions"
            with self._http.stream("POST", url, params=params, content=body, headers=headers, timeout=timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    raise refusal(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield _event(line, self.url)


def connect(central: str | None, token: str | None) -> CentralClient:
    """A client for the central named by flags, environment or config file."""
    return CentralClient(load_config(central, token))


def _event(line: str, url: str) -> JsonObject:
    try:
        event = json.loads(line)
    except ValueError:
        raise CliError(f"central at {url} sent a progress line that is not JSON: {line[:80]!r}") from None
    if not isinstance(event, dict):
        raise CliError(f"central at {url} sent an unexpected progress line: {line[:80]!r}")
    if "event" not in event and "manifest" in event:  # a central without the progress opt-in
        return {"event": "result", **event}
    return event
