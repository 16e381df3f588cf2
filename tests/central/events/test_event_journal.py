"""The event log's journal on a real SQLite file and on a real PostgreSQL database: it keeps the last N events across a
clean close and a SIGKILL, numbering goes on without ever repeating a number, and
pruning keeps the file at N (plus a small batch) rows."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from central.events import RESERVE_AHEAD, EventJournal, EventLog
from central.settings import CentralSettings
from central.storage.protocols import JournalDB
from central.storage.sqlite.events import SQLiteJournalDB
from fleetwire.mqtt.payloads import Event


class Where:
    """One journal's storage: ``central.sqlite3`` in a temp dir, or a fresh PostgreSQL database."""

    def __init__(self, path: Path, url: str | None) -> None:
        self.path, self.url = path, url

    def target(self) -> JournalDB:
        if self.url is None:
            return SQLiteJournalDB(self.path)
        from central.storage.postgres.events import PostgresJournalDB

        return PostgresJournalDB(self.url)

    def rows(self) -> list[int]:
        if self.url is None:
            if not self.path.exists():
                return []
            with sqlite3.connect(self.path) as db:
                return [r[0] for r in db.execute("SELECT seq FROM events ORDER BY seq")]
        import psycopg

        with psycopg.connect(self.url) as conn:
            return [r[0] for r in conn.execute("SELECT seq FROM events ORDER BY seq")]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.fleet)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return Where(tmp_path / "central.sqlite3", url)


def _log(where: Where, kept: int) -> EventLog:
    return EventLog(kept, journal=EventJournal(where.target(), kept, flush_interval_s=0.02, flush_max_events=100))


def test_pruning_keeps_the_last_n_and_numbering_goes_on_after_a_clean_restart(where: Where) -> None:
    log = _log(where, kept=50)
    assert log.journal is not None and log.journal.previous_stop is None  # a new journal
    for i in range(1000):
        log.append(Event(type="node_alive", ts=i, node_id=f"n{i}"))
    log.journal.close()

    on_disk = where.rows()
    assert on_disk[-1] == 1000 and len(on_disk) <= 50 + 100  # pruned in batches, never below the last 50
    assert on_disk[-50:] == list(range(951, 1001))

    again = _log(where, kept=50)
    assert again.journal is not None and again.journal.previous_stop == "clean"
    restored = again.last()
    assert [e.seq for e in restored] == list(range(951, 1001))
    assert restored[-1] == Event(type="node_alive", ts=999, node_id="n999", seq=1000)
    assert again.append(Event(type="central_started", ts=1)).seq == 1001  # no gap after a clean stop
    assert [e.seq for e in again.since(998, 10)] == [999, 1000, 1001]  # a page after a given seq
    assert [e.seq for e in again.since(0, 2)] == [952, 953]  # the oldest are gone (50 kept)
    again.journal.close()


_WRITER = """
    import sys, time
    from pathlib import Path
    from central.events import EventJournal, EventLog
    from central.storage.sqlite.events import SQLiteJournalDB
    from fleetwire.mqtt.payloads import Event

    if sys.argv[1].startswith("postgresql://"):
        from central.storage.postgres.events import PostgresJournalDB
        target = PostgresJournalDB(sys.argv[1])
    else:
        target = SQLiteJournalDB(Path(sys.argv[1]))
    log = EventLog(100, journal=EventJournal(target, 100, flush_interval_s=0.02))
    for i in range(30):
        log.append(Event(type="node_dead", ts=i, node_id=f"n{i}"))
    print("appended", flush=True)
    time.sleep(60)
"""


def test_events_survive_a_sigkill_and_no_number_is_used_twice(where: Where) -> None:
    command = [sys.executable, "-c", textwrap.dedent(_WRITER), where.url or str(where.path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as writer:
        try:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "appended"
            for _ in range(200):  # the writer thread commits within its flush interval
                if len(where.rows()) == 30:
                    break
                time.sleep(0.02)
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(timeout=10)

    log = _log(where, kept=100)
    assert log.journal is not None and log.journal.previous_stop == "unclean"
    assert [(e.seq, e.node_id) for e in log.last()] == [(i + 1, f"n{i}") for i in range(30)]
    # Numbers handed out but maybe not written before the kill are never handed out again.
    after = log.append(Event(type="central_started", ts=1))
    assert after.seq is not None and after.seq > 30 + RESERVE_AHEAD // 2
    log.journal.close()


def test_the_older_setting_name_still_sets_how_many_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_MQTT__EVENTS_KEPT", "7")
    with pytest.warns(FutureWarning, match=r"mqtt\.events_kept .*use events\.kept"):
        assert CentralSettings().events.kept == 7
    monkeypatch.setenv("MODELFLEET_EVENTS__KEPT", "9")  # the newer name wins
    with pytest.warns(FutureWarning, match="events.kept is set too and wins"):
        assert CentralSettings().events.kept == 9
