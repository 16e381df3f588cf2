"""Whether this central can take traffic, and which replicas there are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from central.fleet_mode import FleetMode
from central.mqtt.consumer import MembershipConsumer
from central.storage.offload import StoreCalls


class HealthHandlers:
    """``/readyz`` and ``/api/v1/replicas``."""

    def __init__(
        self,
        store_reachable: Callable[[], bool],
        consumer: MembershipConsumer | None,
        mode: FleetMode,
        calls: StoreCalls,
    ) -> None:
        """``calls``: where the store check runs (a worker thread: it may wait for the pool)."""
        self._store_reachable = store_reachable
        self._calls = calls
        self._consumer = consumer
        self._mode = mode

    async def readiness(self) -> dict[str, Any]:
        """The store, the broker link (when MQTT is on) and the fleet mode's own checks."""
        checks: dict[str, bool] = {"store": await self._calls(self._store_reachable)}
        if self._consumer is not None:
            checks["broker"] = self._consumer.connected
        mode_checks, body = self._mode.readiness()
        checks.update(mode_checks)
        body["checks"] = checks
        body["ready"] = all(checks.values())
        return body

    def replicas(self) -> dict[str, Any]:
        """The live replicas of a replicated central, or this one process."""
        return self._mode.replicas()
