"""Central's MQTT transport: the consumer that feeds heartbeats, births and deaths to the
liveness tracker (``central.membership``), over the paho driver."""

from __future__ import annotations

__all__: list[str] = []
