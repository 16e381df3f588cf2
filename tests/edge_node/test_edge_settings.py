"""An edge's settings: the ``broker`` section by its own names and, for one more release, by
the ``heartbeat.*`` names it had before (each with a FutureWarning)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from edge_node.heartbeat import HeartbeatBody, HeartbeatPublisher
from edge_node.settings import HEARTBEAT_MOVED_TO_BROKER, EdgeSettings, HeartbeatSettings
from modelfleet.cli import app

#: Per old ``heartbeat`` field: its environment name, extra variables it needs, the value.
OLD_VALUES: dict[str, tuple[str, dict[str, str], Any]] = {
    "broker_host": ("MODELFLEET_HEARTBEAT__BROKER_HOST", {}, "broker.example"),
    "broker_port": ("MODELFLEET_HEARTBEAT__BROKER_PORT", {}, 8883),
    "username": ("MODELFLEET_HEARTBEAT__USERNAME", {}, "edge-7"),
    "password": ("MODELFLEET_HEARTBEAT__PASSWORD", {}, "s3cret"),
    "tls": ("MODELFLEET_HEARTBEAT__TLS__ENABLED", {}, True),
    "topic_prefix": ("MODELFLEET_HEARTBEAT__TOPIC_PREFIX", {}, "plant-7/v1"),
    "keepalive_s": ("MODELFLEET_HEARTBEAT__KEEPALIVE_S", {}, 30),
    "client_id": ("MODELFLEET_HEARTBEAT__CLIENT_ID", {}, "edge-7-a"),
    "reconnect_min_s": ("MODELFLEET_HEARTBEAT__RECONNECT_MIN_S", {}, 0.25),
    "reconnect_max_s": ("MODELFLEET_HEARTBEAT__RECONNECT_MAX_S", {"MODELFLEET_BROKER__RECONNECT_MIN_S": "0.1"}, 2.5),
}


def _value(settings: EdgeSettings, old_field: str) -> Any:
    value = getattr(settings.broker, HEARTBEAT_MOVED_TO_BROKER[old_field])
    if old_field == "password":
        return value.get_secret_value()
    if old_field == "tls":
        return value.enabled
    return value


def _settings() -> EdgeSettings:
    return EdgeSettings(node_id="edge-7")


def _env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def test_every_moved_field_has_a_case_here() -> None:
    assert set(OLD_VALUES) == set(HEARTBEAT_MOVED_TO_BROKER)


@pytest.mark.parametrize("old_field", sorted(OLD_VALUES))
def test_the_broker_section_reads_its_own_names_without_a_warning(
    old_field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, extra, expected = OLD_VALUES[old_field]
    new = HEARTBEAT_MOVED_TO_BROKER[old_field].upper()
    name = "MODELFLEET_BROKER__TLS__ENABLED" if old_field == "tls" else f"MODELFLEET_BROKER__{new}"
    _env(monkeypatch, {name: str(expected), **extra})
    with warnings.catch_warnings(record=True) as caught:
        # Recorded, not raised: an "error" filter is process-wide, so it also turns a socket a
        # finished test leaked (collected here) into a failure of this one.
        warnings.simplefilter("always")
        settings = _settings()
    assert [str(w.message) for w in caught if not issubclass(w.category, ResourceWarning)] == []
    assert _value(settings, old_field) == expected


@pytest.mark.parametrize("old_field", sorted(OLD_VALUES))
def test_each_old_heartbeat_name_still_works_warns_and_lands_in_broker(
    old_field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, extra, expected = OLD_VALUES[old_field]
    _env(monkeypatch, {old: str(expected), **extra})
    new = HEARTBEAT_MOVED_TO_BROKER[old_field]
    with pytest.warns(FutureWarning, match=rf"heartbeat\.{old_field} .*deprecated.*use broker\.{new} "):
        settings = _settings()
    assert _value(settings, old_field) == expected


def test_old_names_given_to_the_constructor_work_too() -> None:
    with pytest.warns(FutureWarning) as warned:
        settings = EdgeSettings(node_id="edge-7", heartbeat={"broker_host": "b", "broker_port": 1884, "interval_s": 1})
    assert (settings.broker.host, settings.broker.port) == ("b", 1884)
    assert settings.heartbeat.interval_s == 1  # the section's own fields stay
    assert sorted(str(w.message).split(" ")[0] for w in warned) == ["heartbeat.broker_host", "heartbeat.broker_port"]


def test_the_new_name_wins_field_by_field(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(
        monkeypatch,
        {
            "MODELFLEET_HEARTBEAT__BROKER_HOST": "old-host",
            "MODELFLEET_HEARTBEAT__BROKER_PORT": "1999",
            "MODELFLEET_BROKER__PORT": "2000",
            "MODELFLEET_HEARTBEAT__USERNAME": "old-user",
            "MODELFLEET_BROKER__USERNAME": "edge-7",
        },
    )
    with pytest.warns(FutureWarning) as warned:
        broker = _settings().broker
    assert (broker.host, broker.port, broker.username) == ("old-host", 2000, "edge-7")
    assert sum("is set too and wins" in str(w.message) for w in warned) == 2


@pytest.mark.parametrize(
    ("env", "where"),
    [
        ({"MODELFLEET_BROKER__PORT": "0"}, ("broker", "port")),
        ({"MODELFLEET_BROKER__HOST": ""}, ("broker", "host")),
        ({"MODELFLEET_BROKER__RECONNECT_MIN_S": "20"}, ("broker",)),
        ({"MODELFLEET_HEARTBEAT__INTERVAL_S": "0"}, ("heartbeat", "interval_s")),
    ],
)
def test_a_wrong_value_fails_at_start_up_naming_the_setting(
    env: dict[str, str], where: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    _env(monkeypatch, env)
    with pytest.raises(ValidationError) as caught:
        _settings()
    assert caught.value.errors()[0]["loc"] == where


def test_the_heartbeat_section_alone_refuses_a_connection_field_it_no_longer_has() -> None:
    with pytest.raises(
        ValidationError, match=r"heartbeat\.broker_port is broker\.port now \(MODELFLEET_BROKER__PORT\)"
    ):
        HeartbeatSettings(broker_port=1884)  # type: ignore[call-arg]


def test_the_publisher_connects_as_the_broker_section_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _env(monkeypatch, {"MODELFLEET_BROKER__TOPIC_PREFIX": "plant-7/v1", "MODELFLEET_HEARTBEAT__INTERVAL_S": "1"})
    settings = _settings()
    publisher = HeartbeatPublisher("edge-7", settings.heartbeat, HeartbeatBody, tmp_path, broker=settings.broker)
    assert publisher.heartbeat_topic == "plant-7/v1/nodes/edge-7/heartbeat"
    assert settings.broker.effective_keepalive_s(settings.heartbeat.default_keepalive_s) == 2


@pytest.mark.parametrize(
    ("value", "addresses"),
    [
        ("central:50051", ["central:50051"]),
        ("10.0.0.1:50051, 10.0.0.2:50052", ["10.0.0.1:50051", "10.0.0.2:50052"]),
        ("[::1]:50051,c2.example:7000", ["[::1]:50051", "c2.example:7000"]),
    ],
)
def test_central_takes_one_address_or_a_comma_separated_list(value: str, addresses: list[str]) -> None:
    assert EdgeSettings(node_id="edge-7", central=value).central_addresses == addresses


def test_a_central_list_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_CENTRAL", "c1:50051,c2:50051")
    assert EdgeSettings(node_id="edge-7").central_addresses == ["c1:50051", "c2:50051"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "central must be host:port"),
        ("c1:50051,", "empty entry"),
        ("c1:50051,c2", "'c2': expected host:port (the port is required)"),
        ("c1:0", "'c1:0': port must be 1-65535"),
        ("c1:http", "'c1:http': port must be 1-65535"),
        (":50051", "':50051': no valid host"),
        ("::1:50051", "write an IPv6 address as [address]:port"),
        ("[::1]50051", "expected [v6-address]:port"),
        ("c1:50051,c1:50051", "central lists c1:50051 more than once"),
    ],
)
def test_a_bad_central_value_fails_at_start_up_naming_the_entry(value: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        EdgeSettings(node_id="edge-7", central=value)
    assert message in str(info.value)


def test_the_cli_refuses_a_bad_central_list_with_a_clear_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["edge", "--node-id", "edge-7", "--central", "c1:50051,c2", "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "invalid setting central" in result.output and "'c2': expected host:port" in result.output
