"""GenerationShadow: completed generations scored teacher-forced by the FP32 reference (real
engine, real sessions): greedy agreement per served token for greedy requests, the served
tokens' log-probability under the reference for every sampled one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_node.generation import GenerationEngine, SamplingParams
from edge_node.generation.shadow import MAX_TOKENS, TOKEN_NLL, GenerationShadow
from support.decoder_models import build_decoder
from support.generation import collect, prompt_of, tokens_of


@pytest.fixture
def shadow_of() -> Iterator[object]:
    made: list[GenerationShadow] = []

    def make(folder: Path, sample: float = 1.0, queue_size: int = 64) -> GenerationShadow:
        shadow = GenerationShadow.open(folder, sample=sample, queue_size=queue_size, cpu_share=0.0, name="test")
        made.append(shadow)
        return shadow

    yield make
    for s in made:
        s.close()


async def _served(engine: GenerationEngine, count: int, params: SamplingParams) -> list[tuple[list[int], list[int]]]:
    out = []
    for salt in range(count):
        prompt = prompt_of(engine, 12, salt)
        out.append((prompt, tokens_of(await collect(engine, prompt, params, f"r{salt}"))))
    return out


async def test_the_same_weights_agree_on_every_greedy_token(
    engine: GenerationEngine, tiny_model: Path, shadow_of
) -> None:  # type: ignore[no-untyped-def]
    shadow = shadow_of(tiny_model)
    greedy = await _served(engine, 4, SamplingParams(max_tokens=8, temperature=0))
    for prompt, served in greedy:
        shadow.offer(prompt, served, greedy=True)
    shadow.join()
    info = shadow.info()
    tokens = sum(len(s) for _, s in greedy)
    assert info.top1_samples == tokens and info.top1_agree == tokens and info.samples == tokens
    assert info.measure == TOKEN_NLL and info.measure_sum >= 0 and info.measure_sumsq >= 0
    assert info.dropped == 0 and info.reference == "fp32" and info.candidate == ""
    # Greedy tokens are the reference's own argmax: each at least as likely as uniform.
    assert info.measure_sum / info.samples < 6.24  # ln(512)

    sampled = await _served(engine, 3, SamplingParams(max_tokens=6, temperature=1.0, seed=5))
    for prompt, served in sampled:
        shadow.offer(prompt, served, greedy=False)
    shadow.join()
    after = shadow.info()
    assert after.samples == tokens + sum(len(s) for _, s in sampled)
    assert after.top1_samples == tokens, "sampled tokens say nothing of argmax agreement"
    assert after.measure_sum > info.measure_sum


async def test_other_weights_disagree_and_find_the_served_tokens_unlikely(
    engine: GenerationEngine, tiny_model: Path, tmp_path: Path, shadow_of
) -> None:  # type: ignore[no-untyped-def]
    other = build_decoder(tmp_path / "other", vocab=512, peaked=False)
    same, different = shadow_of(tiny_model), shadow_of(other)
    for prompt, served in await _served(engine, 4, SamplingParams(max_tokens=8, temperature=0)):
        same.offer(prompt, served, greedy=True)
        different.offer(prompt, served, greedy=True)
    same.join()
    different.join()
    a, b = same.info(), different.info()
    assert b.top1_samples == a.top1_samples and b.top1_agree < b.top1_samples // 2
    assert b.measure_sum / b.samples > a.measure_sum / a.samples


def test_what_is_not_scored(tiny_model: Path, shadow_of) -> None:  # type: ignore[no-untyped-def]
    never = shadow_of(tiny_model, sample=0.0)
    never.offer([1, 2, 3], [4, 5], greedy=True)
    assert never.info().samples == 0 and never.info().dropped == 0
    shadow = shadow_of(tiny_model)
    shadow.offer([1] * MAX_TOKENS, [4], greedy=True)  # too long to score: dropped, counted
    shadow.offer([1, 2], [], greedy=True)  # nothing served: nothing to score
    shadow.join()
    assert shadow.info().dropped == 1 and shadow.info().samples == 0
