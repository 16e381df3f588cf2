"""Key rotation with endorsement, end to end: central rotates its manifest key offline
(``modelfleet keys rotate``) and restarts; an edge pinned to the old key follows the
endorsement to the new one and keeps serving, an edge pinned to an unrelated key does not."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from central.server import CentralServer
from edge_node.sync.trust import PINNED_KEY_FILE
from fleetwire.manifest import Manifest
from fleetwire.signing import fingerprint, verify_manifest
from modelfleet.cli import main
from modelfleet.zoo import build_mlp
from support.fleet import EdgeFactory, central_settings, push, served_version, version_state
from support.wait import wait_for


async def _push(central: CentralServer, model: Path) -> Manifest:
    async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
        response = await push(api, "mlp", model)
    assert response.status_code == 201, response.text
    return Manifest.model_validate(response.json()["manifest"])


async def test_an_edge_follows_a_rotated_key_and_an_edge_pinned_to_another_key_is_refused(
    make_edge: EdgeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # Placement off: every edge fetches from the origin, so the refusing edge is no owner in the way.
    settings = central_settings(tmp_path / "central", placement={"enabled": False})
    first = CentralServer(settings)
    await first.start()
    key1 = first.central.signer.public_key
    follower = await make_edge("edge-0", first)
    await _push(first, build_mlp(tmp_path / "v1.onnx", width=64, hidden_layers=2))
    await wait_for(lambda: version_state(follower, "mlp", "1") == "complete", what="v1 on the edge")
    await first.stop()

    assert main(["keys", "rotate", "--data-dir", str(settings.data_dir)]) == 0
    capsys.readouterr()
    assert main(["keys", "show", "--json", "--data-dir", str(settings.data_dir)]) == 0
    shown = json.loads(capsys.readouterr().out)
    key2 = bytes.fromhex(shown["current"]["public_key"])
    assert key2 != key1
    assert shown["endorsements"][0]["old"] == fingerprint(key1)
    assert shown["retired_private_keys"] == [f"{fingerprint(key1)}.key"]

    second = CentralServer(settings.model_copy(update={"grpc_port": first.grpc_port, "http_port": 0}))
    await second.start()
    try:
        assert second.central.signer.public_key == key2
        pin = tmp_path / "edge-0" / PINNED_KEY_FILE
        await wait_for(lambda: pin.read_bytes() == key2, what="the edge re-pinning the endorsed key")
        assert version_state(follower, "mlp", "1") == "complete"  # v1, re-signed with key 2, still holds

        unrelated = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        (tmp_path / "edge-1").mkdir()
        (tmp_path / "edge-1" / PINNED_KEY_FILE).write_bytes(unrelated)
        with caplog.at_level(logging.ERROR, logger="edge_node.sync.trust"):
            stranger = await make_edge("edge-1", second)
            await wait_for(lambda: "not endorsed by it" in caplog.text, what="the other edge refusing key 2")

        v2 = await _push(second, build_mlp(tmp_path / "v2.onnx", width=64, hidden_layers=2, head_seed=7))
        verify_manifest(v2, key2)
        await wait_for(lambda: version_state(follower, "mlp", "2") == "complete", what="v2 on the following edge")
        # Complete files come before the swap (its session loads first: seconds on a loaded machine).
        served, deadline = await served_version(follower), time.monotonic() + 30
        while served != "2" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            served = await served_version(follower)
        assert served == "2"
        # Every state key 2 seals is refused by the other edge: v2 never starts there.
        await wait_for(lambda: stranger.edge.follower.refusals.get("signature", 0) >= 2, what="v2 refused there")
        assert version_state(stranger, "mlp", "2") is None and stranger.edge.follower.state is None
        assert not stranger.edge.store.has_many(c.digest for c in v2.chunks)
        assert (tmp_path / "edge-1" / PINNED_KEY_FILE).read_bytes() == unrelated
    finally:
        await second.stop()
