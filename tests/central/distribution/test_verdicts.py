"""Central keeps the first timed verdict per (model, version, hardware class) it hears in
heartbeats, only from a node of that class, for active versions, and a bounded number."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from central.distribution.verdicts import VerdictBook
from central.storage.offload import StoreCalls
from central.storage.sqlite.decisions import SQLiteDecisionStore
from fleetwire.mqtt.fast import decode_heartbeat

A = "x86_64/avx2/2c/cpu"
B = "x86_64/avx2+avx512_vnni/2c/cpu"


def _heartbeat(node: str, hardware_class: str, *models: dict[str, Any]) -> bytes:
    doc = {"node_id": node, "bdseq": 1, "seq": 1, "ts": 1, "interval_s": 1.0, "hardware_class": hardware_class}
    return json.dumps({**doc, "models": list(models)}).encode()


def _model(artifact: str, source: str, hardware_class: str, version: str = "1", state: str = "ready") -> dict[str, Any]:
    choice = {"artifact": artifact, "source": source, "hardware_class": hardware_class, "speedup_b1": 2.0}
    return {"name": "m", "version": version, "state": state, "choice": choice}


class Fleet:
    """Registered classes by node, and how often the book said something changed."""

    def __init__(self) -> None:
        self.classes = {"edge-a": A, "edge-b": A, "edge-c": B}
        self.changes = 0

    def book(self, max_entries: int = 100) -> VerdictBook:
        def changed() -> None:
            self.changes += 1

        return VerdictBook(self.classes.get, on_new=changed, max_entries=max_entries)


def test_the_first_timed_verdict_of_a_class_wins() -> None:
    fleet = Fleet()
    book = fleet.book()
    book.harvest("edge-a", decode_heartbeat(_heartbeat("edge-a", A, _model("int8-x", "measured", A))))
    book.harvest("edge-b", decode_heartbeat(_heartbeat("edge-b", A, _model("fp32", "measured", A))))
    verdict = book.get(("m", "1"), A)
    assert verdict is not None and (verdict.artifact, verdict.node_id, verdict.speedup_b1) == ("int8-x", "edge-a", 2.0)
    assert book.get(("m", "1"), B) is None and fleet.changes == 1
    book.harvest("edge-c", decode_heartbeat(_heartbeat("edge-c", B, _model("fp32", "measured", B))))
    assert book.get(("m", "1"), B) is not None and fleet.changes == 2
    assert {(v["hardware_class"], v["artifact"]) for v in book.all()} == {(A, "int8-x"), (B, "fp32")}


def test_pins_defaults_unready_versions_and_foreign_classes_are_no_verdict() -> None:
    fleet = Fleet()
    book = fleet.book()
    for node, hb_class, model in [
        ("edge-a", A, _model("int8-x", "pinned", A)),
        ("edge-a", A, _model("int8-x", "default", A)),
        ("edge-a", A, _model("int8-x", "measured", A, state="loading")),
        ("edge-c", B, _model("int8-x", "measured", A)),  # a node speaking for a class it is not
        ("edge-c", A, _model("int8-x", "measured", A)),  # nor registered as
        ("edge-z", A, _model("int8-x", "measured", A)),  # not registered at all
    ]:
        book.harvest(node, decode_heartbeat(_heartbeat(node, hb_class, model)))
    assert len(book) == 0 and fleet.changes == 0
    book.harvest("edge-b", decode_heartbeat(_heartbeat("edge-b", A, _model("int8-x", "verdict", A))))
    assert book.get(("m", "1"), A) is not None  # passed on by a node that reused it: kept after a restart


def test_only_active_versions_and_a_bounded_number_are_kept() -> None:
    book = Fleet().book(max_entries=2)
    book.keep([("m", "1"), ("m", "2"), ("m", "3")])
    for version in ("1", "2", "3"):
        book.harvest("edge-a", decode_heartbeat(_heartbeat("edge-a", A, _model("fp32", "measured", A, version))))
    assert [v["version"] for v in book.all()] == ["2", "3"]  # the oldest made room
    book.keep([("m", "3")])
    assert [v["version"] for v in book.all()] == ["3"]
    book.harvest("edge-a", decode_heartbeat(_heartbeat("edge-a", A, _model("fp32", "measured", A, "1"))))
    assert [v["version"] for v in book.all()] == ["3"]  # version 1 is no longer active


def test_two_books_on_one_store_keep_the_first_verdict_and_a_restart_keeps_it(tmp_path: Path) -> None:
    """Two replicas (two books, one store) hear different first verdicts for one class: the
    store keeps the first written, and the other replica takes it over its own."""
    fleet = Fleet()
    first = VerdictBook(fleet.classes.get, records=SQLiteDecisionStore(tmp_path / "c.sqlite3"))
    second = VerdictBook(fleet.classes.get, records=SQLiteDecisionStore(tmp_path / "c.sqlite3"))
    first.harvest("edge-a", decode_heartbeat(_heartbeat("edge-a", A, _model("int8-x", "measured", A))))
    second.harvest("edge-b", decode_heartbeat(_heartbeat("edge-b", A, _model("fp32", "measured", A))))
    taken = second.get(("m", "1"), A)
    assert taken is not None and (taken.artifact, taken.node_id) == ("int8-x", "edge-a")
    restarted = VerdictBook(fleet.classes.get, records=SQLiteDecisionStore(tmp_path / "c.sqlite3"))
    kept = restarted.get(("m", "1"), A)
    assert kept is not None and kept.artifact == "int8-x"


def test_with_store_calls_a_heard_verdict_is_stored_from_a_worker_then_kept_and_a_conflict_takes_the_first(
    tmp_path: Path,
) -> None:
    """In central, ``harvest`` runs on the event loop: a new verdict is queued and stored by a
    background task in ``StoreCalls``' threads, kept (and announced) once stored."""
    fleet = Fleet()
    calls = StoreCalls(1)
    threads: list[str] = []

    class Noting(SQLiteDecisionStore):
        def add(self, kind: str, key: str, body: Any) -> bool:
            threads.append(threading.current_thread().name)
            return super().add(kind, key, body)

    async def run() -> tuple[VerdictBook, VerdictBook]:
        first = VerdictBook(fleet.classes.get, records=Noting(tmp_path / "c.sqlite3"), calls=calls)
        second = VerdictBook(fleet.classes.get, records=Noting(tmp_path / "c.sqlite3"), calls=calls)
        first.harvest("edge-a", decode_heartbeat(_heartbeat("edge-a", A, _model("int8-x", "measured", A))))
        assert first.get(("m", "1"), A) is None  # queued, not yet stored: not kept
        for _ in range(200):
            await asyncio.sleep(0.005)
            if first.get(("m", "1"), A) is not None:
                break
        second.harvest("edge-b", decode_heartbeat(_heartbeat("edge-b", A, _model("fp32", "measured", A))))
        for _ in range(200):
            await asyncio.sleep(0.005)
            if second.get(("m", "1"), A) is not None:
                break
        return first, second

    try:
        first, second = asyncio.run(run())
    finally:
        calls.close()
    mine, taken = first.get(("m", "1"), A), second.get(("m", "1"), A)
    assert mine is not None and mine.artifact == "int8-x"
    assert taken is not None and (taken.artifact, taken.node_id) == ("int8-x", "edge-a")
    assert threads and all(t.startswith("store") for t in threads)
