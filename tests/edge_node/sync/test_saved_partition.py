"""The heartbeat partition a Register reply named, kept in the data dir: written whole, read
back, and a file that cannot be trusted ignored (the edge then starts on the plain topics)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_node.sync.saved_partition import PARTITION_FILE, PartitionRecord, SavedPartition


def test_a_record_is_kept_and_read_back(tmp_path: Path) -> None:
    saved = SavedPartition.in_dir(tmp_path / "data")
    assert saved.load() is None
    saved.save(PartitionRecord(partitions=8, partition=5))
    assert saved.load() == PartitionRecord(8, 5) and saved.load().heartbeat_partition == 5  # type: ignore[union-attr]
    saved.save(PartitionRecord(partitions=0, partition=0))  # a single central: unpartitioned
    assert SavedPartition.in_dir(tmp_path / "data").load() == PartitionRecord(0, 0)
    assert PartitionRecord(0, 0).heartbeat_partition is None
    assert [p.name for p in (tmp_path / "data").iterdir()] == [PARTITION_FILE]  # no temp file left


@pytest.mark.parametrize(
    "text",
    ["", "{", "[]", '{"partitions": 8}', '{"partitions": 8, "partition": 8}', '{"partitions": -1, "partition": 0}'],
)
def test_a_file_that_cannot_be_trusted_is_ignored(tmp_path: Path, text: str) -> None:
    (tmp_path / PARTITION_FILE).write_text(text)
    assert SavedPartition.in_dir(tmp_path).load() is None
