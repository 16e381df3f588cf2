"""Helpers for tests of the generation engine: collect a stream, its tokens and text, make prompts."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from edge_node.generation import GenerationEngine, SamplingParams, StepOutput

#: ``make_engine(**settings)`` of tests/edge_node/generation/conftest.py.
EngineFactory = Callable[..., Awaitable[GenerationEngine]]


async def collect(
    engine: GenerationEngine, prompt: list[int], params: SamplingParams, rid: str = "r"
) -> list[StepOutput]:
    """Every step of one stream."""
    return [step async for step in engine.generate(prompt, params, rid)]


def tokens_of(steps: list[StepOutput]) -> list[int]:
    """The generated token ids of a stream."""
    return [t for s in steps for t in s.token_ids]


def text_of(steps: list[StepOutput]) -> str:
    """The generated text of a stream."""
    return "".join(s.text for s in steps)


def prompt_of(engine: GenerationEngine, n: int, salt: int = 0) -> list[int]:
    """A prompt of ``n`` token ids from real text (varied by ``salt``)."""
    text = f"def f{salt}(self, x):\n    return x * {salt} + len(self.items)  # note\n" * (n // 8 + 2)
    return engine.tokenizer.encode(text, add_special_tokens=False)[:n]
