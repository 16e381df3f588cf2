"""The heartbeat partition central last named, kept in ``heartbeat-partition.json``.

A replicated central follows only the partitioned topics (``<prefix>/p/<n>/nodes/…``), and an
edge learns its partition from the ``Register`` reply. Without a record of it, an edge that
boots while no replica answers would announce itself on the plain topics, which no replica
follows: once a replica is back it would not hear the node until the node registered again.
So every Register reply that names a partition (or says there is none) is written here,
atomically, and the edge starts on what this file says until a reply says otherwise.

The file holds ``{"partitions": n, "partition": k}``; ``partitions`` 0 means unpartitioned
(a single central). An unreadable or inconsistent file is ignored (logged): the edge then
starts on the plain topics, as it did before this file existed."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from fleetwire.signing import write_atomic

__all__ = ["PARTITION_FILE", "PartitionRecord", "SavedPartition"]

log = logging.getLogger(__name__)

#: File name under the data dir.
PARTITION_FILE = "heartbeat-partition.json"


@dataclass(frozen=True)
class PartitionRecord:
    """What a Register reply said about heartbeat partitions."""

    #: How many partitions central splits its nodes into; 0: unpartitioned (a single central).
    partitions: int
    #: This node's partition (``0 <= partition < partitions``); ignored when unpartitioned.
    partition: int

    @property
    def heartbeat_partition(self) -> int | None:
        """The partition to publish on; None: the plain topics."""
        return self.partition if self.partitions > 0 else None


class SavedPartition:
    """The last ``PartitionRecord`` a Register reply gave, in one small JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def in_dir(cls, data_dir: Path) -> SavedPartition:
        """The record at ``data_dir/heartbeat-partition.json``."""
        return cls(Path(data_dir) / PARTITION_FILE)

    def load(self) -> PartitionRecord | None:
        """The record kept, or None when there is none or it cannot be read."""
        try:
            body = json.loads(self.path.read_text())
            record = PartitionRecord(int(body["partitions"]), int(body["partition"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring unreadable heartbeat partition file %s: %s", self.path, exc)
            return None
        if record.partitions < 0 or (record.partitions > 0 and not 0 <= record.partition < record.partitions):
            log.warning("ignoring heartbeat partition file %s: partition %s of %s", self.path, *_pair(record))
            return None
        return record

    def save(self, record: PartitionRecord) -> None:
        """Keep ``record`` (temp file, fsync, rename); a write that fails is logged, not raised:
        the partition still holds in memory, only a cold boot without central loses it."""
        body = json.dumps({"partitions": record.partitions, "partition": record.partition})
        try:
            write_atomic(self.path, body.encode(), 0o644)
        except OSError as exc:
            log.warning("cannot record the heartbeat partition in %s: %s", self.path, exc)


def _pair(record: PartitionRecord) -> tuple[int, int]:
    return record.partition, record.partitions
