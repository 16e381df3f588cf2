"""Central's settings: one pydantic-settings class, env prefix ``MODELFLEET_``,
nested sections with ``__`` (``MODELFLEET_ORIGIN__EGRESS_BYTES_S=20000000``).

Every section lives here, so a reader finds all of central's knobs in one file, and the
modules that use a section import it from here. This module imports nothing of central's
own (only ``fleetwire`` and pydantic): any part of central may import it without a cycle."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fleetwire.deprecated import adopt_moved, refuse_moved
from fleetwire.exposure import Listener
from fleetwire.mqtt.broker import MOVED_CONNECTION_FIELDS, BrokerSettings
from fleetwire.mqtt.payloads import MAX_PAYLOAD_BYTES
from fleetwire.names import check_name, is_name
from fleetwire.tls import TlsSettings
from fleetwire.transfer import TransferCaps, check_site

#: Where the token store lives when ``auth.tokens_file`` is not set, relative to ``data_dir``.
DEFAULT_TOKENS_FILENAME = "tokens.json"
#: Where the node credential store lives when ``auth.node_tokens_file`` is not set.
DEFAULT_NODE_TOKENS_FILENAME = "node_tokens.json"

#: How the gateway picks a node (``gateway.policy``; see ``GatewaySettings``).
Policy = Literal["least_outstanding", "affinity"]
TextPolicy = Literal["prefix", "least_outstanding"]

#: The connection fields that ``mqtt`` had before ``broker`` (deprecated names, one release).
MQTT_MOVED_TO_BROKER = {name: name for name in ("host", "port", *MOVED_CONNECTION_FIELDS)}
#: ``mqtt.events_kept`` is ``events.kept`` now.
MQTT_MOVED_TO_EVENTS = {"events_kept": "kept"}
#: Central's MQTT keep-alive when ``broker.keepalive_s`` is unset.
CENTRAL_KEEPALIVE_S = 10


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
    site_aware: bool = Field(
        True,
        description=(
            "Give each chunk owners inside every site (so it crosses each site's WAN link about once);"
            " off: one ring over the whole fleet, sites ignored (the baseline)."
        ),
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


#: Highest cap accepted (bytes/s): exact in JSON numbers, far above any link.
MAX_CAP_BYTES_PER_S = 2**53


class TransferCapSettings(BaseModel):
    """Chunk byte-rate caps for edges; unset (null): the edge's own setting, 0: no cap."""

    model_config = ConfigDict(extra="forbid")

    serve_bytes_per_s: int | None = Field(
        None, ge=0, le=MAX_CAP_BYTES_PER_S, description="Chunk bytes/s an edge serves to peers."
    )
    fetch_bytes_per_s: int | None = Field(
        None, ge=0, le=MAX_CAP_BYTES_PER_S, description="Chunk bytes/s an edge fetches (peers and central together)."
    )
    busy_serve_bytes_per_s: int | None = Field(
        None,
        ge=0,
        le=MAX_CAP_BYTES_PER_S,
        description="Chunk bytes/s an edge serves to peers while it has inference requests in flight.",
    )

    def caps(self) -> TransferCaps:
        """These caps for the desired state."""
        return TransferCaps(self.serve_bytes_per_s, self.fetch_bytes_per_s, self.busy_serve_bytes_per_s)


