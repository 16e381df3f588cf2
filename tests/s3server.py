"""A real S3 server process on loopback for the blob-store tests: moto's standalone server
(``python -m moto.server``, a Werkzeug HTTP server speaking the S3 REST API with SigV4).

SeaweedFS was the first choice but is neither packaged for Debian here nor on PyPI; moto's
server installs with pip (the dev extra) and is a separate process reached over HTTP, so the
store's client, signing and error handling are exercised as against any S3 endpoint. No
pytest here: the fixtures live in ``conftest.py``."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from types import TracebackType
from typing import Any

import boto3
import httpx

from modelfleet.up.ports import free_port

ACCESS_KEY = "modelfleet-test"
SECRET_KEY = "modelfleet-test-secret"
REGION = "us-east-1"


class S3Server:
    """``python -m moto.server`` on a free loopback port, stopped on exit."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> S3Server:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"the S3 server exited with {self._process.returncode}")
            try:
                httpx.get(self.endpoint, timeout=1.0)
                return self
            except httpx.TransportError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the S3 server did not answer on {self.endpoint} within 30 s")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def client(self) -> Any:
        """A boto3 client: the tests' own view of the bucket (create, corrupt, inspect)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def new_bucket(self) -> str:
        """A fresh empty bucket, so tests sharing the server never see each other's blobs."""
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
