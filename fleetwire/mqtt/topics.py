"""Topic names under a configurable prefix (default ``modelfleet/v1``)."""

from __future__ import annotations

from dataclasses import dataclass

from fleetwire.names import is_name

DEFAULT_PREFIX = "modelfleet/v1"


@dataclass(frozen=True)
class Topics:
    """Every topic the fleet uses, for one prefix."""

    prefix: str = DEFAULT_PREFIX

    def node_status(self, node_id: str) -> str:
        """Retained, QoS 1: birth (online) and death (offline, also the Last Will)."""
        return f"{self.prefix}/nodes/{node_id}/status"

    def node_heartbeat(self, node_id: str) -> str:
        """QoS 0, every interval."""
        return f"{self.prefix}/nodes/{node_id}/heartbeat"

    @property
    def all_status(self) -> str:
        """Subscription filter for every node's status."""
        return f"{self.prefix}/nodes/+/status"

    @property
    def all_heartbeats(self) -> str:
        """Subscription filter for every node's heartbeat."""
        return f"{self.prefix}/nodes/+/heartbeat"

    @property
    def central_status(self) -> str:
        """Retained: central's own online/offline (with its Last Will)."""
        return f"{self.prefix}/central/status"

    def central_probe(self, client_id: str) -> str:
        """QoS 0: a central's probes to itself, which measure how far behind its feed it is."""
        return f"{self.prefix}/central/probe/{client_id}"

    @property
    def events(self) -> str:
        """QoS 1: failover, rollout and placement events for dashboards."""
        return f"{self.prefix}/events"

    def node_id_of(self, topic: str) -> str | None:
        """The node id in a ``…/nodes/{id}/…`` topic, else None (also for a level that is no
        valid node id: MQTT allows any character there, a newline included, and an id from
        here ends up in logs, the dashboard and the ring)."""
        head = f"{self.prefix}/nodes/"
        if not topic.startswith(head):
            return None
        rest = topic[len(head) :].split("/")
        return rest[0] if len(rest) == 2 and is_name(rest[0]) else None
