"""Rollouts and each model's stable version on SQLite (the ``releases`` and ``rollouts`` tables
of ``central.sqlite3``), so a restarted central serves the same versions and resumes its rollouts.

``releases`` holds, per model, the version every node serves unless a rollout says
otherwise (``stable``) and ``epoch``: the highest rollout id a plain push superseded."""

from __future__ import annotations

from pathlib import Path

from central.rollout.model import Rollout
from central.storage.protocols import Release
from central.storage.sqlite.database import SQLiteDatabase, database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS releases (
    model TEXT PRIMARY KEY,
    stable TEXT,
    epoch INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rollouts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rollouts_by_model ON rollouts (model, id);
"""


class SQLiteRolloutStore:
    """``RolloutRecords`` on a SQLite file (or ``central.sqlite3``'s shared connection, so that a
    release written inside a push's transaction commits with its version); thread-safe."""

    def __init__(self, target: Path | SQLiteDatabase) -> None:
        self._db = database(target)
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Done with the connection (closed with its last user)."""
        self._db.release()

    def releases(self) -> dict[str, Release]:
        """Every model's release pointer, by model."""
        rows = self._db.query("SELECT model, stable, epoch FROM releases")
        return {r[0]: Release(r[0], r[1], int(r[2])) for r in rows}

    def set_release(self, model: str, stable: str | None, epoch: int) -> None:
        """Point ``model`` at ``stable``; rollouts with an id up to ``epoch`` no longer apply."""
        self._db.execute(
            "INSERT INTO releases (model, stable, epoch) VALUES (?, ?, ?)"
            " ON CONFLICT (model) DO UPDATE SET stable = excluded.stable, epoch = excluded.epoch",
            (model, stable, epoch),
        )

    def insert(self, rollout: Rollout) -> Rollout:
        """Store a new rollout; returns it with its id."""
        with self._db.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO rollouts (model, state, body) VALUES (?, ?, '{}')", (rollout.model, rollout.state)
            )
            stored = rollout.model_copy(update={"id": int(cur.lastrowid or 0)})
            conn.execute("UPDATE rollouts SET body = ? WHERE id = ?", (stored.model_dump_json(), stored.id))
        return stored

    def update(self, rollout: Rollout, fence: int | None = None) -> None:
        """Persist a rollout's new state and progress (one process writes them: no revision to
        check, no epoch to fence)."""
        self._db.execute(
            "UPDATE rollouts SET state = ?, body = ? WHERE id = ?",
            (rollout.state, rollout.model_dump_json(), rollout.id),
        )

    def all(self) -> list[Rollout]:
        """Every rollout, oldest first."""
        return [Rollout.model_validate_json(r[0]) for r in self._db.query("SELECT body FROM rollouts ORDER BY id")]

    def max_id(self, model: str) -> int:
        """The highest rollout id of ``model`` (0 when none)."""
        rows = self._db.query("SELECT COALESCE(MAX(id), 0) FROM rollouts WHERE model = ?", (model,))
        return int(rows[0][0])
