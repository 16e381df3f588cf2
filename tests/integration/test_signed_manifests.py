"""Integrity beyond the digest, end to end with a real central and edge: an edge loads
only what central signed with the key it pinned, and a chunk file corrupted in its
cache directory is caught on read, dropped and fetched again."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from central.registry.signing import KEY_FILE
from central.server import CentralServer
from edge_node.sync.trust import PINNED_KEY_FILE
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, central_settings, push, served_version, version_state
from support.wait import wait_for


def _corrupt_cache_files(cache_dir: Path) -> int:
    """Flip one byte in every chunk file diskcache keeps (value files end in .val)."""
    files = list(cache_dir.rglob("*.val"))
    for path in files:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    return len(files)


async def _push(central: CentralServer, model: Path) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        response = await push(api, "mlp", model)
    assert response.status_code == 201, response.text
    manifest: dict[str, object] = response.json()["manifest"]
    return manifest


async def test_an_edge_loads_only_what_its_pinned_key_signed_and_refetches_corrupt_chunks(
    make_edge: EdgeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = central_settings(tmp_path / "central")
    first = CentralServer(settings)
    await first.start()
    edge = await make_edge("edge-0", first, fetch={"hot_cache_bytes": 0, "backoff_s": 0.05, "backoff_max_s": 0.5})
    v1 = build_mlp(tmp_path / "v1.onnx", width=64, hidden_layers=2)
    manifest = await _push(first, v1)
    assert manifest["signature"]
    await wait_for(lambda: version_state(edge, "mlp", "1") == "complete", what="v1 on the edge")
    assert await served_version(edge) == "1"
    assert (tmp_path / "edge-0" / PINNED_KEY_FILE).read_bytes() == first.central.signer.public_key

    # A tampered cache directory: every chunk file changed on disk. The same bytes pushed
    # as version 2 are cache hits; assembly re-hashes them, drops them and fetches again.
    assert _corrupt_cache_files(edge.settings.resolved_cache_dir) > 0
    from_origin = edge.edge.fetcher.stats.bytes_from_origin
    await _push(first, v1)
    await wait_for(lambda: version_state(edge, "mlp", "2") == "complete", what="v2 despite the corrupt cache")
    assert edge.edge.files.model_path("mlp", "2").read_bytes() == v1.read_bytes()
    assert edge.edge.fetcher.stats.bytes_from_origin - from_origin == v1.stat().st_size
    assert await served_version(edge) == "2"
    await first.stop()

    # Central comes back with another key (its key file swapped): the edge keeps its pin.
    new_key = Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    (settings.data_dir / KEY_FILE).write_bytes(new_key)
    second = CentralServer(settings.model_copy(update={"grpc_port": first.grpc_port, "http_port": 0}))
    await second.start()
    try:
        with caplog.at_level(logging.ERROR, logger="edge_node.sync.trust"):
            await wait_for(lambda: "differs from the pinned key" in caplog.text, what="the edge refusing the key")
        v3 = build_mlp(tmp_path / "v3.onnx", width=64, hidden_layers=2, head_seed=7)
        refused = await _push(second, v3)
        # The desired state naming v3 is sealed by the new key: refused whole, v3 never started.
        seen = edge.edge.follower.refusals.get("signature", 0)
        await wait_for(lambda: edge.edge.follower.refusals.get("signature", 0) > seen, what="v3's state refused")
        assert version_state(edge, "mlp", "3") is None
        chunks = refused["chunks"]
        assert isinstance(chunks, list)
        assert not edge.edge.store.has_many(c["digest"] for c in chunks)  # not one chunk of it fetched
        assert await served_version(edge) == "2"  # the previous version keeps serving
    finally:
        await edge.stop()
        await second.stop()
