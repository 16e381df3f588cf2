"""Topic names under a configurable prefix (default ``modelfleet/v1``)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from fleetwire.names import is_name

DEFAULT_PREFIX = "modelfleet/v1"


def partition_of(node_id: str, partitions: int) -> int:
    """The heartbeat partition of ``node_id`` in a fleet of ``partitions`` (crc32, stable across
    processes and Python versions: central replicas and edges must agree without talking)."""
    if partitions < 1:
        raise ValueError("partitions must be at least 1")
    return zlib.crc32(node_id.encode()) % partitions


@dataclass(frozen=True)
class Topics:
    """Every topic the fleet uses, for one prefix."""

    prefix: str = DEFAULT_PREFIX
    #: A node's heartbeat partition under a replicated central (``<prefix>/p/<n>/nodes/…``);
    #: None: the plain ``<prefix>/nodes/…`` of a single central.
    partition: int | None = None

    @property
    def _nodes(self) -> str:
        return f"{self.prefix}/nodes" if self.partition is None else f"{self.prefix}/p/{self.partition}/nodes"

    def node_status(self, node_id: str) -> str:
        """Retained, QoS 1: birth (online) and death (offline, also the Last Will)."""
        return f"{self._nodes}/{node_id}/status"

    def node_heartbeat(self, node_id: str) -> str:
        """QoS 0, every interval."""
        return f"{self._nodes}/{node_id}/heartbeat"

    @property
    def all_status(self) -> str:
        """Subscription filter for every node's status (of this partition, when set)."""
        return f"{self._nodes}/+/status"

    @property
    def all_heartbeats(self) -> str:
        """Subscription filter for every node's heartbeat (of this partition, when set)."""
        return f"{self._nodes}/+/heartbeat"

    def in_partition(self, partition: int | None) -> Topics:
        """The same prefix, for ``partition`` (None: unpartitioned)."""
        return Topics(self.prefix, partition)

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
        parsed = self.parse_node_topic(topic)
        return parsed.node_id if parsed is not None else None

    def parse_node_topic(self, topic: str) -> NodeTopic | None:
        """Node id, kind (``status``/``heartbeat``/…) and partition of a node topic under this
        prefix, plain or partitioned; None for any other topic or an invalid node id."""
        head = f"{self.prefix}/"
        if not topic.startswith(head):
            return None
        rest = topic[len(head) :].split("/")
        partition: int | None = None
        if len(rest) == 5 and rest[0] == "p" and rest[1].isdigit() and len(rest[1]) <= 6:  # p/<n>/nodes/<id>/<kind>
            partition = int(rest[1])
            rest = rest[2:]
        if len(rest) != 3 or rest[0] != "nodes" or not is_name(rest[1]):
            return None
        return NodeTopic(rest[1], rest[2], partition)


@dataclass(frozen=True, slots=True)
class NodeTopic:
    """What a node topic names."""

    node_id: str
    kind: str
    partition: int | None
