"""Fencing: a write checks, in its own transaction, that its epoch is still current; the
takeover's epoch bump waits for writes already under way, so none lands after it."""

from __future__ import annotations

import threading

import psycopg
import pytest

from central.ha.fencing import Fenced, check_leader_epoch, check_partition_epoch


def test_a_stale_partition_epoch_is_fenced_and_the_current_one_passes(ha_url: str) -> None:
    with psycopg.connect(ha_url, autocommit=True) as conn:
        conn.execute("INSERT INTO ha_partitions (partition, epoch, replica_id) VALUES (7, 3, 'r1')")
        with conn.transaction():
            check_partition_epoch(conn, 7, 3)
        with conn.transaction(), pytest.raises(Fenced, match="partition 7"):
            check_partition_epoch(conn, 7, 2)
        with conn.transaction(), pytest.raises(Fenced):
            check_partition_epoch(conn, 8, 1)  # never owned


def test_a_takeover_waits_for_the_write_under_way_then_fences_the_next(ha_url: str) -> None:
    with psycopg.connect(ha_url, autocommit=True) as old, psycopg.connect(ha_url, autocommit=True) as new:
        epoch = int(old.execute("UPDATE ha_leader SET epoch = epoch + 1 RETURNING epoch").fetchone()[0])  # type: ignore[index]
        bumped = threading.Event()

        def take_over() -> None:
            new.execute("UPDATE ha_leader SET epoch = epoch + 1 WHERE id = 1")
            bumped.set()

        with old.transaction():
            check_leader_epoch(old, epoch)
            taker = threading.Thread(target=take_over)
            taker.start()
            assert not bumped.wait(0.3), "the bump waited for the write in flight"
        taker.join(10)
        assert bumped.is_set()
        with old.transaction(), pytest.raises(Fenced, match="no longer leads"):
            check_leader_epoch(old, epoch)
