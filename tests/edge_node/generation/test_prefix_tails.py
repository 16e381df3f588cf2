"""The prefix cache's tails: part blocks after a chain of whole ones, found by the longest that a
prompt goes on with, evicted before their parents, each taking a block of the budget."""

from __future__ import annotations

import numpy as np
import pytest

from edge_node.generation.prefix_cache import PrefixCache


def kv(n: int, mark: float) -> np.ndarray:
    """A stand-in KV of ``n`` tokens ([layers, 2, heads, n, head]) tagged with ``mark``."""
    return np.full((1, 2, 1, n, 2), mark, np.float32)


def cached(tokens: list[int], blocks: int, size: int = 4) -> PrefixCache:
    cache = PrefixCache(size)
    cache.store(tokens, {i: kv(size, i) for i in range(blocks)})
    return cache


def test_the_longest_tail_a_prompt_goes_on_with_is_found_within_the_limit() -> None:
    tokens = list(range(8))  # two whole blocks of 4
    cache = cached(tokens, 2)
    cache.store_tail([*tokens, 8], 2, kv(1, 10))
    cache.store_tail([*tokens, 8, 9, 10], 2, kv(3, 30))
    cache.store_tail([*tokens, 7, 7], 2, kv(2, 20))
    assert len(cache) == 5

    found = cache.tail([*tokens, 8, 9, 10, 11, 12], 2, most=5)
    assert found is not None and found.shape[3] == 3 and found[0, 0, 0, 0, 0] == 30
    shorter = cache.tail([*tokens, 8, 9, 10, 11], 2, most=2)  # the 3-token tail is over the limit
    assert shorter is not None and shorter.shape[3] == 1
    assert cache.tail([*tokens, 9, 9, 9], 2, most=3) is None  # departs at the first token
    assert cache.tail([0, 1, 2, 9, 8, 9, 10], 1, most=3) is None  # another parent


def test_tails_go_before_their_parents_and_leave_no_count_behind() -> None:
    tokens = list(range(8))
    cache = cached(tokens, 2)
    cache.store_tail([*tokens, 8, 9], 2, kv(2, 1))
    cache.store_tail([*tokens, 5, 5], 2, kv(2, 2))  # same length, other tokens: both kept
    assert cache.tail([*tokens, 5, 5, 1], 2, most=2) is not None
    assert cache.evict() and cache.evict()  # the two tails are older than the chain they hang on
    assert len(cache) == 2 and cache.tail([*tokens, 8, 9, 1], 2, most=2) is None
    assert cache.lookup([*tokens, 1], 2) and not cache._tails  # both whole blocks stay; no stale length
    cache.clear()
    assert len(cache) == 0


def test_a_tail_under_no_whole_block_hangs_on_the_root() -> None:
    cache = PrefixCache(4)
    cache.store_tail([3, 1, 4], 0, kv(3, 7))
    found = cache.tail([3, 1, 4, 1, 5], 0, most=4)
    assert found is not None and found.shape[3] == 3


@pytest.mark.parametrize("part", [0, 4])
def test_a_tail_is_less_than_a_block(part: int) -> None:
    with pytest.raises(ValueError, match="a tail holds 1 to 3 tokens"):
        PrefixCache(4).store_tail(list(range(4 + part)), 1, kv(part, 0))