class TransferSettings(BaseModel):
    """Edges' chunk byte-rate caps, sent in every desired state; changeable live with
    ``PUT /api/v1/transfer`` (this section is where central starts). Per cap, a node's own
    entry wins over its site's, which wins over ``fleet``; a cap none of them sets is left
    to the edge's ``transfer`` settings."""

    model_config = ConfigDict(extra="forbid")

    fleet: TransferCapSettings = Field(default_factory=TransferCapSettings, description="Caps of every edge.")
    sites: dict[str, TransferCapSettings] = Field(
        default_factory=dict, description="Caps of the edges of one site (site name → caps)."
    )
    nodes: dict[str, TransferCapSettings] = Field(
        default_factory=dict, description="Caps of one edge (node id → caps)."
    )

    @field_validator("sites")
    @classmethod
    def _valid_sites(cls, value: dict[str, TransferCapSettings]) -> dict[str, TransferCapSettings]:
        for site in value:
            check_site(site)
        return value

    @field_validator("nodes")
    @classmethod
    def _valid_nodes(cls, value: dict[str, TransferCapSettings]) -> dict[str, TransferCapSettings]:
        for node_id in value:
            check_name("node id", node_id)
        return value


#: The INT8 recipes central knows, by name: one entry each in ``central.quantize.recipes.RECIPES``
#: (a test holds the two equal). Named here so the settings need not import the quantizer, which
#: imports them.
RECIPE_NAMES = ("int8-u8s8-qdq", "int8-s8s8-qdq", "int8-u8s8-qop", "int8-dynamic")


class TextQuantizeSettings(BaseModel):
    """How central quantizes a language model's weights and judges the candidates on text
    (``CentralSettings.quantize.text``; see ``central.quantize.llm``)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    recipes: list[str] = Field(default_factory=lambda: ["int4-b32", "int4-b128", "int8-wo"])
    """Weight-only candidates made per language-model push, in order (names from
    central.quantize.llm.recipes.TEXT_RECIPES); empty: serve the pushed weights only."""
    max_perplexity_ratio: float = Field(default=1.10, ge=1.0)
    """Ceiling of a candidate's perplexity over the reference's on held-out text, compared with
    the ratio's upper confidence bound."""
    min_greedy_agreement: float = Field(default=0.90, ge=0.0, le=1.0)
    """Floor of the share of positions where the candidate's next token (argmax) is the
    reference's, compared with its Wilson lower bound; a push's --threshold overrides it."""
    window_tokens: int = Field(default=128, ge=8, le=8192)
    """Tokens per held-out window (one forward pass each, empty KV cache); capped by the
    model's context length."""
    max_windows: int = Field(default=16, ge=2, le=4096)
    """Most held-out windows judged per candidate."""
    accuracy_level: int = Field(default=4, ge=0, le=4)
    """MatMulNBits accuracy_level: 4 computes in int8 (AVX2/AVX-512 VNNI), 0 as the model says."""

    @field_validator("recipes")
    @classmethod
    def _known_text_recipes(cls, value: list[str]) -> list[str]:
        known = ("int4-b32", "int4-b128", "int8-wo")  # central.quantize.llm.weight_only.TEXT_RECIPES
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"unknown language-model recipes {unknown}; known: {list(known)}")
        return value


