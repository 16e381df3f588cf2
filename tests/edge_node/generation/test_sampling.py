"""Sampling: the cuts that must reduce to greedy do, seeds repeat, the repetition penalty bites."""

from __future__ import annotations

import numpy as np

from edge_node.generation import SamplingParams
from edge_node.generation.sampling import TokenSampler

VOCAB = 300


def _draws(params: SamplingParams, steps: int = 50, prompt: list[int] | None = None) -> list[int]:
    sampler = TokenSampler(params, prompt or [1, 2, 3], VOCAB)
    logits = np.random.default_rng(0).normal(size=(steps, VOCAB)).astype(np.float32)
    return [sampler.next_token(row) for row in logits]


def test_top_k_one_and_a_tiny_top_p_are_greedy() -> None:
    greedy = _draws(SamplingParams(temperature=0))
    assert _draws(SamplingParams(temperature=1.5, top_k=1, seed=1)) == greedy
    assert _draws(SamplingParams(temperature=1.5, top_p=1e-9, seed=2)) == greedy


def test_a_seed_repeats_its_draws_and_another_does_not() -> None:
    for params in (SamplingParams(seed=5), SamplingParams(seed=5, top_k=40, top_p=0.9, temperature=0.7)):
        assert _draws(params) == _draws(params)
    assert _draws(SamplingParams(seed=5)) != _draws(SamplingParams(seed=6))


def test_top_k_keeps_to_the_k_most_likely() -> None:
    sampler = TokenSampler(SamplingParams(top_k=3, seed=0), [0], VOCAB)
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[[7, 70, 170]] = 5.0
    assert {sampler.next_token(logits) for _ in range(200)} == {7, 70, 170}


def test_the_repetition_penalty_steers_away_from_seen_tokens() -> None:
    logits = np.zeros(VOCAB, dtype=np.float32)
    logits[[4, 9]] = [2.0, 1.9]
    sampler = TokenSampler(SamplingParams(temperature=0, repetition_penalty=1.3), [4], VOCAB)
    assert sampler.next_token(logits) == 9  # 4 was in the prompt: 2.0 / 1.3 < 1.9
    assert sampler.next_token(logits) == 4  # now 9 was generated too: 2.0/1.3 > 1.9/1.3
