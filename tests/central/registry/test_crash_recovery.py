"""SIGKILL central in the middle of a push, restart it on the same data directory,
and check the registry's promise: a version is either all there or not there at all.

Central runs as a real subprocess (``python -m modelfleet central``) so that the kill
is a real one: no ``finally`` blocks, no shutdown hooks, half-written files left as
they are."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelfleet.zoo import build_mlp

pytestmark = pytest.mark.fleet  # central as a process, SIGKILLed mid-push

REPO = Path(__file__).resolve().parents[3]
READY = re.compile(r"central ready http=(\S+) grpc=(\S+)")
CHUNK_ENV = {
    "MODELFLEET_CHUNKING__AVG_BYTES": "65536",
    "MODELFLEET_QUANTIZE__ENABLED": "false",
    "MODELFLEET_CHUNKING__MIN_BYTES": "16384",
    "MODELFLEET_CHUNKING__MAX_BYTES": "262144",
    "MODELFLEET_LOG_LEVEL": "warning",
}


# --------------------------------------------------------------------------- central as a process


class CentralProcess:
    """One ``modelfleet central`` subprocess; output goes to files in ``logs``."""

    def __init__(self, data_dir: Path, logs: Path, tag: str) -> None:
        self.data_dir = data_dir
        logs.mkdir(parents=True, exist_ok=True)
        self.stdout_path = logs / f"{tag}.out"
        self.stderr_path = logs / f"{tag}.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 60.0) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELFLEET_")}
        env.update(CHUNK_ENV)
        cmd = [
            sys.executable, "-m", "modelfleet", "central",
            "--data-dir", str(self.data_dir), "--http-port", "0", "--grpc-port", "0",
        ]  # fmt: skip
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=REPO)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = READY.search(self.stdout_path.read_text(errors="replace"))
            if match:
                self.url = match.group(1)
                return self.url
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"central did not become ready; stderr:\n{self.stderr_path.read_text(errors='replace')}")

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, falling back to SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=15)
        self.kill()


@contextmanager
def central_process(data_dir: Path, logs: Path, tag: str) -> Iterator[CentralProcess]:
    process = CentralProcess(data_dir, logs, tag)
    try:
        process.start()
        yield process
    finally:
        process.stop()


class Push(threading.Thread):
    """A raw-body push with a chunked (no Content-Length) body, paced by ``delay``."""

    def __init__(self, url: str, name: str, version: str, data: bytes, piece: int, delay: float) -> None:
        super().__init__(daemon=True)
        self.url, self.name, self.version = url, name, version
        self.data, self.piece, self.delay = data, piece, delay
        self.sent = 0
        self.exhausted = threading.Event()
        self.cancel = threading.Event()
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None

    def body(self) -> Iterator[bytes]:
        for start in range(0, len(self.data), self.piece):
            if self.cancel.is_set():
                return
            block = self.data[start : start + self.piece]
            yield block
            self.sent += len(block)
            if self.delay:
                time.sleep(self.delay)
        self.exhausted.set()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=120.0) as client:
                self.response = client.post(
                    f"/api/v1/models/{self.name}/versions", params={"version": self.version}, content=self.body()
                )
        except BaseException as exc:  # the server dies under it: that is the point
            self.error = exc

    def finish(self) -> None:
        self.cancel.set()
        self.join(timeout=60)
        assert not self.is_alive(), "the push thread did not end"


# --------------------------------------------------------------------------- checks


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_path(data_dir: Path, digest: str) -> Path:
    return data_dir / "blobs" / "sha256" / digest[:2] / digest


def staging_files(data_dir: Path) -> list[str]:
    staging = data_dir / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def temp_blob_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "blobs").rglob(".tmp-*"))


def push_whole(url: str, name: str, version: str, data: bytes) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=120.0) as client:
        r = client.post(f"/api/v1/models/{name}/versions", params={"version": version}, content=data)
    assert r.status_code == 201, r.text
    return r.json()["manifest"]


def assert_version_complete(data_dir: Path, manifest: dict[str, Any], expected: bytes) -> None:
    """Every blob of the version is present, hashes to its digest, and they reassemble the file."""
    assert manifest["sha256"] == sha256(expected)
    assert manifest["size"] == len(expected)
    assembled = bytearray()
    for chunk in manifest["chunks"]:
        path = blob_path(data_dir, chunk["digest"])
        assert path.is_file(), f"blob {chunk['digest']} of {manifest['name']}:{manifest['version']} is missing"
        blob = path.read_bytes()
        assert sha256(blob) == chunk["digest"], f"blob {chunk['digest']} is corrupt"
        assert len(blob) == chunk["size"]
        assembled += blob
    assert bytes(assembled) == expected


def registry_state(url: str, name: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Listed versions of ``name`` and each one's manifest."""
    with httpx.Client(base_url=url, timeout=30.0) as client:
        listed = client.get(f"/api/v1/models/{name}/versions")
        if listed.status_code == 404:
            return [], {}
        assert listed.status_code == 200, listed.text
        versions = [v["version"] for v in listed.json()]
        manifests = {}
        for v in versions:
            r = client.get(f"/api/v1/models/{name}/versions/{v}")
            assert r.status_code == 200, r.text
            manifests[v] = r.json()
    return versions, manifests


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


# --------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("crash-models")
    return {
        "v1": build_mlp(root / "v1.onnx", width=384, hidden_layers=4).read_bytes(),
        "v2": build_mlp(root / "v2.onnx", width=384, hidden_layers=4, head_seed=1).read_bytes(),
        "big": build_mlp(root / "big.onnx", width=1024, hidden_layers=7).read_bytes(),
    }


