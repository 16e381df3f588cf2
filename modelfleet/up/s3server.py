"""A real S3 server process on loopback: moto's standalone server (``python -m moto.server``,
a Werkzeug HTTP server speaking the S3 REST API with SigV4), in memory, gone when it stops.

``modelfleet up --ha`` gives its central replicas one bucket on it, as a fleet would share
AWS S3 or SeaweedFS; the blob-store tests (fixtures in ``tests/conftest.py``) get a bucket
per test. SeaweedFS was the first choice but is neither packaged for Debian here nor on PyPI;
moto's server installs with pip (the ``ha`` extra) and is a separate process reached over
HTTP, so central's client, signing and error handling are exercised as against any S3
endpoint. It runs as a ``Child``: tied to our life, its output in a log, stopped like the
fleet's other processes."""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from modelfleet.extras import require_extra
from modelfleet.up.children import Child, ChildError, ChildGroup
from modelfleet.up.ports import HOST, free_port

__all__ = ["ACCESS_KEY", "REGION", "S3_SERVER", "SECRET_KEY", "S3Server"]

#: Modules of the ``ha`` extra the server and its bucket set-up need.
S3_SERVER = ("moto", "flask", "boto3")
#: moto accepts any keys; fixed ones keep the settings short and the logs readable.
ACCESS_KEY = "modelfleet-test"
SECRET_KEY = "modelfleet-test-secret"
REGION = "us-east-1"
_READY_TIMEOUT_S = 30.0


class S3Server:
    """``python -m moto.server`` on a free loopback port.

    ``start(group)`` runs it as one of ``group``'s children (``modelfleet up``); ``with
    S3Server()`` runs it in a group of its own with logs in a temp dir (the tests)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self._own: ChildGroup | None = None
        self._group: ChildGroup | None = None
        self.child: Child | None = None
        self._buckets: list[str] = []

    def start(self, group: ChildGroup, timeout_s: float = _READY_TIMEOUT_S) -> S3Server:
        """Spawn the server in ``group`` and wait until it answers HTTP; UpError (a ChildError) if not."""
        require_extra("ha", "an S3 server for modelfleet up --ha", S3_SERVER)
        argv = ["-m", "moto.server", "-H", HOST, "-p", str(self.port)]
        self._group = group
        self.child = group.spawn("s3", [sys.executable, *argv])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.child.alive():
                raise self.child.died("before it answered")
            try:
                httpx.get(self.endpoint, timeout=1.0)
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise ChildError(
            f"the S3 server did not answer on {self.endpoint} within {timeout_s:.0f} s (log: {self.child.log_path})",
            self.child,
        )

    def restart(self) -> list[str]:
        """Kill the server and start it again on the same port (the fault suite). moto keeps
        objects in memory, so the buckets come back empty: they are made again, by name."""
        assert self.child is not None and self._group is not None, "start the server first"
        self.child.kill()
        self.start(self._group)
        client = self.client()
        for name in self._buckets:
            client.create_bucket(Bucket=name)
        return list(self._buckets)

    def __enter__(self) -> S3Server:
        self._own = ChildGroup(Path(tempfile.mkdtemp(prefix="modelfleet-s3-")))
        try:
            return self.start(self._own)
        except BaseException:
            self._own.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._own is not None:
            self._own.stop()

    def client(self) -> Any:
        """A boto3 client: to make buckets, and the tests' own view of one (inspect, corrupt)."""
        import boto3  # the ha extra; imported here so that a core install imports this module

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def new_bucket(self) -> str:
        """A fresh empty bucket, so users of one server never see each other's blobs."""
        name = f"chunks-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        self._buckets.append(name)
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
