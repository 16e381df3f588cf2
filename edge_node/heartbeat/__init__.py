"""The edge's MQTT presence: birth/death with a Last Will, and periodic heartbeats.

``HeartbeatPublisher`` composes the paho session (``session``), the birth/death state
machine (``Presence``: how ``bdseq`` and the will line up across reconnects) and the
``HeartbeatTicker``; its settings are ``edge_node.settings.HeartbeatSettings`` and
``BrokerSettings``. ``HeartbeatBody`` is what a snapshot returns, ``HeartbeatSources``
builds one from what an edge reads (the load figures come from
``edge_node.inference.LoadTracker``) and ``BdseqStore`` persists the birth/death sequence."""

from edge_node.heartbeat.bdseq import BDSEQ_FILE, BdseqStore
from edge_node.heartbeat.body import HeartbeatBody, HeartbeatSources, ModelReport
from edge_node.heartbeat.presence import Presence
from edge_node.heartbeat.publisher import HeartbeatPublisher
from edge_node.heartbeat.ticker import HeartbeatTicker

__all__ = [
    "BDSEQ_FILE",
    "BdseqStore",
    "HeartbeatBody",
    "HeartbeatPublisher",
    "HeartbeatSources",
    "HeartbeatTicker",
    "ModelReport",
    "Presence",
]
