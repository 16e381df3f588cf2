"""The "Language models" panel in a real headless Chromium against a real fleet: a private
Mosquitto, central and one edge as processes (``bench._fleet.Fleet``) with 0.3 s heartbeats.
Before anything is pushed the panel says no language model is served; once a small decoder is
pushed and generation requests reach the edge's ``/v1/completions``, the open page shows, by
itself, the node and the model tagged "language model", tokens/s above zero and the TTFT p50/p99
filled in; the edge SIGKILLed, its row turns dead with its figures dashed. A screenshot (taken
while serving) is written to ``test-results/dashboard-language-models.png``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page

from bench._fleet import Fleet
from support.brokers import MosquittoBroker
from support.decoder_models import build_decoder

pytestmark = [pytest.mark.browser, pytest.mark.fleet]  # Chromium against a fleet of processes

RESULTS = Path(__file__).resolve().parents[3] / "test-results"
WAIT_MS = 30_000
MODEL = "chat"
ROW = f'#lm-body tr[data-node-id="e0"][data-model="{MODEL}"][data-version="1"]'


@pytest.fixture
def fleet(mosquitto: MosquittoBroker, tmp_path: Path) -> Iterator[Fleet]:
    central_env = {
        "MODELFLEET_MQTT__ENABLED": "true",
        "MODELFLEET_MQTT__HOST": mosquitto.host,
        "MODELFLEET_MQTT__PORT": str(mosquitto.port),
        "MODELFLEET_QUANTIZE__ENABLED": "false",  # the FP32 decoder only: no INT4/INT8 candidates to guard
    }
    edge_env = {
        "MODELFLEET_HEARTBEAT__ENABLED": "true",
        "MODELFLEET_BROKER__HOST": mosquitto.host,
        "MODELFLEET_BROKER__PORT": str(mosquitto.port),
        "MODELFLEET_HEARTBEAT__INTERVAL_S": "0.3",
        "MODELFLEET_RECONNECT_BACKOFF_MAX_S": "0.5",
        "MODELFLEET_GENERATION__INTRA_OP_THREADS": "1",
    }
    with Fleet(root=tmp_path, central_env=central_env, edge_env=edge_env) as running:
        running.start(edges=1)
        yield running


class Completions:
    """Completion requests to the edge's ``/v1/completions``, one after another in a thread,
    until stopped: a steady stream of tokens for the heartbeats to report."""

    def __init__(self, edge_url: str) -> None:
        self._url = edge_url + "/v1/completions"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.answered = 0

    def __enter__(self) -> Completions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        body = {"model": MODEL, "prompt": "def wrap(text, width):", "max_tokens": 24, "temperature": 0}
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                r = client.post(self._url, json=body)
                assert r.status_code == 200, r.text
                self.answered += 1


def figure(page: Page, role: str) -> str:
    """The ``data-value`` of the panel row's cell ``role`` ("" when the page shows a dash)."""
    value = page.get_attribute(f'{ROW} td[data-role="{role}"]', "data-value")
    assert value is not None
    return value


def test_the_panel_shows_a_served_language_models_tokens_per_second_and_ttft(
    fleet: Fleet, browser: Browser, tmp_path: Path
) -> None:
    assert fleet.central is not None
    page = browser.new_page(viewport={"width": 1500, "height": 1300})
    page.goto(fleet.central.http_url + "/dashboard")
    page.wait_for_selector('#nodes-body tr[data-node-id="e0"][data-state="alive"]', timeout=WAIT_MS)
    assert page.inner_text('#lm-body td[data-role="lm-empty"]') == "No language model served."
    page.evaluate("window.__sameDocument = true")  # gone if the page reloaded

    fleet.push_folder(MODEL, "1", build_decoder(tmp_path / "tiny"))
    fleet.wait_model_ready("e0", MODEL, timeout_s=120)
    page.wait_for_selector(ROW, timeout=WAIT_MS)  # a row as soon as the engine reports
    assert page.inner_text(f'{ROW} [data-kind="decoder"]') == "language model"
    with Completions(fleet.edges["e0"].http_url) as load:
        # tokens/s is the rate since the previous heartbeat: above zero while requests run
        page.wait_for_function(
            f"""() => {{
                const cell = document.querySelector('{ROW} td[data-role="tokens-per-s"]');
                return cell !== null && Number(cell.dataset.value) > 0;
            }}""",
            timeout=WAIT_MS,
        )
        page.wait_for_selector(f'{ROW} td[data-role="ttft-p99"]:not([data-value=""])', timeout=WAIT_MS)
        RESULTS.mkdir(exist_ok=True)
        page.screenshot(path=str(RESULTS / "dashboard-language-models.png"), full_page=True)
    assert load.answered > 0
    p50, p99 = float(figure(page, "ttft-p50")), float(figure(page, "ttft-p99"))
    assert 0 < p50 <= p99
    assert page.inner_text(f"{ROW} td.node-id").strip() == "e0"
    assert float(figure(page, "kv")) >= 0 and int(figure(page, "running")) >= 0
    assert "tokens/s in all" in page.inner_text("#lm-total")

    fleet.edges["e0"].popen.kill()  # SIGKILL: its last figures must not pass for live ones
    page.wait_for_selector(f'{ROW}[data-state="dead"] td[data-role="tokens-per-s"][data-value=""]', timeout=WAIT_MS)
    assert page.inner_text("#lm-total") == "0.0 tokens/s in all"
    assert page.evaluate("window.__sameDocument") is True  # it all arrived over the live stream
