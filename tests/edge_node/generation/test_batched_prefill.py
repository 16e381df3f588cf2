"""Several prompts prefilled together in one run give each the logits it gets alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from edge_node.generation import EngineSettings, GenerationEngine, SamplingParams
from edge_node.generation.batch import RunningBatch, plan_chunks
from edge_node.generation.detok import TextStream
from edge_node.generation.kv import BatchKV, BlockBudget
from edge_node.generation.model import DecoderRunner, DecoderSpec
from edge_node.generation.prefix_cache import PrefixCache
from edge_node.generation.runners import open_runner
from edge_node.generation.sampling import TokenSampler
from edge_node.generation.sequence import Sequence
from edge_node.generation.tokenizer import Tokenizer
from support.generation import collect, prompt_of, tokens_of


def _runner(folder: Path) -> tuple[DecoderRunner, BatchKV]:
    spec = DecoderSpec.from_folder(folder)
    runner = open_runner(folder, spec, EngineSettings(intra_op_threads=1))
    kv = BatchKV(spec.layers, 4, spec.kv_heads, spec.head_size, runner.kv_dtype, 32, spec.context_length)
    kv.ensure(128, 0)
    return runner, kv


def test_right_padded_prompts_run_together_give_the_logits_of_each_alone(tiny_model: Path) -> None:
    runner, kv = _runner(tiny_model)
    prompts = [[5, 17, 33, 2, 90], list(range(40, 61)), [7], [300, 12, 12, 9]]
    alone = []
    for slot, prompt in enumerate(prompts):
        alone.append(runner.prefill(kv, slot, prompt, 0))
    solo_next = runner.decode(kv, 4, np.array([1, 2, 3, 4]), np.array([len(p) for p in prompts]))

    together = runner.prefill_fresh(kv, [3, 2, 1, 0], prompts)  # rows in another order
    assert np.abs(together - np.stack(alone)).max() < 1e-4
    # their KV landed in the buffer: the next step agrees with the one after the solo prefills
    swapped = runner.decode(kv, 4, np.array([4, 3, 2, 1]), np.array([len(p) for p in reversed(prompts)]))
    assert np.abs(swapped[::-1] - solo_next).max() < 1e-4


def test_the_plan_runs_the_most_prompt_tokens_within_the_budget() -> None:
    assert plan_chunks([32] * 16, 256) == [32] * 8
    assert plan_chunks([300], 256) == [256]
    assert plan_chunks([5, 40, 40, 40], 128) == [5, 40, 40]  # width 40: 3 rows, 85 real tokens
    assert plan_chunks([300, 32, 32], 256) == [256]  # 256 real tokens beat 3 rows of 32
    assert plan_chunks([32, 300, 32], 256) == [32, 32, 32]  # the long one continues later


async def test_a_burst_of_prompts_streams_what_each_gets_alone(tiny_model: Path) -> None:
    engine = GenerationEngine.load(tiny_model, EngineSettings(intra_op_threads=1, prefix_cache=False))
    await engine.start()
    try:
        greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
        prompts = [prompt_of(engine, n, salt=n) for n in (4, 30, 11, 30, 64, 2, 19, 8)]
        alone = [tokens_of(await collect(engine, p, greedy)) for p in prompts]
        together = await asyncio.gather(*(collect(engine, p, greedy) for p in prompts))
        assert [tokens_of(s) for s in together] == alone
        assert engine.stats().prefilled_tokens == 2 * sum(len(p) for p in prompts)
    finally:
        await engine.stop()


def test_a_prompt_that_ends_in_a_step_is_ready_before_the_steps_later_runs(tiny_model: Path) -> None:
    """Continuations sharing a step run one after another: the first is handed over (its first
    token sent) before the second has run, not after the whole step."""
    spec = DecoderSpec.from_folder(tiny_model)
    runner = open_runner(tiny_model, spec, EngineSettings(intra_op_threads=1))
    tokenizer = Tokenizer.from_folder(tiny_model)
    batch = RunningBatch(runner, 4, BlockBudget(64, 16), PrefixCache(16))
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    def sequence(prompt: list[int]) -> Sequence:
        return Sequence("r", prompt, params, TokenSampler(params, prompt, spec.vocab_size),
                        TextStream(tokenizer.decode, ()), lambda s, d: None, len(prompt) + 4)  # fmt: skip

    shared = list(range(100, 164))
    first = sequence([*shared, 1])  # run alone, it caches the 64 shared tokens
    assert batch.admit(first)
    batch.prefill_step(256)
    batch.remove(first)
    a, b = sequence([*shared, *range(2, 22)]), sequence([*shared, *range(30, 50)])
    assert batch.admit(a) and batch.admit(b) and a.length == b.length == 64  # both continue from the cache
    seen: list[tuple[Sequence, int]] = []
    done, ran = batch.prefill_step(256, lambda seq, logits: seen.append((seq, b.length)))
    assert [s for s, _ in done] == [a, b] and ran == 40
    assert seen == [(a, 64), (b, 84)]  # a was ready while b had not run yet
