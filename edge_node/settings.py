"""Edge settings: one pydantic-settings class, env prefix ``MODELFLEET_``, nested
sections with ``__`` (``MODELFLEET_FETCH__PEER_TIMEOUT_S=10``).

Every section lives here, so a reader finds all of an edge's knobs in one file, and the
modules that use a section import it from here. Of the edge's own packages this module
imports only ``edge_node.auth`` (which imports no settings), so no import cycle can form."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from edge_node.auth import CredentialError, NodeCredential
from edge_node.generation.settings import EngineSettings
from fleetwire.deprecated import adopt_moved, refuse_moved
from fleetwire.exposure import TLS_FIX, Listener
from fleetwire.mqtt.broker import MOVED_CONNECTION_FIELDS, BrokerSettings
from fleetwire.names import InvalidName, check_name
from fleetwire.tls import TlsSettings
from fleetwire.transfer import DEFAULT_SITE, TransferCaps, check_site

#: The connection fields that ``heartbeat`` had before ``broker`` (deprecated names, one release).
HEARTBEAT_MOVED_TO_BROKER = {"broker_host": "host", "broker_port": "port", **{n: n for n in MOVED_CONNECTION_FIELDS}}


def central_addresses_of(value: str) -> list[str]:
    """``"host:port"`` or ``"h1:p1,h2:p2"`` → the addresses, stripped; ValueError naming the bad
    entry otherwise. Checked at start-up because a typo would otherwise show only as an edge
    that retries a dead address for ever."""
    entries = [entry.strip() for entry in value.split(",")]
    if not any(entries):
        raise ValueError("central must be host:port (or several, comma-separated)")
    for entry in entries:
        _check_central_entry(entry, value)
    duplicates = sorted({e for e in entries if entries.count(e) > 1})
    if duplicates:
        raise ValueError(f"central lists {', '.join(duplicates)} more than once")
    return entries


def _check_central_entry(entry: str, value: str) -> None:
    """One ``host:port`` or ``[v6]:port`` of ``value``; ValueError saying what is wrong with it."""
    if not entry:
        raise ValueError(f"central {value!r} has an empty entry (a stray comma?)")
    if entry.startswith("["):
        host, sep, rest = entry[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"central entry {entry!r}: expected [v6-address]:port")
        port = rest[1:]
    else:
        host, sep, port = entry.rpartition(":")
        if not sep:
            raise ValueError(f"central entry {entry!r}: expected host:port (the port is required)")
        if ":" in host:
            raise ValueError(f"central entry {entry!r}: write an IPv6 address as [address]:port")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"central entry {entry!r}: no valid host")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"central entry {entry!r}: port must be 1-65535")


class BatchSettings(BaseModel):
    """How each model version batches its requests."""

    model_config = ConfigDict(use_attribute_docstrings=True, frozen=True)

    max_batch_size: int = Field(32, ge=1)
    """Most rows one session run takes; larger requests are split into pieces this big."""
    max_queue_delay_ms: float = Field(5.0, ge=0)
    """Longest a request waits for others to join its batch (the latency paid for throughput)."""
    max_queue_rows: int = Field(1024, ge=1)
    """Rows that may wait per version; beyond that requests fail fast with QueueFull (503)."""
    max_concurrent_batches: int = Field(1, ge=1)
    """Batches of one version running at once; 1 suits CPU (ORT already uses all cores)."""
    enabled: bool = True
    """False runs every request alone (batch size 1, no delay), e.g. for latency tests."""


class HeartbeatSettings(BaseModel):
    """How the edge announces itself over MQTT (``MODELFLEET_HEARTBEAT__*``); where the
    broker is and how to log in: the ``broker`` section."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    interval_s: float = Field(5.0, gt=0, le=3600)
    """Seconds between heartbeats."""
    enabled: bool = True
    """Publish birth, death and heartbeats at all."""
    max_queued_messages: int = Field(8, ge=1, le=1000)
    """QoS 1 messages paho may hold unacknowledged; beyond that they are refused (QoS 0
    heartbeats are never queued)."""
    stop_timeout_s: float = Field(2.0, gt=0)
    """How long ``stop()`` waits for the broker to acknowledge the offline status."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return refuse_moved(
            data, section="heartbeat", target="broker", renames=HEARTBEAT_MOVED_TO_BROKER, owner="EdgeSettings"
        )

    @property
    def default_keepalive_s(self) -> int:
        """The keep-alive when ``broker.keepalive_s`` is unset: ``max(2, ceil(2 × interval_s))``,
        so the broker publishes the will after about three missed heartbeats."""
        return max(2, math.ceil(2 * self.interval_s))


class FetchSettings(BaseModel):
    """How chunks are fetched from peers and the origin."""

    max_in_flight: int = Field(8, ge=1, le=256, description="Chunks of other owners fetched at once.")
    max_owned_in_flight: int = Field(
        4,
        ge=1,
        le=256,
        description=(
            "Chunks this node owns, fetched upstream at once, per owner rank (first owners, second owners, ...):"
            " a first-owner fetch never waits behind fetches that wait on other owners."
        ),
    )
    max_streams_per_peer: int = Field(
        8,
        ge=1,
        le=256,
        description=(
            "Chunk streams to one peer at once (the rest wait for a free one); keep it at or below the"
            " peers' limits.max_peer_streams_per_node, or they refuse the rest as busy."
        ),
    )
    peer_timeout_s: float = Field(
        30.0, gt=0, description="Deadline for one chunk from a peer (it may be fetching it itself)."
    )
    origin_timeout_s: float = Field(
        120.0, gt=0, description="Deadline for one chunk from central (its egress may be capped)."
    )
    attempts: int = Field(6, ge=1, description="Rounds over owners and origin before a chunk fetch gives up.")
    backoff_s: float = Field(
        0.2, gt=0, description="First retry delay; doubles per round, each wait jittered down to half of it."
    )
    backoff_max_s: float = Field(5.0, gt=0, description="Longest retry delay.")
    fail_after_s: float = Field(
        60.0,
        ge=0,
        description=(
            "How long a version's chunk fetches may keep failing (no peer nor central delivered, after"
            " every round) before the heartbeat reports it failed with reason network; retries go on."
        ),
    )
    hot_cache_bytes: int = Field(
        128 * 1024 * 1024, ge=0, description="Recently verified chunks kept in memory for peers and assembly."
    )
    relay_view_wait_s: float = Field(
        1.0,
        ge=0,
        description=(
            "How long a peer's request naming this node as owner of a chunk its own desired state does not list"
            " waits for that state to arrive (the requester may get its copy first); then NOT_FOUND."
        ),
    )


class ChoiceSettings(BaseModel):
    """How an edge picks which of a version's artifacts to serve."""

    model_config = ConfigDict(use_attribute_docstrings=True, frozen=True)

    enabled: bool = True
    """Time the artifacts of a version without a verdict for this node's class; False serves
    central's default artifact (or a verdict, or a pin) without timing anything."""
    budget_s: float = Field(20.0, gt=0)
    """Most seconds the timed rounds of one version take (loading the sessions comes on top)."""
    min_rounds: int = Field(3, ge=1)
    """Rounds always run, whatever the budget (one run of each candidate per batch size each)."""
    max_rounds: int = Field(15, ge=1)
    """Rounds after which timing stops even with budget left."""
    warmup_runs: int = Field(2, ge=0)
    """Untimed runs per candidate and batch size first (allocations, caches, thread start)."""
    min_speedup: float = Field(1.05, ge=1.0)
    """Speed-up over FP32 an INT8 artifact must reach at every batch size timed to be chosen
    over FP32 (above 1.0, so timing noise cannot pick an artifact that is really slower)."""
    free_dim: int = Field(32, ge=1)
    """Size given to a variable non-batch dimension (sequence length, ...) when timing."""


