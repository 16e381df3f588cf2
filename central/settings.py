"""Central's settings: one pydantic-settings class, env prefix ``MODELFLEET_``,
nested sections with ``__`` (``MODELFLEET_ORIGIN__EGRESS_BYTES_S=20000000``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from central.auth.settings import AuthSettings
from central.gateway import GatewaySettings
from central.membership.event_journal import EventLogSettings
from central.membership.mqtt_consumer import MqttSettings
from central.quantize.step import QuantizeSettings
from central.rollout.settings import RolloutSettings
from fleetwire.exposure import Listener
from fleetwire.tls import TlsSettings


class ChunkingSettings(BaseModel):
    """Content-defined chunking bounds (FastCDC). Edges dedupe across versions by digest,
    so these are fixed for the life of a registry: changing them makes new chunks."""

    avg_bytes: int = Field(1024 * 1024, ge=256, le=4 * 1024 * 1024, description="Target average chunk size.")
    min_bytes: int = Field(256 * 1024, ge=64, le=1024 * 1024, description="No chunk is smaller, except the last.")
    max_bytes: int = Field(4 * 1024 * 1024, ge=1024, le=16 * 1024 * 1024, description="No chunk is larger.")

    @model_validator(mode="after")
    def _ordered(self) -> ChunkingSettings:
        if not self.min_bytes <= self.avg_bytes <= self.max_bytes:
            raise ValueError("chunking bounds must satisfy min_bytes <= avg_bytes <= max_bytes")
        # FastCDC's observed average is its avg parameter + min (cut-point skipping); the
        # chunker passes avg - min, which FastCDC needs to lie within [min, max].
        if self.avg_bytes < 2 * self.min_bytes:
            raise ValueError("chunking.avg_bytes must be at least twice chunking.min_bytes")
        return self


class PlacementSettings(BaseModel):
    """How chunks are sharded over edges."""

    enabled: bool = Field(True, description="Off: every edge fetches every chunk from central (the naive baseline).")
    replicas: int = Field(2, ge=1, le=16, description="Owners per chunk.")
    load_factor: float = Field(
        1.25, ge=1.0, le=4.0, description="No node owns more than ceil(factor × average) chunks of a version."
    )


class OriginSettings(BaseModel):
    """Central as the origin of chunk bytes."""

    egress_bytes_s: int = Field(
        0, ge=0, description="Cap on central's chunk egress in bytes/s (token bucket); 0 = unlimited."
    )
    max_concurrent_streams: int = Field(
        4,
        ge=1,
        description=(
            "Chunk streams served at once; the rest queue, so chunks complete one after another"
            " and peers can start relaying early."
        ),
    )
    max_waiting_streams: int = Field(
        1024,
        ge=0,
        description=(
            "Chunk streams that may wait for one of the max_concurrent_streams slots; beyond them a stream is"
            " refused at once with RESOURCE_EXHAUSTED and the edge retries after its backoff (a waiting stream"
            " holds no chunk bytes, only the call)."
        ),
    )
    replaced_state_grace_s: float = Field(
        30.0,
        ge=0,
        description=(
            "With auth.nodes_required a node reads only versions and chunks of its desired state; a state"
            " central replaced still counts this long (a node fetching for it until the new one arrives)."
        ),
    )


class CentralTlsSettings(TlsSettings):
    """TLS on central's gRPC Registry and its REST/OIP gateway (HTTPS), and for the
    gateway's requests to the edges."""

    require_client_cert: bool = Field(
        False,
        description=(
            "gRPC: edges must show a certificate signed by ca_file (mutual TLS). REST stays server-only TLS:"
            " operators authenticate with bearer tokens."
        ),
    )
    edge_https: bool | None = Field(
        None,
        description=(
            "Gateway to edges over HTTPS, verified against ca_file, showing cert_file when an edge asks;"
            " default: on exactly when tls.enabled (edges with TLS serve HTTPS only)."
        ),
    )

    @model_validator(mode="after")
    def _edge_https_needs_tls(self) -> CentralTlsSettings:
        if self.edge_https and not self.enabled:
            raise ValueError("tls.edge_https needs tls.enabled (ca_file verifies the edges)")
        return self

    @property
    def edge_scheme(self) -> str:
        """URL scheme of the gateway's requests to edges."""
        on = self.enabled if self.edge_https is None else self.edge_https
        return "https" if on else "http"