# --------------------------------------------------------------------------- tests


def test_kill_during_upload_leaves_the_previous_version_intact(tmp_path: Path, models: dict[str, bytes]) -> None:
    data_dir, logs = tmp_path / "central", tmp_path / "logs"
    v1_bytes, v2_bytes = models["v1"], models["v2"]

    with central_process(data_dir, logs, "first") as central:
        v1 = push_whole(central.url, "mlp", "1", v1_bytes)
        assert_version_complete(data_dir, v1, v1_bytes)

        # ~2.7 MB in 32 KiB pieces, 20 ms apart: the upload takes well over a second.
        slow = Push(central.url, "mlp", "2", v2_bytes, piece=32 * 1024, delay=0.02)
        slow.start()
        try:
            wait_until(lambda: slow.sent >= len(v2_bytes) // 4, 60, "a quarter of the upload to be sent")

            def staged_bytes() -> int:
                files = list((data_dir / "staging").glob("upload-*"))
                return sum(f.stat().st_size for f in files)

            wait_until(lambda: staged_bytes() > 0, 30, "central to start writing the upload to staging")
            central.kill()
            assert not slow.exhausted.is_set(), "the kill was meant to land mid-upload"
        finally:
            slow.finish()
        assert slow.response is None or slow.response.status_code != 201, "a killed push must not succeed"
        # The crash left the partial upload behind (the restart must clean it up).
        assert staging_files(data_dir), "expected a partial staging file after SIGKILL"

    with central_process(data_dir, logs, "second") as central:
        versions, manifests = registry_state(central.url, "mlp")
        assert versions == ["1"]
        assert manifests["1"] == v1
        assert_version_complete(data_dir, manifests["1"], v1_bytes)
        with httpx.Client(base_url=central.url, timeout=30.0) as client:
            r = client.get("/api/v1/models/mlp/versions/2")
            assert r.status_code == 404, r.text
            assert isinstance(r.json()["error"], str)
            models_listed = client.get("/api/v1/models").json()
        assert [(m["name"], m["versions"], m["latest"]) for m in models_listed] == [("mlp", 1, "1")]
        assert staging_files(data_dir) == []
        assert temp_blob_files(data_dir) == []

        # The interrupted version can be pushed again, and both are whole.
        v2 = push_whole(central.url, "mlp", "2", v2_bytes)
        assert v2["version"] == "2"
        assert_version_complete(data_dir, v2, v2_bytes)
        assert_version_complete(data_dir, v1, v1_bytes)
        assert registry_state(central.url, "mlp")[0] == ["1", "2"]

    # And it all survives a third (clean) restart.
    with central_process(data_dir, logs, "third") as central:
        versions, manifests = registry_state(central.url, "mlp")
        assert versions == ["1", "2"]
        assert_version_complete(data_dir, manifests["1"], v1_bytes)
        assert_version_complete(data_dir, manifests["2"], v2_bytes)


@pytest.mark.parametrize("delay_s", [0.05, 0.15, 0.3, 0.6, 3.0])
def test_kill_while_chunking_or_committing_is_all_or_nothing(
    tmp_path: Path, models: dict[str, bytes], delay_s: float
) -> None:
    data_dir, logs = tmp_path / "central", tmp_path / "logs"
    v1_bytes, big = models["v1"], models["big"]
    assert len(big) > 25_000_000

    with central_process(data_dir, logs, "first") as central:
        v1 = push_whole(central.url, "mlp", "1", v1_bytes)
        blobs_before = {p.name for p in (data_dir / "blobs").rglob("*") if p.is_file()}

        fast = Push(central.url, "mlp", "2", big, piece=1024 * 1024, delay=0.0)
        fast.start()
        try:
            assert fast.exhausted.wait(timeout=60), "the upload did not finish sending"
            time.sleep(delay_s)
            central.kill()
        finally:
            fast.finish()
        acknowledged = fast.response is not None and fast.response.status_code == 201
        blobs_after_kill = {p.name for p in (data_dir / "blobs").rglob("*") if p.is_file()}
        phase = (
            f"acknowledged={acknowledged}, staging={staging_files(data_dir)}, "
            f"new blob files={len(blobs_after_kill - blobs_before)}"
        )

    with central_process(data_dir, logs, "second") as central:
        versions, manifests = registry_state(central.url, "mlp")
        assert versions in (["1"], ["1", "2"]), (versions, phase)
        assert manifests["1"] == v1
        assert_version_complete(data_dir, manifests["1"], v1_bytes)
        if acknowledged:
            assert versions == ["1", "2"], f"a 201 was answered, so v2 must survive ({phase})"
        if "2" in manifests:
            assert_version_complete(data_dir, manifests["2"], big)
        else:
            with httpx.Client(base_url=central.url, timeout=30.0) as client:
                assert client.get("/api/v1/models/mlp/versions/2").status_code == 404
        assert staging_files(data_dir) == []
        assert temp_blob_files(data_dir) == []

        # Whatever the kill hit, the registry takes pushes again.
        if "2" not in manifests:
            v2 = push_whole(central.url, "mlp", "2", big)
            assert_version_complete(data_dir, v2, big)
        v3 = push_whole(central.url, "mlp", "3", models["v2"])
        assert_version_complete(data_dir, v3, models["v2"])
        assert registry_state(central.url, "mlp")[0] == ["1", "2", "3"]