class QuantizeSettings(BaseModel):
    """How central quantizes pushed models (``CentralSettings.quantize``)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    enabled: bool = True
    """Quantize every push; when off the upload is stored and served as FP32 only."""
    threshold: float = Field(default=0.97, ge=0.0, le=1.0)
    """Minimum INT8-vs-FP32 agreement, compared with each measure's lower confidence bound
    (top-1 share, cosine similarity, or 1 - relative error); a push may set its own."""
    generated_samples: int = Field(default=256, ge=1)
    """Samples to generate for the guard when the push has neither eval nor calibration data."""
    seed: int = 0
    """Seed of the generated samples, so a push's verdict is reproducible."""
    recipes: dict[Literal["cnn", "transformer", "mlp"], list[str]] = Field(default_factory=dict)
    """INT8 recipes produced per model family (cnn, transformer, mlp), in order; names from
    central.quantize.recipes.RECIPES. A family not listed gets the built-in list."""
    max_candidates: int = Field(default=3, ge=1)
    """At most this many recipes per push: each costs a quantization and a guard run."""
    small_model_bytes: int = Field(default=1024 * 1024, ge=0)
    """Models smaller than this get only the recipe fastest on central's CPU."""
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    """One-sided confidence of the lower bounds the threshold is compared with."""
    generated_max_elements: int = Field(default=16_000_000, ge=1)
    """Cap on the values of all generated guard samples (fewer samples for big inputs), though
    never fewer samples than the threshold's bound needs."""
    generated_calibration_samples: int = Field(default=64, ge=1)
    """Generated images that calibrate a CNN pushed without calibration data."""
    sequence_length: int = Field(default=32, ge=1)
    """Size of dynamic sequence dimensions in generated samples (a push's --dim overrides)."""
    image_size: int = Field(default=224, ge=1)
    """Size of dynamic height/width dimensions of generated images (a push's --dim overrides)."""
    external_data_bytes: int = Field(default=1536 * 1024 * 1024, ge=0)
    """Models larger than this (graph plus data files) are quantized into a graph plus an
    external-data file (model.onnx.data): protobuf stops at 2 GiB."""
    cpu_flags: list[str] | None = None
    """ISA flags that choose the default artifact (e.g. ["avx2"]); None reads central's
    /proc/cpuinfo. Set when the fleet's CPUs are not central's."""
    text: TextQuantizeSettings = Field(default_factory=TextQuantizeSettings)
    """Language models (decoders): weight-only INT4/INT8 candidates and the text guard."""

    @field_validator("recipes")
    @classmethod
    def _known_recipes(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        unknown = sorted({n for names in value.values() for n in names} - set(RECIPE_NAMES))
        if unknown:
            raise ValueError(f"unknown recipes {unknown}; known: {sorted(RECIPE_NAMES)}")
        return value


class MqttSettings(BaseModel):
    """Central's MQTT liveness: how node liveness is judged from births, deaths and heartbeats.
    Where the broker is and how to log in: the ``broker`` section."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    enabled: bool = True
    """Off: no MQTT at all; membership is gRPC registration and watch streams only."""
    suspect_after: float = Field(2.0, gt=0)
    """A node is suspect after this many of its heartbeat intervals without one."""
    dead_after: float = Field(3.0, gt=0)
    """A node is dead (and leaves the ring) after this many intervals without a heartbeat."""
    default_interval_s: float = Field(5.0, gt=0, le=3600)
    """Heartbeat interval assumed for a node until its first heartbeat declares its own."""
    max_payload_bytes: int = Field(MAX_PAYLOAD_BYTES, ge=1024, le=256 * 1024 * 1024)
    """Largest node message central decodes; longer ones are counted (oversized_dropped) and dropped
    unread. Set the broker's own message_size_limit too, so it never delivers them at all."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        data = refuse_moved(
            data, section="mqtt", target="broker", renames=MQTT_MOVED_TO_BROKER, owner="CentralSettings"
        )
        return refuse_moved(
            data, section="mqtt", target="events", renames=MQTT_MOVED_TO_EVENTS, owner="CentralSettings"
        )

    @model_validator(mode="after")
    def _ordered(self) -> MqttSettings:
        if self.suspect_after > self.dead_after:
            raise ValueError("mqtt.suspect_after must not exceed mqtt.dead_after")
        return self


