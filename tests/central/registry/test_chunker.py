"""Chunker: FastCDC cut points that depend on content, within the configured bounds."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from central.registry.chunker import Chunker
from central.settings import ChunkingSettings

AVG, MIN, MAX = 64 * 1024, 16 * 1024, 256 * 1024


def settings(avg: int = AVG, min_: int = MIN, max_: int = MAX) -> ChunkingSettings:
    return ChunkingSettings(avg_bytes=avg, min_bytes=min_, max_bytes=max_)


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def digests(chunks: list[bytes]) -> list[str]:
    return [hashlib.sha256(c).hexdigest() for c in chunks]


@pytest.fixture(scope="module")
def eight_mb() -> bytes:
    return random_bytes(8 * 1024 * 1024, seed=1)


def test_concatenation_equals_input(tmp_path: Path, eight_mb: bytes) -> None:
    chunks = list(Chunker(settings()).cut(write(tmp_path, "f", eight_mb)))
    assert all(isinstance(c, bytes) for c in chunks)
    assert b"".join(chunks) == eight_mb


def test_deterministic_across_instances(tmp_path: Path, eight_mb: bytes) -> None:
    path = write(tmp_path, "f", eight_mb)
    chunker = Chunker(settings())
    first = digests(list(chunker.cut(path)))
    assert digests(list(chunker.cut(path))) == first, "the same instance twice"
    assert digests(list(Chunker(settings()).cut(path))) == first, "a fresh instance"
    # Same content under another name: same cuts.
    assert digests(list(Chunker(settings()).cut(write(tmp_path, "copy", eight_mb)))) == first


def test_sizes_within_bounds_except_the_last(tmp_path: Path, eight_mb: bytes) -> None:
    sizes = [len(c) for c in Chunker(settings()).cut(write(tmp_path, "f", eight_mb))]
    assert len(sizes) > 50
    assert all(MIN <= s <= MAX for s in sizes[:-1]), (min(sizes[:-1]), max(sizes[:-1]))
    assert 0 < sizes[-1] <= MAX


def test_average_is_near_the_configured_average(tmp_path: Path, eight_mb: bytes) -> None:
    sizes = [len(c) for c in Chunker(settings()).cut(write(tmp_path, "f", eight_mb))]
    average = sum(sizes) / len(sizes)
    assert 0.7 * AVG <= average <= 1.3 * AVG, f"average chunk {average:.0f} B, configured {AVG} B"


@pytest.mark.parametrize(("avg", "min_", "max_"), [(1024 * 1024, 256 * 1024, 4 * 1024 * 1024), (16384, 4096, 65536)])
def test_average_for_other_settings(tmp_path: Path, avg: int, min_: int, max_: int) -> None:
    data = random_bytes(max(8 * 1024 * 1024, 100 * avg), seed=2)
    sizes = [len(c) for c in Chunker(settings(avg, min_, max_)).cut(write(tmp_path, "f", data))]
    average = sum(sizes) / len(sizes)
    assert 0.7 * avg <= average <= 1.3 * avg, f"average chunk {average:.0f} B, configured {avg} B"
    assert all(min_ <= s <= max_ for s in sizes[:-1])


def test_small_and_empty_files(tmp_path: Path) -> None:
    chunker = Chunker(settings())
    assert list(chunker.cut(write(tmp_path, "empty", b""))) == []
    small = random_bytes(1000, seed=3)
    assert list(chunker.cut(write(tmp_path, "small", small))) == [small]
    exactly_min = random_bytes(MIN, seed=4)
    assert b"".join(chunker.cut(write(tmp_path, "min", exactly_min))) == exactly_min


def test_inserting_bytes_near_the_start_changes_only_the_first_chunks(tmp_path: Path, eight_mb: bytes) -> None:
    chunker = Chunker(settings())
    before = digests(list(chunker.cut(write(tmp_path, "a", eight_mb))))
    edited = eight_mb[:1000] + b"\xde\xad\xbe\xef\x00\x01\x02" + eight_mb[1000:]
    after = digests(list(chunker.cut(write(tmp_path, "b", edited))))
    shared = set(before) & set(after)
    # Every chunk but the first one or two survives the shift.
    assert len(shared) >= len(before) - 2, (len(shared), len(before))
    assert after[-len(shared) :] == before[-len(shared) :], "the tail of the file is cut identically"
    assert before[0] != after[0]


def test_changing_bytes_in_the_middle_keeps_the_rest(tmp_path: Path, eight_mb: bytes) -> None:
    chunker = Chunker(settings())
    before = digests(list(chunker.cut(write(tmp_path, "a", eight_mb))))
    middle = len(eight_mb) // 2
    edited = eight_mb[:middle] + bytes(b ^ 0xFF for b in eight_mb[middle : middle + 100]) + eight_mb[middle + 100 :]
    after = digests(list(chunker.cut(write(tmp_path, "b", edited))))
    assert len(set(before) - set(after)) <= 3
    assert len(set(before) & set(after)) >= len(before) - 3


def test_fixed_size_cutting_would_not_dedupe_the_shift(tmp_path: Path, eight_mb: bytes) -> None:
    """Sanity check of the test above: offsets-based chunks share nothing after an insert."""
    edited = b"\x00" + eight_mb

    def fixed(data: bytes) -> set[str]:
        return set(digests([data[i : i + AVG] for i in range(0, len(data), AVG)]))

    assert not fixed(eight_mb) & fixed(edited)
    chunker = Chunker(settings())
    cdc_before = set(digests(list(chunker.cut(write(tmp_path, "a", eight_mb)))))
    cdc_after = set(digests(list(chunker.cut(write(tmp_path, "b", edited)))))
    assert len(cdc_before & cdc_after) >= len(cdc_before) - 2


@pytest.mark.parametrize(
    ("avg", "min_", "max_"),
    [
        (64 * 1024, 32 * 1024, 256 * 1024),
        (64 * 1024, 16 * 1024, 64 * 1024),
        (2 * 1024 * 1024, 1024 * 1024, 4 * 1024 * 1024),
        (512, 64, 1024),
    ],
)
def test_every_valid_setting_makes_a_working_chunker(tmp_path: Path, avg: int, min_: int, max_: int) -> None:
    """ChunkingSettings accepted these bounds, so central must be able to start with them."""
    s = settings(avg, min_, max_)
    data = random_bytes(4 * 1024 * 1024, seed=5)
    sizes = [len(c) for c in Chunker(s).cut(write(tmp_path, "f", data))]
    assert sum(sizes) == len(data)
    assert all(min_ <= x <= max_ for x in sizes[:-1])


@pytest.mark.parametrize(
    ("avg", "min_", "max_", "message"),
    [
        (64 * 1024, 48 * 1024, 256 * 1024, "at least twice"),
        (64 * 1024, 64 * 1024, 256 * 1024, "at least twice"),
        (4 * 1024 * 1024, 2 * 1024 * 1024, 8 * 1024 * 1024, "min_bytes"),
        (256, 64, 512, "max_bytes"),
        (64 * 1024, 16 * 1024, 32 * 1024, "min_bytes <= avg_bytes <= max_bytes"),
    ],
)
def test_settings_that_fastcdc_cannot_honour_are_refused_up_front(avg: int, min_: int, max_: int, message: str) -> None:
    """Central must fail at settings validation with a clear message, not with a traceback later."""
    with pytest.raises(ValidationError, match=message):
        settings(avg, min_, max_)
