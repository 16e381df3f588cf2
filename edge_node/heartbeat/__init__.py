"""The edge's MQTT presence: birth/death with a Last Will, and periodic heartbeats.

``HeartbeatPublisher`` (see ``publisher.py`` for how ``bdseq`` and the will line up
across reconnects; its settings are ``edge_node.settings.HeartbeatSettings`` and
``BrokerSettings``), the ``HeartbeatBody`` a snapshot returns, ``HeartbeatSources`` to
build one from what an edge reads (the load figures come from
``edge_node.inference.LoadTracker``) and ``BdseqStore`` for the persisted birth/death
sequence."""

from edge_node.heartbeat.bdseq import BDSEQ_FILE, BdseqStore
from edge_node.heartbeat.body import HeartbeatBody, HeartbeatSources, ModelReport
from edge_node.heartbeat.publisher import HeartbeatPublisher

__all__ = [
    "BDSEQ_FILE",
    "BdseqStore",
    "HeartbeatBody",
    "HeartbeatPublisher",
    "HeartbeatSources",
    "ModelReport",
]
