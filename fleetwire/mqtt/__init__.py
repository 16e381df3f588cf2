"""The MQTT side of the wire contract: topic names and payload models."""

from __future__ import annotations

from fleetwire.mqtt.payloads import (
    MAX_PAYLOAD_BYTES,
    CacheInfo,
    CentralStatus,
    Event,
    Heartbeat,
    LoadInfo,
    ModelInfo,
    NodeStatus,
)
from fleetwire.mqtt.topics import DEFAULT_PREFIX, Topics

__all__ = [
    "DEFAULT_PREFIX",
    "MAX_PAYLOAD_BYTES",
    "CacheInfo",
    "CentralStatus",
    "Event",
    "Heartbeat",
    "LoadInfo",
    "ModelInfo",
    "NodeStatus",
    "Topics",
]
