"""Stores that keep nothing beyond this process: the shadow counts of a single central (its
own heartbeats, judged by itself; edges report counts since their load, so a restart loses
nothing they would not bring back) and decision records for tests of one component."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from central.storage.protocols import ShadowCountRow

__all__ = ["LocalShadowCounts", "MemoryDecisionRecords"]


class LocalShadowCounts:
    """``ShadowCounts`` within one process: what ``put`` noted, ``changed`` hands over."""

    def __init__(self) -> None:
        self._rows: dict[str, dict[tuple[str, str, str, str], ShadowCountRow]] = {}

    def put(self, kind: str, rows: Iterable[ShadowCountRow]) -> None:
        """Note the latest counts of each (version, candidate, node)."""
        latest = self._rows.setdefault(kind, {})
        for r in rows:
            latest[(r.model, r.version, r.candidate, r.node_id)] = r

    def flush(self) -> None:
        """Nothing to write."""

    def changed(self, kind: str) -> list[ShadowCountRow]:
        """What was put since the last call."""
        return list(self._rows.pop(kind, {}).values())


class MemoryDecisionRecords:
    """``DecisionRecords`` in memory (nothing survives the process)."""

    def __init__(self) -> None:
        self._records: dict[str, dict[str, Any]] = {}

    def load(self, kind: str) -> dict[str, Any]:
        """Every record of ``kind`` (copies, as a database would give)."""
        return json.loads(json.dumps(self._records.get(kind, {})))

    def write(
        self,
        kind: str,
        puts: Mapping[str, Any],
        deletes: Iterable[str] = (),
        *,
        fence: int | None = None,
        also: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Upsert and delete."""
        records = self._records.setdefault(kind, {})
        for key in deletes:
            records.pop(key, None)
        records.update(json.loads(json.dumps(dict(puts))))
        for other, rows in (also or {}).items():
            self._records.setdefault(other, {}).update(json.loads(json.dumps(dict(rows))))

    def add(self, kind: str, key: str, body: Any) -> bool:
        """First wins."""
        records = self._records.setdefault(kind, {})
        if key in records:
            return False
        records[key] = json.loads(json.dumps(body))
        return True

    def close(self) -> None:
        """Nothing to release."""