class GatewaySettings(BaseModel):
    """The inference gateway: central forwarding OIP requests to edges that serve the model."""

    model_config = ConfigDict(use_attribute_docstrings=True, frozen=True)

    enabled: bool = True
    """Mount the gateway's /v2 inference routes on central's HTTP server."""
    grpc_port: int | None = Field(0, ge=0, le=65535)
    """Port of the gateway's KServe v2 gRPC inference service (inference.GRPCInferenceService), bound on
    http_host with the REST API's TLS (server-only: inference clients show no certificate); each call
    goes the REST gateway's way (routing, failover, limits). 0 picks a free one; null turns it off."""
    policy: Policy = "least_outstanding"
    """Routing: "least_outstanding" sends to the node with the fewest requests in flight first, ties taken in turn.
    "affinity": every request is consistently hashed to an owner node by its X-Modelfleet-Affinity-Key
    header, or without one by its model (and version). With either policy a request carrying the
    header goes to the key's owner first."""
    attempts: int = Field(3, ge=1, le=16)
    """Most nodes one request is sent to (the first try included) before the gateway answers 503."""
    deadline_s: float = Field(10.0, gt=0)
    """Time budget of one request across all its attempts; what is left bounds each attempt."""
    connect_timeout_s: float = Field(1.0, gt=0)
    """Longest wait for a TCP connection to a node; beyond it the next node is tried."""
    read_timeout_s: float = Field(2.0, gt=0)
    """Longest a node may stay silent on a request that runs no model (liveness probe, metadata);
    inference reads follow read_timeout_factor/floor/cap."""
    failure_threshold: int = Field(3, ge=1)
    """Consecutive failures (unreachable, timeout, 5xx) that open a node's circuit breaker."""
    open_s: float = Field(2.0, ge=0)
    """How long an open breaker skips its node before one trial request probes it (half-open)."""
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1)
    """Largest inference request body accepted; larger ones get 413. Bodies are held in memory."""
    text_read_timeout_s: float = Field(60.0, gt=0)
    """Longest a node may stay silent in a text stream (before its first chunk: queueing and prefill;
    then between chunks); beyond it the stream is continued on another node."""
    text_routing: TextPolicy = "prefix"
    """How text requests (completions, chat, OIP generate) choose a node: "prefix" sends a prompt where
    its leading blocks were recently sent, within a load bound; "least_outstanding" ignores the prompt and
    sends to the least loaded node, ties taken in turn (the baseline bench.generate_fleet's affinity
    section compares against). With either, a session key still pins a conversation to its node."""
    prefix_blocks_per_node: int = Field(65536, ge=1)
    """Prompt block hashes the text routing remembers per node (8 bytes each, least recently sent dropped
    first): how many recent prompts' prefixes it can match."""
    max_connections: int = Field(1024, ge=1)
    """Connections the gateway keeps open to all nodes together (HTTP/1.1 keep-alive pool)."""
    max_outstanding: int = Field(256, ge=1)
    """Inference requests the gateway holds at once (bodies being read, forwarded or retried); beyond
    them a request gets 503 with Retry-After before its body is read. Bodies are held in memory, so
    the gateway's worst case is about max_outstanding × max_body_bytes."""
    read_timeout_factor: float = Field(4.0, gt=0)
    """An inference request's read timeout is this many times its model's p99 latency (learned from the
    answers the gateway forwarded), scaled by the request's rows over the model's usual rows. Before a
    model has an answer a request may use its whole deadline_s; a request's deadline is at least its read
    timeout. A request that times out is answered 504 and not sent to another node (the node may still be
    running it). read_timeout_s bounds only requests that run no model: liveness probes and metadata."""
    read_timeout_floor_s: float = Field(5.0, gt=0)
    """The least read timeout of an inference request, whatever its model's latency."""
    read_timeout_cap_s: float = Field(120.0, gt=0)
    """The most read timeout an inference request gets from its model's latency (deadline_s still bounds it)."""
    model_timeouts: dict[str, PositiveFloat] = Field(default_factory=dict)
    """Read timeout in seconds per model name, instead of the learned one (and so that model's deadline
    is at least this long). E.g. {"resnet50": 30}."""

    @field_validator("grpc_port", mode="before")
    @classmethod
    def _port_off(cls, value: Any) -> Any:
        """``null``/``off`` (an environment variable cannot hold None) turn the port off."""
        return None if isinstance(value, str) and value.strip().lower() in ("", "null", "none", "off") else value


