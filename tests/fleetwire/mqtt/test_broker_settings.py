"""The shared ``broker`` section, and how a moved setting's old name keeps working."""

from __future__ import annotations

from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from pydantic import BaseModel, ValidationError

from central.settings import CentralSettings
from fleetwire.deprecated import adopt_moved, refuse_moved
from fleetwire.mqtt.broker import BrokerSettings
from fleetwire.mqtt.rotation import BrokerRotation
from fleetwire.mqtt.tls import MqttTlsSettings

RENAMES = {"host": "host", "broker_port": "port", "tls": "tls"}


def test_defaults_and_what_each_deployable_fills_in() -> None:
    b = BrokerSettings()
    assert (b.host, b.port, b.username, b.password, b.tls.enabled) == ("127.0.0.1", 1883, None, None, False)
    assert (b.topic_prefix, b.keepalive_s, b.reconnect_min_s, b.reconnect_max_s) == ("modelfleet/v1", None, 0.5, 10.0)
    assert b.effective_keepalive_s(10) == 10 and BrokerSettings(keepalive_s=4).effective_keepalive_s(10) == 4
    assert b.effective_client_id("edge-n1") == "edge-n1"
    assert BrokerSettings(client_id="mine").effective_client_id("edge-n1") == "mine"
    assert BrokerSettings(username="n1", client_id="mine").effective_client_id("edge-n1") == "n1"
    assert b.url == "mqtt://127.0.0.1:1883"
    assert BrokerSettings(host="b", port=8883, tls={"enabled": True}).url == "mqtts://b:8883"
    for name, info in BrokerSettings.model_fields.items():
        assert info.description, name  # a docstring per field


def test_the_password_never_shows() -> None:
    b = BrokerSettings(username="central", password="s3cret")
    assert b.password is not None and b.password.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(b) and "s3cret" not in str(b.model_dump())


@pytest.mark.parametrize(
    ("bad", "where"),
    [
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": "mqtt"}, "port"),
        ({"host": ""}, "host"),
        ({"keepalive_s": 0}, "keepalive_s"),
        ({"topic_prefix": ""}, "topic_prefix"),
        ({"reconnect_min_s": 0}, "reconnect_min_s"),
    ],
)
def test_a_wrong_value_fails_naming_the_field(bad: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        BrokerSettings(**bad)  # type: ignore[arg-type]
    assert caught.value.errors()[0]["loc"] == (where,)


def test_reconnect_bounds_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match=r"broker\.reconnect_min_s must not exceed broker\.reconnect_max_s"):
        BrokerSettings(reconnect_min_s=5, reconnect_max_s=1)


def test_a_broker_tls_file_that_cannot_be_read_fails_at_validation(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="ca_file"):
        BrokerSettings(tls={"enabled": True, "ca_file": tmp_path / "missing.pem"})


def test_an_old_name_moves_to_the_new_section_with_a_future_warning() -> None:
    data = {"old": {"host": "h", "broker_port": "1884", "kept": 1}, "other": 2}
    with pytest.warns(FutureWarning) as warned:
        moved = adopt_moved(data, source="old", target="new", renames=RENAMES)
    assert moved == {"old": {"kept": 1}, "other": 2, "new": {"host": "h", "port": "1884"}}
    assert data["old"] == {"host": "h", "broker_port": "1884", "kept": 1}  # the input is not changed
    messages = sorted(str(w.message) for w in warned)
    assert messages == [
        "old.broker_port (MODELFLEET_OLD__BROKER_PORT) is deprecated and goes away in the next release:"
        " use new.port (MODELFLEET_NEW__PORT)",
        "old.host (MODELFLEET_OLD__HOST) is deprecated and goes away in the next release:"
        " use new.host (MODELFLEET_NEW__HOST)",
    ]


