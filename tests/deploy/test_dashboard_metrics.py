"""Every metric the Grafana dashboard and the Prometheus rules use is exported by a real
central or edge, docs/observability.md lists exactly what they export, and Prometheus
scrapes the services the Compose file runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from deploy_checks import DEPLOY, image_env
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from central.server import CentralServer
from support.brokers import MosquittoBroker
from support.fleet import EdgeFactory, central_settings, push
from support.wait import wait_for

_DOC = DEPLOY.parent / "docs" / "observability.md"
_METRIC = re.compile(r"\bmodelfleet_[a-z0-9_]+")


def _exprs(node: Any) -> list[str]:
    """Every ``expr`` string anywhere in a JSON/YAML document."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def _used() -> dict[str, set[str]]:
    """Metric name → the files that use it."""
    docs = {
        "grafana/modelfleet-dashboard.json": json.loads((DEPLOY / "grafana/modelfleet-dashboard.json").read_text()),
        "prometheus/rules.yml": yaml.safe_load((DEPLOY / "prometheus/rules.yml").read_text()),
    }
    used: dict[str, set[str]] = {}
    for where, doc in docs.items():
        exprs = _exprs(doc)
        assert exprs, f"no expressions found in {where}"
        for name in {m for e in exprs for m in _METRIC.findall(e)}:
            used.setdefault(name, set()).add(where)
    return used


def _names(text: str) -> set[str]:
    """Family and sample names of an exposition (``x`` and ``x_total``, ``x_bucket``, ...); a
    counter family counts as ``x_total`` with no sample yet (an engine's, before a language
    model is served: its HELP and TYPE are exported all the same)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update((family.name, _exposed_name(family)))
        names.update(s.name for s in family.samples)
    return names


def _exposed_name(family: Metric) -> str:
    """A family's name as Prometheus users write it: counters with ``_total``."""
    return f"{family.name}_total" if family.type == "counter" else family.name


async def test_every_metric_in_the_dashboard_and_rules_is_exported(
    tmp_path: Path, mosquitto: MosquittoBroker, make_edge: EdgeFactory, small_model_file: Path
) -> None:
    mqtt = {"enabled": True, "default_interval_s": 0.3}
    broker = {"host": mosquitto.host, "port": mosquitto.port}
    central = CentralServer(central_settings(tmp_path / "central", mqtt=mqtt, broker=broker))
    await central.start()
    try:
        heartbeat = {"enabled": True, "interval_s": 0.3}
        edge = await make_edge("edge-a", central, heartbeat=heartbeat, broker=broker)
        async with httpx.AsyncClient(base_url=central.http_url, timeout=30) as api:
            assert (await push(api, "tiny", small_model_file)).status_code == 201
            tracker = central.central.liveness
            await wait_for(lambda: len(tracker.ready_endpoints("tiny")) == 1, 30, "tiny ready")
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 32], "data": np.ones(32).tolist()}]}
            assert (await api.post("/v2/models/tiny/infer", json=body)).status_code == 200
            texts = [(await api.get(url)).text for url in ("/metrics", f"http://127.0.0.1:{edge.http_port}/metrics")]
        await edge.stop()  # before central: its leaving would re-place on a closed store
    finally:
        await central.stop()

    exported = {n for text in texts for n in _names(text)}
    families = {_exposed_name(f) for text in texts for f in text_string_to_metric_families(text)}
    used = _used()
    assert len(used) >= 20  # the dashboard covers the fleet, not a token metric
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"used but exported by neither central nor an edge: {missing}"
    documented = set(_METRIC.findall(_DOC.read_text()))
    assert documented <= exported, f"documented but not exported: {sorted(documented - exported)}"
    # prometheus_client's ``*_created`` timestamps are not metrics anyone charts
    undocumented = {f for f in families if f.startswith("modelfleet_") and not f.endswith("_created")} - documented
    assert not undocumented, f"exported but not in docs/observability.md: {sorted(undocumented)}"


def test_prometheus_scrapes_the_compose_services_on_their_ports() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    targets = {t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    assert targets == {"central:8080", "edge-a:8081", "edge-b:8081", "edge-c:8081"}
    for target in targets:
        service, port = target.split(":")
        assert service in compose
        # the port its healthcheck asks (modelfleet.healthcheck: MODELFLEET_HTTP_PORT of its image)
        assert "modelfleet.healthcheck" in compose[service]["healthcheck"]["test"]
        assert image_env(compose[service]["build"]["dockerfile"].rsplit("/", 1)[-1])["MODELFLEET_HTTP_PORT"] == port
    assert {job["scheme"] for job in config["scrape_configs"]} == {"https"}  # the fleet serves nothing else
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]
    mounted = [v.split(":")[1] for v in compose["prometheus"]["volumes"]]
    assert "/etc/prometheus/rules.yml" in mounted
