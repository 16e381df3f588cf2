"""Stop strings, EOS, cancellation, the KV budget and bad parameters."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from edge_node.generation import (
    BadSampling,
    ContextTooLong,
    GenerationEngine,
    Overloaded,
    SamplingParams,
)
from support.generation import EngineFactory, collect, prompt_of, text_of, tokens_of
from support.wait import wait_for


async def test_a_stop_string_ends_the_stream_and_is_never_emitted(engine: GenerationEngine) -> None:
    prompt = prompt_of(engine, 16)
    free = text_of(await collect(engine, prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)))
    stop = free[12:15]
    assert stop and stop in free
    steps = await collect(
        engine, prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, stop=["\x00never", stop])
    )
    assert text_of(steps) == free[: free.index(stop)]
    assert steps[-1].finish_reason == "stop"
    assert all(stop not in s.text for s in steps)


async def test_eos_ends_the_stream_unless_ignored(engine: GenerationEngine) -> None:
    prompt = prompt_of(engine, 8)
    eos = engine.spec.eos_token_ids[0]
    # random weights: sample near-uniformly (1 in 512 is EOS) until a seed meets it
    for seed in range(60):
        steps = await collect(engine, prompt, SamplingParams(max_tokens=300, temperature=50.0, seed=seed))
        if steps[-1].finish_reason == "stop":
            break
    assert steps[-1].finish_reason == "stop", "no seed met EOS"
    assert steps[-1].token_ids == (eos,)
    assert text_of(steps) == engine.tokenizer.decode(tokens_of(steps))  # EOS adds no text
    assert eos not in tokens_of(steps)[:-1]
    ignored = await collect(
        engine, prompt, SamplingParams(max_tokens=300, temperature=50.0, seed=seed, ignore_eos=True)
    )
    assert ignored[-1].finish_reason == "length"
    assert tokens_of(ignored)[: len(steps)] == tokens_of(steps)


async def test_cancelled_streams_leave_no_slot_or_kv_block_taken(make_engine: EngineFactory) -> None:
    engine = await make_engine(prefix_cache=False, max_batch=8, max_waiting=200)
    params = SamplingParams(max_tokens=500, temperature=0.7, ignore_eos=True)

    async def read_two_then_close(i: int) -> None:
        stream = engine.generate(prompt_of(engine, 5 + i % 20, salt=i), params, f"c{i}")
        async for step in stream:
            if step.completion_tokens == 2:
                break
        await stream.aclose()  # type: ignore[attr-defined]

    async def read_forever(i: int) -> None:
        async for _ in engine.generate(prompt_of(engine, 7, salt=i), params, f"t{i}"):
            pass

    await asyncio.gather(*(read_two_then_close(i) for i in range(50)))
    tasks = [asyncio.create_task(read_forever(i)) for i in range(50)]
    await wait_for(lambda: engine.stats().generation_tokens > 150, timeout=10)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await wait_for(lambda: engine.stats().running == 0 and engine.stats().waiting == 0, timeout=10)
    assert engine.stats().kv_blocks_used == 0
    # and the engine still serves
    assert len(tokens_of(await collect(engine, prompt_of(engine, 5), SamplingParams(max_tokens=3)))) == 3


async def test_a_request_beyond_the_kv_budget_waits_then_gets_429(make_engine: EngineFactory) -> None:
    engine = await make_engine(kv_budget_tokens=1024, block_tokens=32, max_waiting=1, prefix_cache=False)
    # 50 + 950 tokens: 32 of the 32 blocks, and long enough to outlast the two requests below
    big = SamplingParams(max_tokens=950, temperature=0, ignore_eos=True)
    first = engine.generate(prompt_of(engine, 50), big, "first")
    await first.__anext__()
    waiter = asyncio.create_task(collect(engine, prompt_of(engine, 50, salt=1), big, "second"))
    await wait_for(lambda: engine.stats().waiting == 1, timeout=5)
    with pytest.raises(Overloaded) as refused:
        await collect(engine, prompt_of(engine, 50, salt=2), big, "third")
    assert refused.value.status == 429 and refused.value.retry_after_s is not None
    assert engine.stats().kv_blocks_used == 32
    await first.aclose()  # type: ignore[attr-defined]
    assert len(tokens_of(await waiter)) == 950  # admitted once the first left


async def test_a_request_over_the_context_or_the_whole_budget_is_refused_at_once(make_engine: EngineFactory) -> None:
    engine = await make_engine(kv_budget_tokens=256, block_tokens=32)
    with pytest.raises(ContextTooLong) as over_context:
        await collect(engine, prompt_of(engine, 50), SamplingParams(max_tokens=engine.context_length))
    assert over_context.value.status == 400
    with pytest.raises(ContextTooLong, match="KV budget"):
        engine.check(prompt_of(engine, 50), SamplingParams(max_tokens=300))
    with pytest.raises(BadSampling, match="empty"):
        await collect(engine, [], SamplingParams())
    with pytest.raises(BadSampling, match="must be in"):
        await collect(engine, [1, 10**6], SamplingParams())
    assert engine.stats().running == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("temperature", -0.1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("repetition_penalty", 0.0),
        ("seed", -1),
        ("temperature", float("nan")),
        ("stop", ["x"] * 100),
        ("stop", [""]),
    ],
)
def test_bad_sampling_parameters_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(BadSampling) as refused:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert refused.value.field == field and refused.value.status == 400
