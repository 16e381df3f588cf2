"""A real engine on the tiny GenAI-layout decoder in tests/fixtures/llm (random weights, CPU)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from edge_node.generation import EngineSettings, GenerationEngine
from support.generation import EngineFactory

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "llm" / "tiny-genai"


@pytest.fixture
def tiny_model() -> Path:
    """The folder of the tiny decoder."""
    return TINY


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    """Start engines on the tiny model with the given settings; all are stopped at the end."""
    engines: list[GenerationEngine] = []

    async def make(**settings: object) -> GenerationEngine:
        engine = GenerationEngine.load(TINY, EngineSettings(**{"intra_op_threads": 1, **settings}))  # type: ignore[arg-type]
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.stop()


@pytest.fixture
async def engine(make_engine: EngineFactory) -> GenerationEngine:
    """An engine with the default settings."""
    return await make_engine()
