"""Continuous batching gives every stream the tokens it would get alone."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from edge_node.generation import GenerationEngine, SamplingParams
from edge_node.generation.kv import BatchKV
from edge_node.generation.runners import InPlaceRunner
from support.generation import EngineFactory, collect, prompt_of, text_of, tokens_of

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


async def test_batched_greedy_streams_equal_each_run_alone(engine: GenerationEngine) -> None:
    prompts = [prompt_of(engine, n, salt=n) for n in (3, 17, 40, 9, 64, 33)]
    alone = [tokens_of(await collect(engine, p, GREEDY)) for p in prompts]
    together = await asyncio.gather(*(collect(engine, p, GREEDY) for p in prompts))
    assert [tokens_of(s) for s in together] == alone
    assert all(s[-1].finish_reason == "length" and s[-1].completion_tokens == 24 for s in together)


async def test_a_stream_joining_mid_flight_leaves_the_others_unchanged(engine: GenerationEngine) -> None:
    first, second = prompt_of(engine, 30, salt=1), prompt_of(engine, 12, salt=2)
    long = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    alone = tokens_of(await collect(engine, first, long))
    second_alone = tokens_of(await collect(engine, second, GREEDY))

    got: list[int] = []
    joined: asyncio.Task[list] | None = None
    async for step in engine.generate(first, long, "a"):
        got.extend(step.token_ids)
        if len(got) == 8:
            joined = asyncio.create_task(collect(engine, second, GREEDY))
    assert joined is not None
    assert got == alone
    assert tokens_of(await joined) == second_alone


async def test_same_seed_same_tokens_whatever_runs_beside_it(engine: GenerationEngine) -> None:
    prompt = prompt_of(engine, 20)
    seeded = SamplingParams(max_tokens=20, temperature=0.9, top_k=50, top_p=0.95, seed=1234, ignore_eos=True)
    alone = tokens_of(await collect(engine, prompt, seeded))
    others = [
        collect(engine, prompt_of(engine, 10 + i, salt=i), SamplingParams(max_tokens=20, seed=i)) for i in range(5)
    ]
    batched, *_ = await asyncio.gather(collect(engine, prompt, seeded), *others)
    assert tokens_of(batched) == alone
    other_seed = tokens_of(
        await collect(engine, prompt, SamplingParams(max_tokens=20, temperature=0.9, seed=99, ignore_eos=True))
    )
    assert other_seed != alone


async def test_a_long_prompt_prefilled_in_chunks_gives_the_same_tokens(make_engine: EngineFactory) -> None:
    whole = await make_engine(prefill_chunk_tokens=512, prefix_cache=False)
    chunked = await make_engine(prefill_chunk_tokens=16, prefix_cache=False)
    prompt = prompt_of(whole, 150)
    assert tokens_of(await collect(chunked, prompt, GREEDY)) == tokens_of(await collect(whole, prompt, GREEDY))
    assert chunked.stats().prefilled_tokens == 150


async def test_text_deltas_add_up_to_the_decoded_tokens(engine: GenerationEngine) -> None:
    steps = await collect(
        engine, prompt_of(engine, 12), SamplingParams(max_tokens=40, temperature=1.0, seed=3, ignore_eos=True)
    )
    assert text_of(steps) == engine.tokenizer.decode(tokens_of(steps))
    assert [s.completion_tokens for s in steps] == list(range(1, 41))
    assert all(s.prompt_tokens == 12 for s in steps)


async def test_pinned_threads_give_the_same_tokens(make_engine: EngineFactory) -> None:
    plain = await make_engine()
    pinned = await make_engine(pin_threads=True, intra_op_threads=2)
    prompt = prompt_of(plain, 20)
    assert tokens_of(await collect(pinned, prompt, GREEDY)) == tokens_of(await collect(plain, prompt, GREEDY))


async def test_pinned_threads_without_spinning_stream_the_same_tokens(make_engine: EngineFactory) -> None:
    plain = await make_engine()
    pinned = await make_engine(pin_threads=True, spinning=False)
    prompt = prompt_of(plain, 20)
    assert tokens_of(await collect(pinned, prompt, GREEDY)) == tokens_of(await collect(plain, prompt, GREEDY))


async def test_a_lone_row_padded_to_two_leaves_the_prompt_prefilled_beside_it_intact(
    make_engine: EngineFactory,
) -> None:
    """``batch_invariant="on"``: while one stream decodes alone, its step runs beside row 1; a
    prompt prefilled there in chunks between those steps still gets its own tokens (at 150 tokens
    a wrong write at its position 0 changed none of them; at 40 it does)."""
    engine = await make_engine(batch_invariant="on", prefill_chunk_tokens=16, prefix_cache=False)
    first, long = prompt_of(engine, 12, salt=3), prompt_of(engine, 40, salt=4)
    alone = tokens_of(await collect(engine, long, GREEDY))
    steps = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    first_alone = tokens_of(await collect(engine, first, steps))
    got: list[int] = []
    first_token_at: list[int] = []  # how many of "a"'s tokens had come when "b" got its first

    async def beside() -> list[int]:
        tokens: list[int] = []
        async for step in engine.generate(long, GREEDY, "b"):
            if not tokens:
                first_token_at.append(len(got))
            tokens.extend(step.token_ids)
        return tokens

    joined: asyncio.Task[list[int]] | None = None
    async for step in engine.generate(first, steps, "a"):
        got.extend(step.token_ids)
        if len(got) == 2:
            joined = asyncio.create_task(beside())
    assert joined is not None and got == first_alone
    assert await joined == alone
    assert first_token_at[0] < len(got), "b's prompt was not prefilled while a decoded"


async def test_only_a_lone_greedy_or_seeded_row_is_padded(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unseeded sampled stream is never reproduced on another node: it decodes alone."""
    rows: list[int] = []
    decode = InPlaceRunner.decode

    def counted(self: InPlaceRunner, kv: BatchKV, n: int, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        rows.append(n)
        return decode(self, kv, n, tokens, lengths)

    engine = await make_engine(batch_invariant="on")
    monkeypatch.setattr(InPlaceRunner, "decode", counted)
    prompt = prompt_of(engine, 12)
    for params, expected in (
        (SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True), 1),
        (SamplingParams(max_tokens=6, temperature=0.8, seed=5, ignore_eos=True), 2),
        (GREEDY, 2),
    ):
        rows.clear()
        await collect(engine, prompt, params)
        assert set(rows) == {expected}, params
