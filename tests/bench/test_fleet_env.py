"""Bench fleets never talk to the machine's own broker on 1883 unless told where one is."""

from __future__ import annotations

import pytest

from bench._fleet import Fleet, without_default_broker


def test_a_fleet_without_a_broker_runs_with_mqtt_off() -> None:
    fleet = Fleet(central_env={"MODELFLEET_QUANTIZE__ENABLED": "false"}, edge_env={})
    assert fleet.central_env["MODELFLEET_MQTT__ENABLED"] == "false"
    assert fleet.edge_env["MODELFLEET_HEARTBEAT__ENABLED"] == "false"
    assert fleet.central_env["MODELFLEET_QUANTIZE__ENABLED"] == "false"


@pytest.mark.parametrize(
    "key",
    ["MODELFLEET_MQTT__PORT", "MODELFLEET_MQTT__HOST", "MODELFLEET_HEARTBEAT__BROKER_PORT", "MODELFLEET_BROKER__PORT"],
)
def test_naming_a_broker_leaves_mqtt_as_configured(key: str) -> None:
    env = without_default_broker({key: "18830"})
    assert env == {key: "18830"}


def test_an_explicit_enabled_wins() -> None:
    env = without_default_broker({"MODELFLEET_MQTT__ENABLED": "true"})
    assert env["MODELFLEET_MQTT__ENABLED"] == "true"
