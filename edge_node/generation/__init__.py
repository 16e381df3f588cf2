"""Language-model generation on an edge: a continuous-batching engine over ONNX Runtime.

One :class:`GenerationEngine` serves one decoder model in the ONNX Runtime GenAI builder's
layout (``genai_config.json``, ``model.onnx``, ``tokenizer.json``…). Requests join and leave
the running batch between decode steps; long prompts are prefilled in chunks between them;
the KV of every sequence lives within a budget, and prompt prefixes seen before are reused
from a block cache. Transports (OpenAI-compatible routes, OIP generate) call ``generate``
and turn :class:`StepOutput` into their chunks; the errors carry their HTTP status.

Typical use::

    engine = await asyncio.to_thread(GenerationEngine.load, folder, EngineSettings())
    await engine.start()
    ids = engine.tokenizer.encode(engine.tokenizer.render_chat(messages), add_special_tokens=False)
    async for step in engine.generate(ids, SamplingParams(max_tokens=64, temperature=0), "req-1"):
        print(step.text, end="")
    await engine.stop()
"""

from edge_node.generation.engine import GenerationEngine
from edge_node.generation.settings import EngineSettings
from edge_node.generation.tokenizer import ChatTemplateError, Tokenizer, TokenizerLoadError
from edge_node.generation.types import (
    BadSampling,
    ContextTooLong,
    EngineStats,
    FinishReason,
    GenerationError,
    Overloaded,
    SamplingParams,
    StepOutput,
)

__all__ = [
    "BadSampling",
    "ChatTemplateError",
    "ContextTooLong",
    "EngineSettings",
    "EngineStats",
    "FinishReason",
    "GenerationEngine",
    "GenerationError",
    "Overloaded",
    "SamplingParams",
    "StepOutput",
    "Tokenizer",
    "TokenizerLoadError",
]
