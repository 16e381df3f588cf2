"""Central's settings: the ``broker`` section by its own names and, for one more release, by
the ``mqtt.*`` names it had before (each with a FutureWarning), and ``events.kept``."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from pydantic import ValidationError

from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.settings import MQTT_MOVED_TO_BROKER, CentralSettings, MqttSettings

#: An environment value per moved field, and what it becomes in ``broker``.
OLD_VALUES: dict[str, tuple[str, dict[str, str], Any]] = {
    "host": ("MODELFLEET_MQTT__HOST", {}, "broker.example"),
    "port": ("MODELFLEET_MQTT__PORT", {}, 8883),
    "username": ("MODELFLEET_MQTT__USERNAME", {}, "central"),
    "password": ("MODELFLEET_MQTT__PASSWORD", {}, "s3cret"),
    "tls": ("MODELFLEET_MQTT__TLS__ENABLED", {}, True),
    "topic_prefix": ("MODELFLEET_MQTT__TOPIC_PREFIX", {}, "plant-7/v1"),
    "keepalive_s": ("MODELFLEET_MQTT__KEEPALIVE_S", {}, 30),
    "client_id": ("MODELFLEET_MQTT__CLIENT_ID", {}, "central-a"),
    "reconnect_min_s": ("MODELFLEET_MQTT__RECONNECT_MIN_S", {}, 0.25),
    "reconnect_max_s": ("MODELFLEET_MQTT__RECONNECT_MAX_S", {"MODELFLEET_BROKER__RECONNECT_MIN_S": "0.1"}, 2.5),
}


def _value(settings: CentralSettings, field: str) -> Any:
    value = getattr(settings.broker, field)
    if field == "password":
        return value.get_secret_value()
    if field == "tls":
        return value.enabled
    return value


def _env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_every_moved_field_has_a_case_here() -> None:
    assert set(OLD_VALUES) == set(MQTT_MOVED_TO_BROKER)


@pytest.mark.parametrize("field", sorted(OLD_VALUES))
def test_the_broker_section_reads_its_own_names_without_a_warning(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old, extra, expected = OLD_VALUES[field]
    _env(monkeypatch, {old.replace("MQTT__", "BROKER__"): str(expected), **extra})
    with warnings.catch_warnings(record=True) as caught:
        # Recorded, not raised: an "error" filter is process-wide, so it also turns a socket a
        # finished test leaked (collected here) into a failure of this one.
        warnings.simplefilter("always")
        settings = CentralSettings()
    assert [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)] == []
    assert _value(settings, field) == expected


@pytest.mark.parametrize("field", sorted(OLD_VALUES))
def test_each_old_mqtt_name_still_works_warns_and_lands_in_broker(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old, extra, expected = OLD_VALUES[field]
    _env(monkeypatch, {old: str(expected), **extra})
    with pytest.warns(FutureWarning, match=rf"mqtt\.{field} .*deprecated.*use broker\.{field} "):
        settings = CentralSettings()
    assert _value(settings, field) == expected


def test_old_names_given_to_the_constructor_work_too() -> None:
    with pytest.warns(FutureWarning) as warned:
        settings = CentralSettings(mqtt={"host": "b", "port": 1884, "enabled": True, "dead_after": 4})
    assert (settings.broker.host, settings.broker.port) == ("b", 1884)
    assert settings.mqtt.enabled and settings.mqtt.dead_after == 4  # the section's own fields stay
    assert len(warned) == 2


def test_the_new_name_wins_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        {
            "MODELFLEET_MQTT__HOST": "old-host",
            "MODELFLEET_MQTT__PORT": "1999",
            "MODELFLEET_BROKER__PORT": "2000",
            "MODELFLEET_MQTT__TLS__ENABLED": "true",
            "MODELFLEET_BROKER__TLS__ENABLED": "false",
        },
    )
    with pytest.warns(FutureWarning) as warned:
        broker = CentralSettings().broker
    assert (broker.host, broker.port, broker.tls.enabled) == ("old-host", 2000, False)
    assert sum("is set too and wins" in str(w.message) for w in warned) == 2


def test_events_kept_is_the_name_and_mqtt_events_kept_an_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CentralSettings().events.kept == 500
    with pytest.warns(FutureWarning, match=r"mqtt\.events_kept .*use events\.kept \(MODELFLEET_EVENTS__KEPT\)"):
        assert CentralSettings(mqtt={"events_kept": 70}).events.kept == 70
    monkeypatch.setenv("MODELFLEET_EVENTS__KEPT", "80")
    with pytest.warns(FutureWarning, match="events.kept is set too and wins"):
        assert CentralSettings(mqtt={"events_kept": 70}).events.kept == 80


@pytest.mark.parametrize(
    ("env", "where"),
    [
        ({"MODELFLEET_BROKER__PORT": "0"}, ("broker", "port")),
        ({"MODELFLEET_BROKER__PORT": "mqtt"}, ("broker", "port")),
        ({"MODELFLEET_BROKER__KEEPALIVE_S": "-1"}, ("broker", "keepalive_s")),
        ({"MODELFLEET_EVENTS__KEPT": "0"}, ("events", "kept")),
    ],
)
def test_a_wrong_value_fails_at_start_up_naming_the_setting(
    env: dict[str, str], where: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, env)
    with pytest.raises(ValidationError) as caught:
        CentralSettings()
    assert caught.value.errors()[0]["loc"] == where


def test_a_wrong_value_under_an_old_name_fails_naming_where_it_went(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_MQTT__PORT", "70000")
    with pytest.warns(FutureWarning, match="use broker.port"), pytest.raises(ValidationError) as caught:
        CentralSettings()
    assert caught.value.errors()[0]["loc"] == ("broker", "port")


def test_the_mqtt_section_alone_refuses_a_connection_field_it_no_longer_has() -> None:
    with pytest.raises(ValidationError, match=r"mqtt\.host is broker\.host now \(MODELFLEET_BROKER__HOST\)"):
        MqttSettings(host="b")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"mqtt\.events_kept is events\.kept now"):
        MqttSettings(events_kept=5)  # type: ignore[call-arg]


async def test_the_consumer_connects_as_the_broker_section_says(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, {"MODELFLEET_BROKER__USERNAME": "central", "MODELFLEET_BROKER__TOPIC_PREFIX": "plant-7/v1"})
    settings = CentralSettings()
    tracker = make_tracker(settings.mqtt, asyncio.get_running_loop())
    try:
        consumer = MembershipConsumer(settings.mqtt, tracker, broker=settings.broker)
        assert consumer.client_id == "central"  # the login, as the shipped brokers bind it
        assert consumer.topics.events == "plant-7/v1/events"
    finally:
        tracker.close()
