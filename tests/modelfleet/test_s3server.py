"""The S3 server the tests and ``modelfleet up --ha`` start (SeaweedFS's ``weed mini``): it
listens on loopback only, checks SigV4 signatures, and keeps its objects across a SIGKILL."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from modelfleet.up.s3server import S3Server


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                ip = ".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)) if width == 8 else address
                found.add((ip, int(port, 16)))
    return found


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads the listening sockets from /proc")
def test_every_port_is_on_loopback_and_the_s3_port_is_the_endpoint(s3_server: S3Server) -> None:
    assert s3_server.child is not None
    pid = s3_server.child.pid
    # master, volume, filer, S3 and admin (up last, just after S3), each with its gRPC port
    deadline = time.monotonic() + 10
    while len(listening := _listening(pid)) < 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(listening) >= 10, listening
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
    assert ("127.0.0.1", s3_server.port) in listening


def test_objects_survive_a_sigkill_and_a_wrong_key_is_refused(s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    blobs = {f"k{i}": os.urandom(n) for i, n in enumerate((0, 1, 70_000, 3_000_000))}
    for key, data in blobs.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)

    s3_server.restart()  # SIGKILL, then the same ports and data dir
    # writes after the restart land beside the old objects, never over them
    blobs |= {f"after{i}": os.urandom(n) for i, n in enumerate((10, 500_000))}
    for key in ("after0", "after1"):
        client.put_object(Bucket=bucket, Key=key, Body=blobs[key])

    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted(blobs)
    for key, data in blobs.items():
        back = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert hashlib.sha256(back).hexdigest() == hashlib.sha256(data).hexdigest(), key

    import boto3
    from botocore.exceptions import ClientError

    wrong = boto3.client(
        "s3", endpoint_url=s3_server.endpoint, aws_access_key_id="modelfleet-test",
        aws_secret_access_key="not-the-secret", region_name="us-east-1",
    )  # fmt: skip
    with pytest.raises(ClientError) as refused:
        wrong.get_object(Bucket=bucket, Key="k1")
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
