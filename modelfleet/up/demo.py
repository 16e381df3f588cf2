"""The demo model on the fleet: push the ``digits`` classifier with its calibration data
(unless central already has those bytes), wait until every edge serves it, and ask the
gateway to classify held-out digits.

Everything goes through central's public HTTP API, as an operator's script would."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from modelfleet.up.errors import UpError
from modelfleet.zoo import DigitsModel

__all__ = ["MODEL", "Accuracy", "DemoClient", "Published", "alive", "serves"]

MODEL = "digits"
_POLL_S = 0.2


@dataclass(frozen=True)
class Published:
    """The version of the demo model the fleet serves, and whether this run pushed it."""

    version: str
    pushed: bool
    artifact: str


@dataclass(frozen=True)
class Accuracy:
    """How the fleet did on held-out digits."""

    correct: int
    total: int
    requests: int
    nodes: tuple[str, ...]

    @property
    def value(self) -> float:
        """Share of correct answers."""
        return self.correct / self.total if self.total else 0.0


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _error_of(response: httpx.Response) -> str:
    try:
        return str(response.json().get("error", response.text))
    except ValueError:
        return response.text[:200]


class DemoClient:
    """Central's API, as far as the demo needs it."""

    def __init__(self, client: httpx.Client, central_url: str) -> None:
        self.client = client
        self.central_url = central_url

    def _get(self, path: str, **params: str) -> Any:
        response = self.client.get(self.central_url + path, params=params)
        if response.status_code != 200:
            raise UpError(f"GET {path} answered {response.status_code}: {_error_of(response)}")
        return response.json()

    def _version_with(self, sha256: str) -> dict[str, Any] | None:
        """The registered version whose original (FP32) upload has these bytes, if any."""
        response = self.client.get(f"{self.central_url}/api/v1/models/{MODEL}/versions")
        if response.status_code == 404:  # no version of the model yet
            return None
        if response.status_code != 200:
            raise UpError(f"listing {MODEL} versions answered {response.status_code}: {_error_of(response)}")
        for summary in response.json():
            fp32 = self._get(f"/api/v1/models/{MODEL}/versions/{summary['version']}", artifact="fp32")
            if fp32["sha256"] == sha256:
                return dict(summary)
        return None

    def publish(self, model: DigitsModel) -> Published:
        """Push the model and its calibration data, unless central has the same bytes already."""
        data = model.onnx_path.read_bytes()
        same = self._version_with(_sha256(data))
        if same is not None:
            return Published(str(same["version"]), pushed=False, artifact=str(same["artifact"]))
        files = {"file": ("model.onnx", data), "calibration": ("calibration.npz", model.calibration_path.read_bytes())}
        response = self.client.post(f"{self.central_url}/api/v1/models/{MODEL}/versions", files=files)
        if response.status_code != 201:
            raise UpError(f"central refused the {MODEL} push ({response.status_code}): {_error_of(response)}")
        manifest = response.json()["manifest"]
        return Published(str(manifest["version"]), pushed=True, artifact=str(manifest["artifact"]))

    def latest_version(self) -> str:
        """The newest version of the demo model (what edges are told to serve)."""
        versions = self._get(f"/api/v1/models/{MODEL}/versions")
        if not versions:
            raise UpError(f"central has no version of {MODEL}")
        return str(max(versions, key=lambda v: v["seq"])["version"])

    def membership(self) -> dict[str, dict[str, Any]]:
        """Central's membership view, node id → node."""
        return {n["node_id"]: n for n in self._get("/api/v1/membership")["nodes"]}

    def wait_nodes(
        self,
        node_ids: Sequence[str],
        ok: Callable[[dict[str, Any]], bool],
        what: str,
        timeout_s: float,
        check: Callable[[], None],
    ) -> None:
        """Poll membership until ``ok`` holds for every node; ``check`` raises if a child died."""
        deadline = time.monotonic() + timeout_s
        while True:
            nodes = self.membership()
            missing = [n for n in node_ids if n not in nodes or not ok(nodes[n])]
            if not missing:
                return
            check()
            if time.monotonic() > deadline:
                raise UpError(f"{', '.join(missing)} not {what} after {timeout_s:.0f} s (central's /api/v1/membership)")
            time.sleep(_POLL_S)

    def wait_routable(self, model: DigitsModel, timeout_s: float, check: Callable[[], None]) -> None:
        """Until the gateway answers one request: a replicated central routes from the shared
        liveness, which follows the heartbeats central's membership shows by a moment."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._infer(model.input_name, model.test_x[:1])
                return
            except UpError:
                check()
                if time.monotonic() > deadline:
                    raise
                time.sleep(_POLL_S)

    def measure(self, model: DigitsModel, requests: int = 6) -> Accuracy:
        """Send the held-out digits through the gateway in ``requests`` batches; count right answers."""
        correct, nodes = 0, set()
        for x, y in zip(np.array_split(model.test_x, requests), np.array_split(model.test_y, requests), strict=True):
            labels, node = self._infer(model.input_name, x)
            correct += int((labels == y).sum())
            nodes.add(node)
        return Accuracy(correct, len(model.test_y), requests, tuple(sorted(nodes)))

    def _infer(self, input_name: str, x: np.ndarray) -> tuple[np.ndarray, str]:
        tensor = {"name": input_name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
        response = self.client.post(f"{self.central_url}/v2/models/{MODEL}/infer", json={"inputs": [tensor]})
        if response.status_code != 200:
            raise UpError(f"the gateway answered {response.status_code}: {_error_of(response)}")
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        if "label" not in outputs:
            raise UpError(f"the answer has no 'label' output, only {', '.join(outputs)}")
        return np.asarray(outputs["label"]["data"]), response.headers.get("x-modelfleet-node", "?")


def serves(version: str) -> Callable[[dict[str, Any]], bool]:
    """A membership predicate: the node is alive and reports ``MODEL`` at ``version`` ready."""

    def ok(node: dict[str, Any]) -> bool:
        ready = any(
            m["name"] == MODEL and m["version"] == version and m["state"] == "ready" for m in node.get("models", [])
        )
        return node.get("state") == "alive" and ready

    return ok


def alive(node: dict[str, Any]) -> bool:
    """A membership predicate: the node heartbeats."""
    return node.get("state") == "alive"
