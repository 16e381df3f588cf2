"""What ``--json-status`` writes once the fleet is up: every URL and port, the pids of
the children, the demo model's version and accuracy. Written atomically (a temporary
file renamed over the target), so a script polling for the file never reads half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pydantic import BaseModel

__all__ = [
    "AccuracyStatus",
    "BrokerStatus",
    "CentralStatus",
    "EdgeStatus",
    "FleetStatus",
    "ModelStatus",
    "ReplicaStatus",
    "SecureStatus",
    "SharedStatus",
    "write",
]


class BrokerStatus(BaseModel):
    """The MQTT broker."""

    kind: str
    url: str
    host: str
    port: int
    pid: int


class CentralStatus(BaseModel):
    """Central: registry API, gateway, dashboard, metrics, gRPC."""

    http_url: str
    http_port: int
    grpc_address: str
    grpc_port: int
    dashboard_url: str
    gateway_url: str
    metrics_url: str
    pid: int


class ReplicaStatus(BaseModel):
    """One central replica of a ``--ha`` fleet."""

    replica_id: str
    http_url: str
    grpc_address: str
    healthz_url: str
    pid: int


class SharedStatus(BaseModel):
    """What ``--ha``'s replicas share: where PostgreSQL and the bucket are (no password)."""

    postgres_host: str
    postgres_port: int
    s3_endpoint: str
    bucket: str
    s3_pid: int


class EdgeStatus(BaseModel):
    """One edge."""

    node_id: str
    http_url: str
    http_port: int
    grpc_address: str
    grpc_port: int
    metrics_url: str
    pid: int


class ModelStatus(BaseModel):
    """The demo model on the fleet."""

    name: str
    version: str
    artifact: str
    pushed: bool


class AccuracyStatus(BaseModel):
    """The demo requests through the gateway."""

    correct: int
    total: int
    requests: int
    accuracy: float
    nodes: list[str]


class SecureStatus(BaseModel):
    """Where a ``--secure`` fleet's client credentials are (files, never their contents)."""

    ca_file: str
    admin_token_file: str
    client_cert_file: str
    client_key_file: str


class FleetStatus(BaseModel):
    """The whole fleet, as ``--json-status`` writes it."""

    pid: int
    data_dir: str
    broker: BrokerStatus
    central: CentralStatus
    edges: list[EdgeStatus]
    model: ModelStatus
    demo: AccuracyStatus
    secure: SecureStatus | None = None
    #: ``--ha``: every replica (``central`` is the first of them); empty otherwise.
    replicas: list[ReplicaStatus] = []
    shared: SharedStatus | None = None


def write(path: Path, status: FleetStatus) -> None:
    """Write ``status`` as JSON to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(status.model_dump_json(indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