class CentralSettings(BaseSettings):
    """Everything central needs; validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="MODELFLEET_", env_nested_delimiter="__", extra="ignore")

    data_dir: Path = Field(Path("./data/central"), description="SQLite database, chunk blobs and upload staging.")
    http_host: str = Field("127.0.0.1", description="REST bind address.")
    http_port: int = Field(8080, ge=0, le=65535, description="REST port; 0 picks a free one.")
    grpc_host: str = Field("127.0.0.1", description="gRPC bind address.")
    grpc_port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    max_upload_bytes: int = Field(
        16 * 1024**3,
        ge=1,
        description=(
            "Largest accepted model upload, every file of it counted (the .onnx and its external data);"
            " 413 beyond. Uploads stream to disk, so this bounds disk, not memory."
        ),
    )
    min_free_disk_bytes: int = Field(
        1024**3,
        ge=0,
        description=(
            "Free disk a push must leave on central's data filesystem; a push that would not (staging,"
            " then its chunks) is refused with 507 before or while its body arrives."
        ),
    )
    max_concurrent_uploads: int = Field(
        4,
        ge=1,
        description=(
            "Model pushes received and committed at once (each may stage up to max_upload_bytes on disk);"
            " beyond them a push gets 503 with Retry-After before its body is read."
        ),
    )
    max_json_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest JSON body of a REST write such as a rollout (413 beyond)."
    )
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    origin: OriginSettings = Field(default_factory=OriginSettings)
    quantize: QuantizeSettings = Field(default_factory=QuantizeSettings)
    mqtt: MqttSettings = Field(default_factory=MqttSettings, description="MQTT liveness: heartbeats, failover, status.")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="The OIP v2 gateway to the edges.")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="Staged rollouts: evaluation.")
    events: EventLogSettings = Field(
        default_factory=EventLogSettings, description="The event log: how many are kept, and on disk (events.sqlite3)."
    )
    auth: AuthSettings = Field(default_factory=AuthSettings, description="Operator API bearer tokens with roles.")
    tls: CentralTlsSettings = Field(
        default_factory=CentralTlsSettings, description="TLS on gRPC and HTTPS, and to the edges (off by default)."
    )
    log_level: str = Field("info", description="Python logging level name.")

    def listeners(self, http_port: int | None = None, grpc_port: int | None = None) -> list[Listener]:
        """Central's two listeners and what guards each (ports: the bound ones, else the settings').
        REST counts as authenticated with ``auth.enabled`` (writes; ``/v2`` and ``/healthz`` are
        open by design); gRPC with node tokens, or with fleet client certificates under TLS."""
        tls, auth = self.tls, self.auth
        return [
            Listener(
                "central REST API",
                self.http_host,
                self.http_port if http_port is None else http_port,
                authenticated=auth.enabled,
                encrypted=tls.enabled,
                auth_fix="MODELFLEET_AUTH__ENABLED=true and MODELFLEET_AUTH__PROTECT_READS=true",
            ),
            Listener(
                "central gRPC Registry",
                self.grpc_host,
                self.grpc_port if grpc_port is None else grpc_port,
                authenticated=auth.nodes_required or (tls.enabled and tls.require_client_cert),
                encrypted=tls.enabled,
                auth_fix="MODELFLEET_AUTH__NODES_REQUIRED=true (a node token per edge)",
            ),
        ]

    @property
    def events_kept(self) -> int:
        """Events the log keeps: ``events.kept``, else ``mqtt.events_kept`` (the older name)."""
        return self.events.kept if self.events.kept is not None else self.mqtt.events_kept
