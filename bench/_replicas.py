"""A replicated central as subprocesses: N ``modelfleet central --replica-id …`` on one
PostgreSQL, S3 bucket and broker, and edges that know every replica's address. Used by
``bench.central_ha`` and the replica fault tests (a subclass of ``bench._fleet.Fleet``: the
same logs, tails and clean-up)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from bench._fleet import Fleet, Proc
from modelfleet.up.services import CENTRAL_READY, central_args


def replica_env(
    *, store_url: str, blob_env: Mapping[str, str], broker: tuple[str, int], partitions: int, tick_s: float = 0.5
) -> dict[str, str]:
    """Environment of every replica: the shared store, bucket (``S3Server.blob_env``) and broker."""
    return {
        **blob_env,
        "MODELFLEET_STORE__URL": store_url,
        "MODELFLEET_MQTT__ENABLED": "true",
        "MODELFLEET_BROKER__HOST": broker[0],
        "MODELFLEET_BROKER__PORT": str(broker[1]),
        "MODELFLEET_BROKER__RECONNECT_MAX_S": "1.0",
        "MODELFLEET_HA__PARTITIONS": str(partitions),
        "MODELFLEET_HA__TICK_S": str(tick_s),
        # A write while PostgreSQL is away answers 503 within seconds, not after the default 10.
        "MODELFLEET_STORE__CONNECT_TIMEOUT_S": "3",
    }


class ReplicatedFleet(Fleet):
    """Replicas ``r0…`` plus edges; ``central`` is always a live replica (for REST calls)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replicas: dict[str, Proc] = {}
        #: Replicas this fleet SIGKILLed on purpose (not counted as processes that died).
        self.killed: set[str] = set()

    def _procs(self) -> list[Proc]:
        return [*self.edges.values(), *self.replicas.values()]

    def _check_alive(self) -> None:
        dead = [p for p in self._procs() if not p.alive() and p.name not in self.killed]
        if dead:
            raise self.fail(f"process(es) died: {', '.join(p.name for p in dead)}", dead)

    def stop(self) -> None:
        """Edges first, then the replicas (``Fleet.stop`` stops ``central`` last)."""
        live = [p for p in self.replicas.values() if p is not self.central]
        self._terminate([p for p in self.edges.values()])
        self._terminate(live)
        super().stop()

    def start_replicas(self, count: int) -> list[Proc]:
        """Start ``count`` replicas at once, each on its own data dir and free ports."""
        assert self.dir is not None, "use the fleet inside a with block"
        started = []
        for i in range(len(self.replicas), len(self.replicas) + count):
            started.append(self.start_replica(f"r{i}", wait_ready=False))
        self._wait_ready(started, CENTRAL_READY)
        self.central = self.central or started[0]
        return started

    def start_replica(self, replica_id: str, *, wait_ready: bool = True, http_port: int = 0) -> Proc:
        """Start (or restart, on its data dir) one replica."""
        assert self.dir is not None, "use the fleet inside a with block"
        self.killed.discard(replica_id)
        data_dir = self.dir / "replicas" / replica_id
        args = [*central_args(data_dir, http_port, 0), "--replica-id", replica_id]
        proc = self._spawn(replica_id, args, self.central_env, data_dir)
        self.replicas[replica_id] = proc
        if wait_ready:
            self._wait_ready([proc], CENTRAL_READY)
        return proc

    def kill_replica(self, replica_id: str) -> float:
        """SIGKILL one replica; returns when (``time.time()``) it died. ``central`` moves on."""
        proc = self.replicas[replica_id]
        self.killed.add(replica_id)
        proc.kill()
        killed_at = time.time()
        if self.central is proc:
            self.central = next((p for p in self.replicas.values() if p.alive()), None)
        return killed_at

    def live(self) -> list[Proc]:
        """Replicas still running."""
        return [p for p in self.replicas.values() if p.alive()]

    def addresses(self, start: int = 0) -> str:
        """Every replica's gRPC address, comma-separated (an edge's ``--central``), beginning
        with the ``start``-th (mod their number), so that edges spread over the replicas."""
        known = [p.grpc_address for p in self.replicas.values() if p.grpc_address]
        k = start % len(known) if known else 0
        return ",".join(known[k:] + known[:k])

    def readiness(self, proc: Proc) -> dict[str, Any] | None:
        """A replica's ``/readyz`` body (None when it does not answer)."""
        try:
            return dict(self.client.get(f"{proc.http_url}/readyz", timeout=2.0).json())
        except (httpx.HTTPError, ValueError):
            return None

    def leader(self) -> str | None:
        """The replica that says it leads, among the live ones (None while none does)."""
        for proc in self.live():
            body = self.readiness(proc)
            if body is not None and body.get("replica", {}).get("leader"):
                return proc.name
        return None

    def _central_for_edge(self) -> str:
        """Every replica, the n-th edge starting on the n-th (``--central a,b,c``)."""
        assert self.replicas, "start the replicas first"
        return self.addresses(len(self.edges))

    def data_dir_of(self, replica_id: str) -> Path:
        """Where a replica keeps its files."""
        assert self.dir is not None
        return self.dir / "replicas" / replica_id


def wait_until(condition: Callable[..., Any], timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Poll ``condition`` until it holds; the seconds it took. TimeoutError naming ``what``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)
    return time.monotonic() - start
