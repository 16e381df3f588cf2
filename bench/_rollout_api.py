"""Central's and the edges' HTTP calls that ``bench.rollout`` measures with (over ``bench._fleet``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._fleet import Fleet

_POLL_S = 0.05


def push_raw(fleet: Fleet, name: str, version: str, path: Path, **params: str) -> dict[str, Any]:
    """Push ``path`` as a raw body with extra query ``params`` (``activate=false``); the answer."""
    r = fleet.client.post(
        fleet._central_url(f"/api/v1/models/{name}/versions"),
        params={"version": version, **params},
        content=path.read_bytes(),
    )
    if r.status_code != 201:
        raise fleet.fail(f"push of {name}:{version} answered {r.status_code}: {r.text[:500]}", [])
    doc: dict[str, Any] = r.json()
    return doc


def central_call(fleet: Fleet, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One call to central's REST API."""
    return fleet.client.request(method, fleet._central_url(path), **kwargs)


def rollout(fleet: Fleet, name: str) -> dict[str, Any]:
    """``GET /api/v1/models/{name}/rollout``."""
    r = central_call(fleet, "GET", f"/api/v1/models/{name}/rollout")
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def wait_rollout(
    fleet: Fleet, name: str, what: str, predicate: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """Poll the model's rollout until ``predicate`` holds; FleetError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        doc = rollout(fleet, name)
        if predicate(doc):
            return doc
        if time.monotonic() > deadline:
            raise fleet.fail(f"rollout of {name} never reached {what} within {timeout_s}s: {doc}", [])
        time.sleep(_POLL_S)


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = _POLL_S) -> float | None:
    """Poll until ``predicate()``; ``time.time()`` when it first held, None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.time()
        time.sleep(poll_s)
    return None


def events_since(fleet: Fleet, since: int | None) -> list[dict[str, Any]]:
    """Central's events numbered above ``since`` (the last 1000 when None)."""
    params: dict[str, int] = {"limit": 1000} if since is None else {"limit": 1000, "since": since}
    r = central_call(fleet, "GET", "/api/v1/events", params=params)
    r.raise_for_status()
    events: list[dict[str, Any]] = r.json()
    return events


def fetch_counters(fleet: Fleet) -> dict[str, dict[str, int]]:
    """Each edge's fetch counters (``GET /api/v1/status`` → ``fetch``)."""
    out = {}
    for node, status in fleet.statuses().items():
        fetch = status["fetch"]
        out[node] = {k: int(fetch[k]) for k in ("bytes_fetched", "bytes_from_peers", "bytes_from_origin")}
        out[node]["detours"] = sum(fetch["peer_errors"].values()) + int(fetch["origin_refusals"])
    return out


def settled_counters(fleet: Fleet, quiet_s: float = 1.0, timeout_s: float = 60.0) -> dict[str, dict[str, int]]:
    """Fetch counters once nothing was fetched anywhere for ``quiet_s`` (seeding done)."""
    last, since = fetch_counters(fleet), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        now = fetch_counters(fleet)
        if now != last:
            last, since = now, time.monotonic()
    return last


@dataclass
class SwitchWatch:
    """Polls one edge's inference in a thread and brackets when its answers changed version.

    The switch lies between the send of the last request answered by the old version and the
    receipt of the first answered by the new one (the edge answered each somewhere inside
    its request's span): ``at`` is the middle, ``bound`` half the bracket's width."""

    url: str
    body: bytes
    version: str
    start_at: float
    interval_s: float = 0.002
    last_old_sent: float | None = None
    first_new_received: float | None = None
    requests: int = 0
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin polling (from ``start_at``, wall clock) in a daemon thread."""
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait for the switch to be seen, at most ``timeout_s``; stops polling either way."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._stop.set()

    def _run(self) -> None:
        time.sleep(max(0.0, self.start_at - time.time()))
        headers = {"content-type": "application/json"}
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            while not self._stop.is_set():
                sent = time.time()
                try:
                    r = client.post(self.url, content=self.body, headers=headers)
                    answered = r.json().get("model_version") if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    answered = None
                received = time.time()
                self.requests += 1
                if answered is None:
                    self.errors += 1
                elif str(answered) == self.version:
                    self.first_new_received = received
                    return
                else:
                    self.last_old_sent = sent
                time.sleep(self.interval_s)

    @property
    def at(self) -> float | None:
        """Best estimate of the switch (wall clock), None when not bracketed."""
        if self.last_old_sent is None or self.first_new_received is None:
            return None
        return (self.last_old_sent + self.first_new_received) / 2

    @property
    def bound(self) -> float | None:
        """Half the bracket: how far the true switch may be from ``at``."""
        if self.last_old_sent is None or self.first_new_received is None:
            return None
        return (self.first_new_received - self.last_old_sent) / 2
