"""The name rule as properties: every string of the allowed alphabet passes unchanged, and any
string with a character outside it — a trailing newline above all, which ``re.match`` with
``$`` let through — is refused, by ``check_name``, ``is_name``, the digest check, the MQTT
topic parser and the label check alike."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetwire.digest import chunk_digest, is_digest
from fleetwire.mqtt.topics import Topics
from fleetwire.names import NAME_PATTERN, InvalidName, check_label, check_name, host_port, is_address, is_name

PROPERTIES = settings(max_examples=300, deadline=None, database=None)

_FIRST = string.ascii_letters + string.digits
_REST = _FIRST + "._-"
#: What a name may never hold: controls (a newline first), separators, spaces, non-ASCII.
_BAD = st.sampled_from(["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", " ", "/", "\\", ":", "ü", "é"])
_CONTROL = st.sampled_from(["\n", "\r", "\t", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u2029"])

valid_names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(_FIRST),
    st.text(alphabet=_REST, max_size=127),
).filter(lambda name: ".." not in name)


@PROPERTIES
@given(name=valid_names)
def test_every_valid_name_round_trips(name: str) -> None:
    assert check_name("version", name) == name and is_name(name)
    topics = Topics()
    assert topics.node_id_of(topics.node_heartbeat(name)) == name
    assert topics.node_id_of(topics.node_status(name)) == name
    assert re.fullmatch(NAME_PATTERN, name)  # the anchored pattern published for JSON Schema agrees


@PROPERTIES
@given(name=valid_names, bad=_BAD, data=st.data())
def test_a_disallowed_character_anywhere_is_refused(name: str, bad: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(min_value=0, max_value=len(name)), label="at")
    spoiled = name[:at] + bad + name[at:]
    with pytest.raises(InvalidName, match="version"):
        check_name("version", spoiled)
    assert not is_name(spoiled)
    topics = Topics()
    assert topics.node_id_of(topics.node_status(spoiled)) is None  # a forged id is no node id


@PROPERTIES
@given(name=valid_names, tail=st.sampled_from(["\n", "\r\n", "\n\n", "\x00"]))
def test_a_trailing_newline_is_refused_with_a_message_that_shows_it(name: str, tail: str) -> None:
    with pytest.raises(InvalidName) as refused:
        check_name("version", name + tail)
    assert repr(name + tail) in str(refused.value)  # the newline is visible (escaped) in the message


@PROPERTIES
@given(data=st.binary(max_size=64), tail=_CONTROL)
def test_a_digest_is_the_whole_string(data: bytes, tail: str) -> None:
    digest = chunk_digest(data)
    assert is_digest(digest)
    assert not is_digest(digest + tail) and not is_digest(tail + digest) and not is_digest(digest.upper())


@PROPERTIES
@given(key=st.text(min_size=1, max_size=40), value=st.text(max_size=40))
def test_a_label_is_refused_exactly_when_it_holds_a_control_character(key: str, value: str) -> None:
    def control(text: str) -> bool:
        return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u2028\u2029" for c in text)

    if control(key) or control(value):
        with pytest.raises(InvalidName, match="control character"):
            check_label(key, value)
    else:
        assert check_label(key, value) == (key, value)


@given(key=st.text(alphabet=_REST, min_size=1, max_size=20), bad=_CONTROL)
def test_a_label_with_a_line_break_is_refused(key: str, bad: str) -> None:
    with pytest.raises(InvalidName, match="label value"):
        check_label(key, f"shop-1{bad}")
    with pytest.raises(InvalidName, match="label key"):
        check_label(f"{key}{bad}", "x")


def test_an_empty_or_overlong_label_is_refused() -> None:
    with pytest.raises(InvalidName, match="must not be empty"):
        check_label("", "x")
    with pytest.raises(InvalidName, match="limit is 256"):
        check_label("k", "v" * 257)
    assert check_label("topology.kubernetes.io/zone", "eu west 1") == ("topology.kubernetes.io/zone", "eu west 1")


@pytest.mark.parametrize(
    "address", ["", "127.0.0.1:8081", "edge-1.edge.ns.svc.cluster.local:443", "[::1]:50061", "modelfleet_edge_1:0"]
)
def test_an_announced_address_is_host_and_port(address: str) -> None:
    assert is_address(address)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1:8081/api/v1/status?", "127.0.0.1:8081\n", "127.0.0.1", "::1:8081", "http://h:1", "user@h:1",
        "h:65536", "h:1?x", "h:1#x", " h:1", "-h:1",
    ],
)  # fmt: skip
def test_an_address_with_anything_but_host_and_port_is_refused(address: str) -> None:
    assert not is_address(address)


def test_host_port_brackets_an_ipv6_host() -> None:
    assert host_port("::", 8081) == "[::]:8081" and is_address(host_port("::", 8081))
    assert host_port("127.0.0.1", 1) == "127.0.0.1:1" and host_port("[::1]", 2) == "[::1]:2"
    assert not is_address("", empty=False)