def test_the_new_name_wins_leaf_by_leaf() -> None:
    data = {
        "old": {"host": "old-host", "broker_port": 1, "tls": {"enabled": True, "ca_file": "old.pem"}},
        "new": {"host": "new-host", "tls": {"ca_file": "new.pem"}},
    }
    with pytest.warns(FutureWarning) as warned:
        moved = adopt_moved(data, source="old", target="new", renames=RENAMES)
    assert moved["new"] == {"host": "new-host", "port": 1, "tls": {"enabled": True, "ca_file": "new.pem"}}
    wins = sorted(str(w.message).rpartition("; ")[2] for w in warned if "wins" in str(w.message))
    assert wins == ["new.host is set too and wins", "new.tls is set too and wins"]


def test_a_new_section_given_as_a_model_counts_with_the_fields_it_was_given() -> None:
    class Target(BaseModel):
        host: str = "default"
        port: int = 1883
        tls: MqttTlsSettings = MqttTlsSettings()

    data = {"old": {"host": "old-host", "broker_port": 1884}, "new": Target(host="new-host")}
    with pytest.warns(FutureWarning):
        moved = adopt_moved(data, source="old", target="new", renames=RENAMES)
    assert Target.model_validate(moved["new"]) == Target(host="new-host", port=1884)


def test_nothing_old_nothing_changes() -> None:
    data = {"old": {"kept": 1}, "new": {"host": "h"}}
    assert adopt_moved(data, source="old", target="new", renames=RENAMES) is data
    assert adopt_moved("not a mapping", source="old", target="new", renames=RENAMES) == "not a mapping"


def test_a_section_on_its_own_refuses_an_old_name_instead_of_dropping_it() -> None:
    with pytest.raises(ValueError, match=r"old\.broker_port is new\.port now \(MODELFLEET_NEW__PORT\).*through Owner"):
        refuse_moved({"broker_port": 1}, section="old", target="new", renames=RENAMES, owner="Owner")
    assert refuse_moved({"kept": 1}, section="old", target="new", renames=RENAMES, owner="Owner") == {"kept": 1}


def test_hosts_win_over_host_and_take_port_as_their_default() -> None:
    b = BrokerSettings(hosts=["a:1884", "b", "[::1]:1885", "[fe80::1]"], port=1999)
    assert b.addresses() == [("a", 1884), ("b", 1999), ("::1", 1885), ("fe80::1", 1999)]
    assert b.url == "mqtt://a:1884,mqtt://b:1999,mqtt://[::1]:1885,mqtt://[fe80::1]:1999"
    assert BrokerSettings(host="h", port=2).addresses() == [("h", 2)]  # no hosts: the one broker


@pytest.mark.parametrize("entry", ["a:0", "a:65536", "a:x", "::1:1883", ":1883", "[::1", "[::1]x", "[]:1"])
def test_a_bad_hosts_entry_fails_naming_it(entry: str) -> None:
    with pytest.raises(ValidationError, match=r"broker\.hosts entry"):
        BrokerSettings(hosts=["ok:1883", entry])


def test_host_and_hosts_together_are_refused() -> None:
    with pytest.raises(ValidationError, match="not both"):
        BrokerSettings(host="a", hosts=["b:1883"])


def test_hosts_from_the_environment_as_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_BROKER__HOSTS", '["10.0.0.1:1883","10.0.0.2:1884"]')
    assert CentralSettings().broker.addresses() == [("10.0.0.1", 1883), ("10.0.0.2", 1884)]


def test_the_rotation_moves_a_client_round_the_list_and_leaves_one_broker_alone() -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    rotation = BrokerRotation(BrokerSettings(hosts=["a:1", "b:2", "c:3"]))
    rotation.connect_async(client, keepalive=7)
    seen = [(client.host, client.port)]
    for _ in range(3):
        assert rotation.move(client)
        seen.append((client.host, client.port))
    assert seen == [("a", 1), ("b", 2), ("c", 3), ("a", 1)] and client.keepalive == 7 and rotation.moves == 3
    assert rotation.url == "mqtt://a:1"

    alone = BrokerRotation(BrokerSettings(host="h", port=5))
    alone.connect_async(client, keepalive=7)
    assert not alone.move(client) and (client.host, client.port) == ("h", 5)
