"""The dashboard in a real headless Chromium against a real fleet: a private Mosquitto,
central and three edges as processes (``bench._fleet.Fleet``) with 0.3 s heartbeats.
The page shows the three nodes alive with the model they serve; one edge is SIGKILLed
and the page turns it ``dead`` by itself, without a reload. A screenshot of the page is
written to ``test-results/dashboard.png`` at the repository root."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from playwright.sync_api import Browser, Page

from bench._fleet import Fleet
from bench.failover import CHUNKING_ENV, wait_membership_ready
from modelfleet.zoo import build_mlp
from support.brokers import MosquittoBroker

pytestmark = [pytest.mark.browser, pytest.mark.fleet]  # Chromium against a fleet of processes

RESULTS = Path(__file__).resolve().parents[3] / "test-results"
EDGES = ("e0", "e1", "e2")
WIDTH = 96  # a ~75 KB model: a few dozen 2 KiB chunks to spread over the owners
WAIT_MS = 30_000


@pytest.fixture
def fleet(mosquitto: MosquittoBroker, tmp_path: Path) -> Iterator[Fleet]:
    broker = {"HOST": mosquitto.host, "PORT": str(mosquitto.port)}
    central_env = {
        "MODELFLEET_MQTT__ENABLED": "true",
        **{f"MODELFLEET_MQTT__{k}": v for k, v in broker.items()},
        "MODELFLEET_QUANTIZE__ENABLED": "false",  # a random MLP would not pass the INT8 guard
        **CHUNKING_ENV,
    }
    edge_env = {
        "MODELFLEET_HEARTBEAT__ENABLED": "true",
        "MODELFLEET_BROKER__HOST": mosquitto.host,
        "MODELFLEET_BROKER__PORT": str(mosquitto.port),
        "MODELFLEET_HEARTBEAT__INTERVAL_S": "0.3",
        "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
    }
    with Fleet(root=tmp_path, central_env=central_env, edge_env=edge_env) as running:
        running.start(edges=len(EDGES))
        running.push("mlp", "1", build_mlp(tmp_path / "mlp.onnx", width=WIDTH, hidden_layers=2))
        wait_membership_ready(running, set(EDGES), "mlp", 60)
        yield running


def send_requests(fleet: Fleet, count: int) -> None:
    """Inference through central's gateway, so the throughput chart has something to draw."""
    assert fleet.central is not None
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, WIDTH], "data": np.ones(WIDTH).tolist()}]}
    with httpx.Client(base_url=fleet.central.http_url, timeout=10) as client:
        for _ in range(count):
            assert client.post("/v2/models/mlp/infer", json=body).status_code == 200


def node_row(page: Page, node_id: str, state: str) -> str:
    selector = f'#nodes-body tr[data-node-id="{node_id}"][data-state="{state}"]'
    page.wait_for_selector(selector, timeout=WAIT_MS)
    return selector


def test_a_killed_edge_turns_dead_on_the_open_page(fleet: Fleet, browser: Browser) -> None:
    assert fleet.central is not None
    send_requests(fleet, 20)
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    page.goto(fleet.central.http_url + "/dashboard")
    for node_id in EDGES:
        row = node_row(page, node_id, "alive")
        assert "mlp:1" in page.inner_text(row)
    page.wait_for_selector('#conn[data-conn="live"]', timeout=WAIT_MS)
    page.wait_for_selector('[data-placement="mlp:1"] .cells i.c-primary', timeout=WAIT_MS)
    assert page.inner_text("#kpi-models") == "1"
    page.evaluate("window.__sameDocument = true")  # gone if the page reloaded

    fleet.edges["e1"].popen.kill()  # SIGKILL: no offline status, no unregister
    node_row(page, "e1", "dead")
    for node_id in ("e0", "e2"):
        node_row(page, node_id, "alive")
    assert page.evaluate("window.__sameDocument") is True
    assert page.inner_text("#count-dead") == "1" and page.inner_text("#count-alive") == "2"
    page.wait_for_selector('#events li[data-event="node_dead"]', timeout=WAIT_MS)
    assert "e1" in page.inner_text('#events li[data-event="node_dead"]')

    send_requests(fleet, 10)  # the gateway keeps serving on the other two
    page.wait_for_timeout(1200)  # one more snapshot: the chart shows the requests after the kill
    RESULTS.mkdir(exist_ok=True)
    page.screenshot(path=str(RESULTS / "dashboard.png"), full_page=True)
    snapshot = json.loads(page.evaluate("JSON.stringify(store.snap.central.counts)"))
    assert snapshot == {"alive": 2, "suspect": 0, "dead": 1}
