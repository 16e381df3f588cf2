"""hypothesis against the parsers that take bytes from outside: the chunker (any bytes
reassemble exactly; a small edit changes few chunks), the manifest and the heartbeat
(malformed JSON, wrong types, huge numbers, unicode ids: a clean verdict, never a crash)."""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from central.mqtt.consumer import MembershipConsumer, make_tracker
from central.registry.chunker import Chunker
from central.settings import ChunkingSettings, MqttSettings
from fleetwire.manifest import Manifest
from fleetwire.mqtt.fast import DecodeError, FastHeartbeat, decode_heartbeat

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
#: Tiny chunks, so that a few KB of input make dozens of them.
CHUNKER = Chunker(ChunkingSettings(avg_bytes=256, min_bytes=64, max_bytes=1024))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _chunks(data: bytes) -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(data)
        return list(CHUNKER.cut(path))


@FUZZ
@given(data=st.binary(max_size=6000))
def test_any_bytes_chunk_and_reassemble_exactly(data: bytes) -> None:
    chunks = _chunks(data)
    assert b"".join(chunks) == data
    assert all(0 < len(c) <= 1024 for c in chunks)
    assert all(len(c) >= 64 for c in chunks[:-1])  # only the last may be short


@FUZZ
@given(seed=st.integers(0, 2**32), at=st.floats(0, 1), edit=st.binary(min_size=1, max_size=8), kind=st.integers(0, 2))
def test_a_small_edit_changes_few_chunks(seed: int, at: float, edit: bytes, kind: int) -> None:
    data = random.Random(seed).randbytes(24_000)
    i = int(at * len(data))
    edited = [data[:i] + edit + data[i:], data[:i] + data[i + len(edit) :], data[:i] + edit + data[i + len(edit) :]]
    before, after = _chunks(data), _chunks(edited[kind])
    new = [c for c in after if c not in set(before)]
    # Content-defined cuts resynchronise a few chunks after the edit: what is new is a few
    # maximum-size chunks' worth of bytes, a small share of the file's chunks.
    assert sum(map(len, new)) <= 4 * 1024, f"{len(new)} of {len(after)} chunks changed for {len(edit)} bytes"
    assert len(new) <= len(after) // 6


def _manifest_doc() -> st.SearchStrategy[dict[str, Any]]:
    chunk = st.fixed_dictionaries({"digest": st.text(), "size": st.integers(0, 2**40)})
    return st.fixed_dictionaries(
        {
            "name": st.text(),
            "version": st.text(),
            "sha256": st.text(),
            "size": st.integers(0, 2**62),
            "chunks": st.lists(chunk, max_size=5),
            "created_at": st.text(),
            "labels": st.dictionaries(st.text(), st.text(), max_size=3),
        }
    )


@FUZZ
@given(doc=_manifest_doc())
def test_a_valid_manifest_survives_json_round_trip(doc: dict[str, Any]) -> None:
    manifest = Manifest.model_validate(doc)
    assert Manifest.model_validate_json(manifest.model_dump_json()) == manifest


@FUZZ
@given(
    raw=st.binary(max_size=300)
    | json_values.map(json.dumps).map(str.encode)
    | _manifest_doc().map(
        lambda d: json.dumps({**d, "size": "huge", "chunks": [{"digest": 1, "size": 2**70}]}).encode()
    )
)
def test_a_malformed_manifest_is_a_validation_error(raw: bytes) -> None:
    try:
        Manifest.model_validate_json(raw)
    except ValidationError:
        return  # the one failure a parser of untrusted bytes may raise


def _heartbeat_doc() -> st.SearchStrategy[dict[str, Any]]:
    """Mostly-valid heartbeats with one field at a time bent: wrong types, huge numbers, unicode ids."""
    good = {"node_id": "n1", "bdseq": 1, "seq": 1, "ts": 1, "interval_s": 1.0}
    bent = st.sampled_from(sorted(good)).flatmap(lambda key: json_values.map(lambda v: {**good, key: v}))
    unicode_id = st.text(min_size=1, max_size=200).map(lambda s: {**good, "node_id": s})
    return bent | unicode_id | json_values.map(lambda v: {"node_id": "n1", "models": v})


@FUZZ
@given(raw=st.binary(max_size=300) | _heartbeat_doc().map(lambda d: json.dumps(d).encode()))
def test_decode_heartbeat_returns_a_heartbeat_or_a_decode_error(raw: bytes) -> None:
    try:
        hb = decode_heartbeat(raw)
    except DecodeError:
        return
    assert isinstance(hb, FastHeartbeat) and 1 <= len(hb.node_id) <= 128 and 0 <= hb.seq < 2**64


@FUZZ
@given(doc=_heartbeat_doc(), garbage=st.binary(max_size=200))
def test_central_counts_every_malformed_heartbeat_and_never_raises(doc: dict[str, Any], garbage: bytes) -> None:
    loop = asyncio.new_event_loop()  # the tracker's timers need one; it never runs here
    try:
        _feed(MembershipConsumer(MqttSettings(), make_tracker(MqttSettings(), loop), loop), doc, garbage)
    finally:
        loop.close()


def _feed(consumer: MembershipConsumer, doc: dict[str, Any], garbage: bytes) -> None:
    tracker, topics = consumer.tracker, consumer.topics
    for topic, payload in (
        (topics.node_heartbeat("n1"), json.dumps(doc).encode()),
        (topics.node_heartbeat("n1"), garbage),
    ):
        before = tracker.counters.malformed_dropped
        consumer.handle_message(topic, payload)
        try:
            valid = decode_heartbeat(payload).node_id == "n1"
        except (DecodeError, msgspec.ValidationError):
            valid = False
        assert tracker.counters.malformed_dropped == before + (0 if valid else 1)
        assert (tracker.get("n1") is not None) or not valid
    consumer.handle_message(f"{topics.prefix}/elsewhere", b"{}")  # not a node topic: counted, not raised
    consumer.handle_message(topics.node_status("n\u00e9"), b'{"state": "maybe"}')