class InferenceSettings(BaseModel):
    """How this node runs models."""

    providers: list[str] | None = Field(
        None, description="Execution providers to use, in order (default: every one that really loads here)."
    )
    intra_op_threads: int = Field(0, ge=0, description="ONNX Runtime threads per session (0: one per core).")
    inter_op_threads: int = Field(1, ge=1, description="ONNX Runtime inter-op threads per session.")
    batching: BatchSettings = Field(default_factory=BatchSettings)
    retire_grace_s: float = Field(5.0, ge=0, description="How long a replaced version keeps answering stragglers.")
    bench_endpoints: bool = Field(False, description="Expose POST /bench/noop, the HTTP-stack baseline for benchmarks.")
    switch_interval_s: float = Field(
        0.005,
        gt=0,
        le=0.1,
        description=(
            "Python's GIL switch interval for the edge process (sys.setswitchinterval; 0.005 is Python's"
            " own). A batch's ONNX Runtime thread must win the GIL back from the event loop to hand over"
            " its outputs: with the loop saturated (before the raw ASGI inference path) 0.001 gave +40-50 %"
            " req/s, but with it the loop has idle moments and 0.001 or 0.0005 measured no better (2 CPUs)."
        ),
    )
    cpu_flags: str | None = Field(
        None,
        description=(
            "CPU flags that decide this node's hardware class (space- or comma-separated, e.g. 'avx2 avx512_vnni');"
            " default: /proc/cpuinfo's. Nodes of one class share the verdict of which artifact runs fastest."
        ),
    )
    choice: ChoiceSettings = Field(
        default_factory=ChoiceSettings, description="Timing a version's artifacts to serve the fastest here."
    )
    runtime_max_ir: int | None = Field(
        None,
        ge=7,
        description=(
            "Report at most this ONNX IR version at registration (default: the newest the installed ONNX Runtime"
            " loads, probed at start). Central then never assigns this node an artifact stamped newer: it serves one"
            " converted for it or records a per-node failure with reason runtime. Pins a fleet to an older format."
        ),
    )
    runtime_max_opset: int | None = Field(
        None,
        ge=1,
        description=(
            "Report at most this ai.onnx opset at registration (default: the newest the installed ONNX Runtime"
            " loads, probed at start); see runtime_max_ir."
        ),
    )
    shadow_sample: float = Field(
        0.01,
        ge=0,
        le=1,
        description=(
            "Share of the requests an INT8 artifact serves that are run again on the version's FP32 artifact,"
            " off the serving path, to report their agreement in the heartbeat (0: off; FP32 is then not fetched"
            " for it either). The manifest label modelfleet.drift_policy=off turns it off per version."
        ),
    )
    shadow_queue: int = Field(
        8,
        ge=1,
        le=1024,
        description="Most sampled requests waiting for their FP32 run; more are dropped (and counted), never awaited.",
    )
    shadow_cpu_share: float = Field(
        0.01,
        ge=0,
        le=1,
        description=(
            "CPU time the FP32 runs of sampled requests may take, as a share of this node's cores (0: no limit);"
            " samples beyond it are dropped and counted. FP32 of a sample can cost several times serving it."
        ),
    )


