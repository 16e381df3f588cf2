"""The fleet-wide event log: what happened to nodes, models and rollouts, numbered, kept in
memory for the API and the dashboard, journaled by ``storage`` so it survives restarts."""

from __future__ import annotations

from central.events.journal import RESERVE_AHEAD, EventJournal, PreviousStop
from central.events.log import EventLog, operator_event
from central.settings import EventLogSettings
from central.storage.protocols import JournalDB

__all__ = ["RESERVE_AHEAD", "EventJournal", "EventLog", "PreviousStop", "create_event_log", "operator_event"]


def create_event_log(settings: EventLogSettings, db: JournalDB | None) -> EventLog:
    """The event log, restored from and journaled to ``db`` (None: memory only, ``events.persist`` off)."""
    if db is None:
        return EventLog(settings.kept)
    journal = EventJournal(
        db, settings.kept, flush_interval_s=settings.flush_interval_s, flush_max_events=settings.flush_max_events
    )
    return EventLog(settings.kept, journal=journal)
