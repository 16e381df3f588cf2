"""A prompt prefix seen before is not prefilled again, and gives the same tokens."""

from __future__ import annotations

import asyncio

from edge_node.generation import GenerationEngine, SamplingParams
from support.generation import EngineFactory, collect, prompt_of, tokens_of

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


async def test_a_cached_prefix_skips_its_prefill_and_yields_the_same_tokens(make_engine: EngineFactory) -> None:
    cold = await make_engine(prefix_cache=False, block_tokens=16)
    cached = await make_engine(block_tokens=16)
    system = prompt_of(cached, 100)
    first, second = [*system, *prompt_of(cached, 9, salt=1)], [*system, *prompt_of(cached, 13, salt=2)]

    await collect(cached, first, GREEDY)
    before = cached.stats()
    steps = await collect(cached, second, GREEDY)
    after = cached.stats()

    assert tokens_of(steps) == tokens_of(await collect(cold, second, GREEDY))
    assert steps[0].cached_tokens == 96  # six whole blocks of the shared 100 tokens
    assert after.prefilled_tokens - before.prefilled_tokens == len(second) - 96
    assert after.prefix_hits - before.prefix_hits == 6
    assert after.prefix_queries - before.prefix_queries == (len(second) - 1) // 16


async def test_a_whole_prompt_in_the_cache_still_runs_its_last_token(engine: GenerationEngine) -> None:
    prompt = prompt_of(engine, 64)  # exactly two default blocks of 32
    again = [await collect(engine, prompt, GREEDY) for _ in range(2)]
    assert tokens_of(again[0]) == tokens_of(again[1])
    assert again[1][0].cached_tokens == 32  # the second block holds the token whose logits are needed


async def test_the_cache_gives_way_to_reservations_within_the_budget(make_engine: EngineFactory) -> None:
    engine = await make_engine(kv_budget_tokens=512, block_tokens=32)
    for salt in range(6):  # fill the cache with prompts nobody asks for again
        await collect(engine, prompt_of(engine, 120, salt=salt), SamplingParams(max_tokens=4))
    assert engine.stats().kv_blocks_used > 0
    big = SamplingParams(max_tokens=380, temperature=0, ignore_eos=True)  # 12 + 380 tokens: 13 of 16 blocks
    steps = await asyncio.wait_for(collect(engine, prompt_of(engine, 12, salt=9), big), timeout=30)
    assert len(tokens_of(steps)) == 380
    assert engine.stats().kv_blocks_used <= engine.stats().kv_blocks_total


async def test_a_burst_sharing_a_prefix_computes_it_once_and_each_gets_its_own_tokens(
    make_engine: EngineFactory,
) -> None:
    cold = await make_engine(prefix_cache=False, block_tokens=16)
    engine = await make_engine(block_tokens=16, prefill_chunk_tokens=64)
    system = prompt_of(engine, 100)
    prompts = [[*system, *prompt_of(engine, 9 + 4 * i, salt=i + 1)] for i in range(4)]

    before = engine.stats()
    together = await asyncio.gather(*(collect(engine, p, GREEDY) for p in prompts))
    after = engine.stats()

    for prompt, steps in zip(prompts, together, strict=True):
        assert tokens_of(steps) == tokens_of(await collect(cold, prompt, GREEDY))
    # one of them computed the six whole blocks of the shared 100 tokens; the others took them
    assert sorted(s[0].cached_tokens for s in together) == [0, 96, 96, 96]
    assert after.prefilled_tokens - before.prefilled_tokens == sum(len(p) for p in prompts) - 3 * 96