class RolloutSettings(BaseModel):
    """How often rollouts are evaluated and when a stalled one is reported stuck."""

    interval_s: float = Field(0.5, gt=0, le=60, description="Seconds between evaluations of in-progress rollouts.")
    stuck_after_s: float = Field(
        60.0, gt=0, description="A rollout whose nodes make no progress this long gets a rollout_stuck event."
    )
    flip_lead_s: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="A staged rollout's flip is sent this long before its instant (nodes load first).",
    )
    flip_max_clock_offset_s: float = Field(
        2.0, gt=0, description="A node whose clock is further than this from central's is refused a flip."
    )
    flip_max_clock_error_s: float = Field(
        0.1, gt=0, description="A node whose clock offset is known less precisely than this is refused a flip."
    )


class EventLogSettings(BaseModel):
    """Central's event log (membership, rollout and operator events): kept in memory for
    the API and the dashboard, and on disk (``central.sqlite3``, or PostgreSQL) so that it survives restarts."""

    kept: int = Field(
        500,
        ge=1,
        le=1_000_000,
        description="Events kept (memory and disk); the older name mqtt.events_kept is deprecated.",
    )
    persist: bool = Field(True, description="Off: the log lives in memory only and a restart starts it empty.")
    flush_interval_s: float = Field(
        0.1, gt=0, le=10, description="Events gathered this long are written in one transaction."
    )
    flush_max_events: int = Field(
        1000, ge=1, le=100_000, description="A burst of this many events is written at once, before the interval."
    )


class AuthSettings(BaseModel):
    """Bearer tokens with roles on central's REST API; per-node tokens on its gRPC Registry API.

    Off by default: ``modelfleet up``, the CLI and existing deployments use the API without
    tokens; turning it on is an explicit operator decision (``MODELFLEET_AUTH__ENABLED=true``).
    Node credentials on the gRPC Registry API are a separate switch (``nodes_required``): edges
    need a token each before it can be turned on."""

    enabled: bool = Field(False, description="Require an admin token for every write under /api/v1.")
    tokens_file: Path | None = Field(
        None, description="The hashed token store; default <data_dir>/tokens.json (see `modelfleet token`)."
    )
    protect_reads: bool = Field(
        False, description="Also require a token (any role) for reads: GET /api/v1, /metrics, the dashboard."
    )

    nodes_required: bool = Field(
        False,
        description=(
            "Require every call to the gRPC Registry API to carry a node token (`modelfleet node-token`)"
            " and to act only for the node that token is bound to."
        ),
    )
    node_tokens_file: Path | None = Field(
        None, description="The hashed node credential store; default <data_dir>/node_tokens.json."
    )

    def node_tokens_path(self, data_dir: Path) -> Path:
        """The node credential store's path for a central whose data directory is ``data_dir``."""
        return self.node_tokens_file if self.node_tokens_file is not None else data_dir / DEFAULT_NODE_TOKENS_FILENAME

    def tokens_path(self, data_dir: Path) -> Path:
        """The token store's path for a central whose data directory is ``data_dir``."""
        return self.tokens_file if self.tokens_file is not None else data_dir / DEFAULT_TOKENS_FILENAME


