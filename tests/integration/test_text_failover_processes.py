"""Streams through central that survive an edge SIGKILLed in their middle, with real
processes: one Mosquitto, central and three edges (``bench._fleet.Fleet``) serving a tiny
language model. Each stream's node is killed right after its first chunk; the client reads
on and gets one stream equal, token for token and character for character, to an undisturbed
greedy run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from bench._fleet import Fleet
from bench.failover import wait_membership_ready
from support.brokers import MosquittoBroker
from support.decoder_models import build_decoder

MODEL = "chat"
EDGES = {"e0", "e1", "e2"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("text-failover")
    # Wide enough that 480 tokens take a while even on an idle machine: the kill must land mid-stream.
    folder = build_decoder(root / "tiny", peaked=True, layers=4, hidden=256)
    with MosquittoBroker() as broker:
        broker_env = {"MODELFLEET_BROKER__HOST": broker.host, "MODELFLEET_BROKER__PORT": str(broker.port)}
        central_env = {"MODELFLEET_MQTT__ENABLED": "true", "MODELFLEET_QUANTIZE__ENABLED": "false", **broker_env}
        edge_env = {"MODELFLEET_HEARTBEAT__ENABLED": "true", "MODELFLEET_HEARTBEAT__INTERVAL_S": "0.5",
                    "MODELFLEET_GENERATION__INTRA_OP_THREADS": "1", **broker_env}  # fmt: skip
        with Fleet(root=root, central_env=central_env, edge_env=edge_env) as running:
            running.start(edges=len(EDGES))
            running.push_folder(MODEL, "1", folder)
            for node in EDGES:
                running.wait_model_ready(node, MODEL, timeout_s=120)
            wait_membership_ready(running, EDGES, MODEL, 60)
            yield running


def _stream(url: str, body: dict[str, Any], kill: Fleet) -> tuple[list[int], str, str]:
    """Tokens and text of one stream through central, and the node SIGKILLed as soon as the
    answer began (central sends its status line once the edge's first token is in hand)."""
    tokens, text = [], ""
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        node = response.headers["x-modelfleet-node"]
        proc = kill.edges[node]
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(timeout=10)
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            assert "error" not in chunk, chunk
            tokens += chunk["token_ids"]
            text += chunk["choices"][0]["text"]
    return tokens, text, node


def test_streams_survive_edges_killed_mid_stream_token_for_token(fleet: Fleet) -> None:
    assert fleet.central is not None
    url = f"{fleet.central.http_url}/v1/completions"
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 480, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}  # fmt: skip
    undisturbed = fleet.client.post(url, json=body).json()
    killed = set()
    for _ in range(2):  # two of the three edges, one per stream
        tokens, text, node = _stream(url, body, fleet)
        killed.add(node)
        assert tokens == undisturbed["token_ids"] and text == undisturbed["choices"][0]["text"]
    assert len(killed) == 2
    status = fleet.client.get(f"{fleet.central.http_url}/api/v1/gateway").json()["text"]
    assert status["resumed"] >= 2 and status["broken"] == 0, status
    # The edge left serves on.
    again = fleet.client.post(url, json=body).json()
    assert again["token_ids"] == undisturbed["token_ids"]
