"""A finished chat turn, as its next prompt will begin, is cached while the engine has nothing
else to prefill (``turn_warm_tokens``): the next turn then runs only its own new tokens."""

from __future__ import annotations

from edge_node.generation import GenerationEngine, SamplingParams
from support.generation import EngineFactory, collect, prompt_of, tokens_of
from support.wait import wait_for

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def reencoded(engine: GenerationEngine, prompt: list[int], reply_ids: list[int]) -> list[int]:
    """The prompt and the reply as its text encodes again (what a client sends back)."""
    return [*prompt, *engine.tokenizer.encode(engine.tokenizer.decode(reply_ids), add_special_tokens=False)]


async def warmed(engine: GenerationEngine, ids: list[int], before: int) -> None:
    engine.warm(ids)
    await wait_for(lambda: engine.stats().warmed_tokens > before, what="the turn warmed", timeout=30)


async def test_a_warmed_turn_leaves_only_the_new_tokens_to_run_and_the_same_answer(make_engine: EngineFactory) -> None:
    cold = await make_engine(prefix_cache=False, block_tokens=16)
    engine = await make_engine(block_tokens=16)
    first = prompt_of(engine, 103)
    reply = tokens_of(await collect(engine, first, GREEDY))
    history = reencoded(engine, first, reply)
    assert history[: len(first) + len(reply)] != [*first, *reply]  # the text departs from the ids generated
    nxt = [*history, *prompt_of(engine, 20, salt=3)]

    before = engine.stats()
    await warmed(engine, history, before.warmed_tokens)
    after = engine.stats()
    # what the cache lacked: from the last whole block the first turn cached to the history's end
    assert 0 < after.warmed_tokens - before.warmed_tokens <= len(history) - 96
    assert after.warm_seconds > before.warm_seconds
    # warming is not a prompt: no prompt tokens, no prefix lookups counted
    assert (after.prompt_tokens, after.prefix_queries, after.prefix_hits) == (
        before.prompt_tokens, before.prefix_queries, before.prefix_hits)  # fmt: skip

    steps = await collect(engine, nxt, GREEDY)
    # the history's whole blocks and the part block it ends with (a tail): only the new tokens run
    assert steps[0].cached_tokens == len(history) and len(history) % 16
    assert engine.stats().prefilled_tokens - after.prefilled_tokens == len(nxt) - len(history)
    assert tokens_of(steps) == tokens_of(await collect(cold, nxt, GREEDY))


async def test_a_turn_missing_more_than_the_limit_is_left_alone(make_engine: EngineFactory) -> None:
    engine = await make_engine(block_tokens=16, turn_warm_tokens=16)
    far = prompt_of(engine, 200, salt=5)  # nothing of it cached: 200 tokens missing, over 16
    near = prompt_of(engine, 16, salt=6)  # one block missing: within the limit, and warmed after ``far``
    engine.warm(far)
    await warmed(engine, near, 0)
    assert engine.stats().warmed_tokens == 16
    steps = await collect(engine, far, GREEDY)
    assert steps[0].cached_tokens == 0


async def test_warming_off_or_without_a_prefix_cache_does_nothing(make_engine: EngineFactory) -> None:
    for settings in ({"turn_warm_tokens": 0}, {"prefix_cache": False}):
        engine = await make_engine(block_tokens=16, **settings)
        prompt = prompt_of(engine, 40)
        engine.warm(prompt)
        engine.warm([engine.spec.vocab_size + 1] * 40)  # out of range: ignored, never a failed step
        steps = await collect(engine, [*prompt, *prompt_of(engine, 8, salt=2)], GREEDY)
        assert engine.stats().warmed_tokens == 0 and steps[0].cached_tokens == 0


async def test_more_warm_requests_than_rows_never_fail_a_stream(make_engine: EngineFactory) -> None:
    engine = await make_engine(block_tokens=16, max_batch=2)
    first = prompt_of(engine, 60)
    reply = tokens_of(await collect(engine, first, GREEDY))
    history = reencoded(engine, first, reply)
    for _ in range(5):  # more warm requests than rows, between streams
        engine.warm(history)
    runs = [await collect(engine, [*history, *prompt_of(engine, 10, salt=s)], GREEDY) for s in range(3)]
    assert all(len(tokens_of(r)) == 24 and r[-1].finish_reason == "length" for r in runs)
    assert engine.stats().kv_blocks_used <= engine.stats().kv_blocks_total


async def test_a_warm_request_waits_for_a_free_row_instead_of_being_dropped(make_engine: EngineFactory) -> None:
    engine = await make_engine(block_tokens=16, max_batch=1)
    first = prompt_of(engine, 60)
    reply = tokens_of(await collect(engine, first, GREEDY))
    history = reencoded(engine, first, reply)
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    stream = engine.generate(prompt_of(engine, 20, salt=4), long, "busy")
    await anext(stream)  # the only row decodes: no room to warm in
    engine.warm(history)
    rest = [step async for step in stream]
    assert rest[-1].finish_reason == "length"
    await wait_for(lambda: engine.stats().warmed_tokens > 0, what="the turn warmed once the row was free", timeout=30)


async def test_a_longer_end_than_the_tail_cached_is_warmed_again(make_engine: EngineFactory) -> None:
    engine = await make_engine(block_tokens=16)
    history = prompt_of(engine, 45)  # two whole blocks and 13 tokens
    await warmed(engine, history[:-10], 0)  # the same blocks, a 3-token tail
    before = engine.stats().warmed_tokens
    await warmed(engine, history, before)
    assert engine.stats().warmed_tokens - before == 13
    steps = await collect(engine, [*history, *prompt_of(engine, 5, salt=8)], GREEDY)
    assert steps[0].cached_tokens == 45


async def test_a_failed_warm_run_is_dropped_and_the_streams_beside_it_go_on(make_engine: EngineFactory) -> None:
    engine = await make_engine(block_tokens=16)
    long = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True)
    stream = engine.generate(prompt_of(engine, 20, salt=4), long, "beside")
    await anext(stream)
    # ids the model cannot embed, past the engine's own check: the warm run fails on the engine thread
    engine._scheduler.warm([engine.spec.vocab_size + 7] * 40)
    rest = [step async for step in stream]
    assert rest[-1].finish_reason == "length" and len(rest) == 119
    await warmed(engine, prompt_of(engine, 40, salt=9), 0)  # and warming still works