class LimitSettings(BaseModel):
    """Caps on what one client may make this node hold: each refuses with a 4xx (or a gRPC
    RESOURCE_EXHAUSTED) instead of letting a request exhaust memory."""

    max_infer_body_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Largest inference request body; larger ones get 413 before (or while) they are read.",
    )
    max_tensor_elements: int = Field(
        16 * 1024 * 1024,
        ge=1,
        description="Most elements one input tensor may declare (product of its shape); beyond it 413.",
    )
    max_peer_streams_per_node: int = Field(
        8, ge=1, description="Chunk streams one requesting node may hold open here at once (RESOURCE_EXHAUSTED beyond)."
    )
    max_peer_streams: int = Field(64, ge=1, description="Chunk streams served to all peers together at once.")
    max_inflight_infer_requests: int = Field(
        128,
        ge=1,
        description=(
            "Inference requests this node holds at once (queued or running, counted once the body has"
            " arrived); when they are all taken, 503 with Retry-After before the body is read."
        ),
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description=(
            "Time a request body must arrive in once its headers have (HTTP API); beyond it 408 and the"
            " connection is closed. Bodies being read hold no max_inflight_infer_requests place."
        ),
    )
    http_idle_timeout_s: int = Field(
        5, ge=1, description="How long an idle keep-alive HTTP connection stays open (uvicorn's timeout_keep_alive)."
    )
    grpc_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description=(
            "How long a gRPC connection with no call open stays open (Peer and inference gRPC ports);"
            " a connection that has not finished its handshake gets at most 10 s."
        ),
    )


class TransferSettings(BaseModel):
    """Byte-rate caps of this node's chunk traffic (token buckets); 0: no cap. Central's desired
    state may override each one live (``TransferLimits``); an unset one leaves these."""

    serve_bytes_per_s: int = Field(0, ge=0, description="Chunk bytes/s served to peers (seeding and relaying).")
    fetch_bytes_per_s: int = Field(0, ge=0, description="Chunk bytes/s fetched from peers and the origin together.")
    busy_serve_bytes_per_s: int = Field(
        0,
        ge=0,
        description=(
            "Chunk bytes/s served to peers while inference requests are in flight here: serving local"
            " requests comes first (0: the serve cap applies)."
        ),
    )

    def caps(self) -> TransferCaps:
        """These settings as caps (every one set)."""
        return TransferCaps(self.serve_bytes_per_s, self.fetch_bytes_per_s, self.busy_serve_bytes_per_s)