class StoreSettings(BaseModel):
    """Where central's state lives (registry, rollouts, events, tokens): SQLite and files in the
    data dir (the default), or a PostgreSQL database that several central replicas share."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str | None = None
    """None: SQLite (<data_dir>/central.sqlite3). postgresql://user:password@host:port/db: PostgreSQL;
    pass the password in the environment (MODELFLEET_STORE__URL), never on a command line. Logged masked."""
    pool_size: int = Field(4, ge=1, le=256)
    """PostgreSQL connections each central keeps at most."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """How long central waits for PostgreSQL at start-up (and for a pooled connection) before giving up."""
    threads: int = Field(8, ge=0, le=256)
    """Worker threads that run central's store calls off the event loop, so a slow or restarting
    database never stalls /healthz or the gateway. 0 runs them on the loop (the old behaviour;
    only bench._ha_pg_restart's baseline sets it)."""

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("store.url must be a postgresql:// URL (or unset for SQLite in the data dir)")
        return value


class HaSettings(BaseModel):
    """Replicated mode: several centrals share PostgreSQL (``store.url``) and an S3 bucket
    (``blobs.bucket``). One replica, elected with an advisory lock, places chunks and runs
    rollouts; heartbeats are split across replicas by partition (docs/architecture.md)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    replica_id: str | None = None
    """Unset: the single-process default. Set (``--replica-id``): this process is one replica of a
    replicated central; needs ``store.url``. Unique per replica, stable across restarts."""
    advertise_http: str | None = None
    """Base URL other replicas and dashboards use for this replica's REST API; default: from http_host/http_port."""
    advertise_grpc: str | None = None
    """host:port edges use for this replica's gRPC Registry; default: from grpc_host/grpc_port."""
    partitions: int = Field(64, ge=1, le=4096)
    """Heartbeat partitions (a node's is crc32(node id) mod this); every replica owns a share.
    Fixed for the life of a fleet: changing it moves every node's topic."""
    replica_ttl_s: float = Field(3.0, gt=0, le=300)
    """A replica not seen in PostgreSQL for this long counts as gone: its partitions move."""
    tick_s: float = Field(0.5, gt=0, le=30)
    """How often a replica renews its presence, checks its leadership and partitions, and re-reads
    the fleet generation (LISTEN/NOTIFY only wakes it sooner)."""

    @field_validator("replica_id")
    @classmethod
    def _replica_name(cls, value: str | None) -> str | None:
        if value is not None and not is_name(value):
            raise ValueError("replica_id must be a name: letters, digits, '.', '_' or '-', at most 128 characters")
        return value


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


class BlobSettings(BaseModel):
    """Where chunk blobs live: ``<data_dir>/blobs`` unless a bucket is set, then an S3-compatible
    object store (AWS S3, SeaweedFS, MinIO) that several centrals may share."""

    bucket: str | None = Field(None, description="S3 bucket of the chunks; unset = the local directory.")
    s3_endpoint: str | None = Field(
        None,
        description="Endpoint URL of an S3-compatible server (path-style), e.g. http://seaweedfs:8333; unset = AWS.",
    )
    prefix: str = Field("", description="Key prefix inside the bucket (chunks under <prefix>/sha256/ab/<digest>).")
    region: str = Field("us-east-1", description="Region of the bucket.")
    access_key: SecretStr | None = Field(None, description="Access key id; unset = the default credential chain.")
    secret_key: SecretStr | None = Field(None, description="Secret access key, with access_key.")
    gc_grace_s: float = Field(
        3600.0,
        ge=0,
        description=(
            "S3 only: a blob whose LastModified is younger than this is never garbage-collected, so a push"
            " on another central sharing the bucket that just stored or reused it is safe."
        ),
    )

    @model_validator(mode="after")
    def _complete(self) -> BlobSettings:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("blobs.access_key and blobs.secret_key go together")
        if self.bucket is None and (self.s3_endpoint or self.access_key is not None):
            raise ValueError("blobs.s3_endpoint and the keys need blobs.bucket")
        return self


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
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description=(
            "Time a request body (REST API and gateway) must arrive in once its headers have: beyond it 408"
            " and the connection is closed. A model push instead gets this long between two pieces."
        ),
    )
    http_idle_timeout_s: int = Field(
        5, ge=1, description="How long an idle keep-alive HTTP connection stays open (uvicorn's timeout_keep_alive)."
    )
    grpc_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description=(
            "How long a gRPC connection with no call open stays open (Registry and gateway gRPC ports);"
            " a connection that has not finished its handshake gets at most 10 s."
        ),
    )
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    origin: OriginSettings = Field(default_factory=OriginSettings)
    quantize: QuantizeSettings = Field(default_factory=QuantizeSettings)
    broker: BrokerSettings = Field(
        default_factory=BrokerSettings, description="The MQTT broker: where it is, the login, TLS, reconnects."
    )
    mqtt: MqttSettings = Field(default_factory=MqttSettings, description="MQTT liveness: heartbeats, failover, status.")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="The OIP v2 gateway to the edges.")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="Staged rollouts: evaluation.")
    events: EventLogSettings = Field(
        default_factory=EventLogSettings, description="The event log: how many are kept, and on disk (central.sqlite3)."
    )
    auth: AuthSettings = Field(default_factory=AuthSettings, description="Operator API bearer tokens with roles.")
    tls: CentralTlsSettings = Field(
        default_factory=CentralTlsSettings, description="TLS on gRPC and HTTPS, and to the edges (off by default)."
    )
    store: StoreSettings = Field(
        default_factory=StoreSettings,
        description="Metadata, rollouts, events, API tokens: SQLite/files in data_dir, or PostgreSQL (store.url).",
    )
    blobs: BlobSettings = Field(default_factory=BlobSettings, description="Where chunk blobs live (directory or S3).")
    ha: HaSettings = Field(default_factory=HaSettings, description="Replicated mode (replica id, partitions).")
    transfer: TransferSettings = Field(
        default_factory=TransferSettings, description="Edges' chunk byte-rate caps (fleet, per site, per node)."
    )
    log_level: str = Field("info", description="Python logging level name.")

    @model_validator(mode="before")
    @classmethod
    def _deprecated_names(cls, data: Any) -> Any:
        """``mqtt.host``... and ``mqtt.events_kept`` (one more release): moved, with a FutureWarning."""
        data = adopt_moved(data, source="mqtt", target="broker", renames=MQTT_MOVED_TO_BROKER)
        return adopt_moved(data, source="mqtt", target="events", renames=MQTT_MOVED_TO_EVENTS)

    @model_validator(mode="after")
    def _replicas_share_a_store(self) -> CentralSettings:
        if self.ha.replica_id is not None and self.store.url is None:
            raise ValueError("ha.replica_id needs store.url: replicas share PostgreSQL")
        return self

    def listeners(
        self, http_port: int | None = None, grpc_port: int | None = None, infer_grpc_port: int | None = None
    ) -> list[Listener]:
        """Central's listeners and what guards each (ports: the bound ones, else the settings').
        REST counts as authenticated with ``auth.enabled`` (writes; ``/v2`` and ``/healthz`` are
        open by design), and so does the gateway's gRPC inference port (all of it is what REST's
        ``/v2`` is); the Registry with node tokens, or with fleet client certificates under TLS."""
        tls, auth = self.tls, self.auth
        gateway = []
        if self.gateway.enabled and self.gateway.grpc_port is not None:
            gateway.append(
                Listener(
                    "central gRPC inference gateway",
                    self.http_host,
                    self.gateway.grpc_port if infer_grpc_port is None else infer_grpc_port,
                    authenticated=auth.enabled,
                    encrypted=tls.enabled,
                    auth_fix="MODELFLEET_AUTH__ENABLED=true (it is open by design, as REST /v2 is)",
                )
            )
        return [
            Listener(
                "central REST API",
                self.http_host,
                self.http_port if http_port is None else http_port,
                authenticated=auth.enabled,
                encrypted=tls.enabled,
                auth_fix="MODELFLEET_AUTH__ENABLED=true and MODELFLEET_AUTH__PROTECT_READS=true",
            ),
            *gateway,
            Listener(
                "central gRPC Registry",
                self.grpc_host,
                self.grpc_port if grpc_port is None else grpc_port,
                authenticated=auth.nodes_required or (tls.enabled and tls.require_client_cert),
                encrypted=tls.enabled,
                auth_fix="MODELFLEET_AUTH__NODES_REQUIRED=true (a node token per edge)",
            ),
        ]