class VersionSettings(BaseModel):
    """How assembled versions on disk are checked before they are served again."""

    rehash_all: bool = Field(
        False,
        description=(
            "Re-hash every file of a complete version each time it is checked (every start), ignoring the"
            " verified records (.verified.json: size, mtime, ctime, inode and digest of each file as last"
            " verified). Off: only files whose stat changed are read, so a warm start does not read the"
            " model. On: also catches bytes that changed with no trace in the stat (bit rot, raw writes"
            " to the device), at the cost of reading the whole model at every start."
        ),
    )


class EdgeTlsSettings(TlsSettings):
    """TLS on this edge's Peer service (always mutual: a peer must show a certificate signed by
    ca_file), its HTTP API (HTTPS) and its gRPC channels to central and peers (which verify
    the server against ca_file and show cert_file). Central must run with TLS too."""

    require_client_cert: bool = Field(
        False,
        description=(
            "HTTP API: clients (central's gateway included) must show a certificate signed by ca_file."
            " The Peer service always requires one."
        ),
    )


class EdgeSettings(BaseSettings):
    """Everything one edge needs; validated at start-up."""

    model_config = SettingsConfigDict(env_prefix="MODELFLEET_", env_nested_delimiter="__", extra="ignore")

    node_id: str = Field(
        default_factory=lambda: socket.gethostname().split(".")[0], description="Unique id in the fleet."
    )
    central: str = Field(
        "127.0.0.1:50051",
        description=(
            "host:port of central's gRPC Registry, or several comma-separated (host1:port1,host2:port2): the"
            " replicas of a replicated central, or independent centrals to fail over to. The edge starts on the"
            " first and moves to the next, round-robin, when central is unreachable or its stream breaks."
            " One name behind a load balancer is one address. IPv6 as [address]:port."
        ),
    )
    node_token: SecretStr | None = Field(
        None,
        description=(
            "This node's credential for central's Registry (`modelfleet node-token create --node <id>`),"
            " sent on every call; needed when central runs with auth.nodes_required."
        ),
    )
    node_token_file: Path | None = Field(
        None, description="A file holding the node token instead (re-read when it changes); not with node_token."
    )
    grpc_host: str = Field("127.0.0.1", description="Bind address of the Peer service.")
    grpc_port: int = Field(0, ge=0, le=65535, description="Peer service port; 0 picks a free one.")
    http_host: str = Field("127.0.0.1", description="Bind address of the HTTP API.")
    http_port: int = Field(0, ge=0, le=65535, description="HTTP port; 0 picks a free one.")
    infer_grpc_port: int | None = Field(
        0,
        ge=0,
        le=65535,
        description=(
            "Port of the KServe v2 gRPC inference service (inference.GRPCInferenceService, what Triton's and"
            " KServe's gRPC clients speak), bound on http_host with the HTTP API's TLS; 0 picks a free one,"
            " null turns it off. Not the Peer port: that one is for fleet members only."
        ),
    )
    advertise_host: str | None = Field(
        None, description="Host other nodes use to reach this one; default: the bind address."
    )
    capacity: int = Field(1, ge=1, le=1000, description="Relative share of chunks this node owns as a seeder.")
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form labels announced to central.")
    site: str = Field(
        DEFAULT_SITE,
        description=(
            "Where this node is (a LAN behind one WAN link): central gives each chunk owners inside every"
            " site and this node fetches from owners in its own site first."
        ),
    )
    data_dir: Path = Field(Path("./data/edge"), description="Root of versions/ (assembled models).")
    cache_dir: Path | None = Field(
        None, description="Chunk cache, shareable by processes on one host; default data_dir/cache."
    )
    cache_bytes: int = Field(
        8 * 1024**3,
        ge=1024 * 1024,
        description=(
            "Cache size cap; a version whose chunks alone exceed it is refused (failed, the served"
            " one stays), while the pinned chunks of what is served may exceed it."
        ),
    )
    fetch: FetchSettings = Field(default_factory=FetchSettings)
    versions: VersionSettings = Field(
        default_factory=VersionSettings, description="How assembled versions are checked before serving again."
    )
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    generation: EngineSettings = Field(
        default_factory=EngineSettings,
        description=(
            "How a language-model version (manifest kind decoder) is served: continuous batch size, KV budget,"
            " prefix cache, prefill chunks, waiting queue and threads of its generation engine."
        ),
    )
    broker: BrokerSettings = Field(
        default_factory=BrokerSettings, description="The MQTT broker: where it is, the login, TLS, reconnects."
    )
    heartbeat: HeartbeatSettings = Field(
        default_factory=HeartbeatSettings, description="MQTT birth/death and heartbeats."
    )
    limits: LimitSettings = Field(default_factory=LimitSettings, description="Request, tensor and stream caps.")
    transfer: TransferSettings = Field(default_factory=TransferSettings, description="Chunk byte-rate caps.")
    tls: EdgeTlsSettings = Field(
        default_factory=EdgeTlsSettings, description="TLS on the Peer service, HTTPS and links (off by default)."
    )
    reconnect_backoff_max_s: float = Field(
        3.0,
        gt=0,
        description=(
            "Longest wait between reconnects to central (equal jitter: waits at the cap are 1.5-3 s). Edges"
            " also retry at once when central announces itself on the broker."
        ),
    )
    manifest_key_repin: bool = Field(
        False,
        description=(
            "Accept any manifest signing key from central that differs from the one pinned in data_dir"
            " (a manual, unsafe override, e.g. after central lost its key); off: a different key is taken"
            " only when central's endorsement chain leads to it from the pinned key (`modelfleet keys"
            " rotate`), else it is refused and its manifests with it."
        ),
    )
    log_level: str = Field("info", description="Python logging level name.")

    @model_validator(mode="before")
    @classmethod
    def _deprecated_names(cls, data: Any) -> Any:
        """``heartbeat.broker_host``... (one more release): moved to ``broker``, with a FutureWarning."""
        return adopt_moved(data, source="heartbeat", target="broker", renames=HEARTBEAT_MOVED_TO_BROKER)

    @field_validator("node_id")
    @classmethod
    def _valid_node_id(cls, value: str) -> str:
        try:
            return check_name("node id", value)
        except InvalidName as exc:
            raise ValueError(str(exc)) from exc

    @field_validator("infer_grpc_port", mode="before")
    @classmethod
    def _port_off(cls, value: Any) -> Any:
        """``null``/``off`` (an environment variable cannot hold None) turn the port off."""
        return None if isinstance(value, str) and value.strip().lower() in ("", "null", "none", "off") else value

    @field_validator("site")
    @classmethod
    def _valid_site(cls, value: str) -> str:
        return check_site(value)

    @field_validator("central")
    @classmethod
    def _valid_central(cls, value: str) -> str:
        central_addresses_of(value)  # every entry parses, or start-up fails here with the entry named
        return value

    @field_validator("node_token_file")
    @classmethod
    def _readable_token_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        if info.data.get("node_token") is not None:
            raise ValueError("set node_token or node_token_file, not both")
        try:
            NodeCredential(token_file=value)
        except CredentialError as exc:
            raise ValueError(str(exc)) from exc
        return value

    def listeners(
        self, http_port: int | None = None, grpc_port: int | None = None, infer_grpc_port: int | None = None
    ) -> list[Listener]:
        """The edge's listeners and what guards each (ports: the bound ones, else the
        settings'). The HTTP API and the gRPC inference service authenticate only by client
        certificate; the Peer service is mutual TLS whenever TLS is on, so one setting closes
        both of its gaps."""
        tls = self.tls
        client_cert = "MODELFLEET_TLS__REQUIRE_CLIENT_CERT=true (clients show a fleet certificate)"
        inference = []
        if self.infer_grpc_port is not None:
            inference.append(
                Listener(
                    f"edge {self.node_id} gRPC inference",
                    self.http_host,
                    self.infer_grpc_port if infer_grpc_port is None else infer_grpc_port,
                    authenticated=tls.enabled and tls.require_client_cert,
                    encrypted=tls.enabled,
                    auth_fix=client_cert,
                )
            )
        return [
            Listener(
                f"edge {self.node_id} HTTP API",
                self.http_host,
                self.http_port if http_port is None else http_port,
                authenticated=tls.enabled and tls.require_client_cert,
                encrypted=tls.enabled,
                auth_fix=client_cert,
            ),
            *inference,
            Listener(
                f"edge {self.node_id} Peer gRPC",
                self.grpc_host,
                self.grpc_port if grpc_port is None else grpc_port,
                authenticated=tls.enabled,
                encrypted=tls.enabled,
                auth_fix=TLS_FIX,
            ),
        ]

    @property
    def central_addresses(self) -> list[str]:
        """The centrals to try, in order, as gRPC targets (``host:port``)."""
        return central_addresses_of(self.central)

    @property
    def resolved_cache_dir(self) -> Path:
        """Where the chunk cache lives."""
        return self.cache_dir or self.data_dir / "cache"
