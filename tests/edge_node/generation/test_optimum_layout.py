"""Plain-attention decoders with ``position_ids`` (Optimum's export layout) batch like GQA ones."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from edge_node.generation import EngineSettings, GenerationEngine, SamplingParams
from edge_node.generation.kv import BatchKV
from edge_node.generation.model import DecoderSpec, ModelLoadError
from edge_node.generation.runners import ConcatRunner, open_runner
from support.generation import collect, prompt_of, tokens_of
from support.optimum_decoder import write_optimum_folder

GREEDY = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def optimum_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = Path(__file__).resolve().parents[2] / "fixtures" / "llm" / "tiny-genai"
    return write_optimum_folder(tmp_path_factory.mktemp("optimum"), tiny)


def test_right_padded_rows_decode_to_the_logits_of_each_alone(optimum_model: Path) -> None:
    spec = DecoderSpec.from_folder(optimum_model)
    runner = open_runner(optimum_model, spec, EngineSettings(intra_op_threads=1))
    assert isinstance(runner, ConcatRunner)

    def buffer(rows: int) -> BatchKV:
        kv = BatchKV(spec.layers, rows, spec.kv_heads, spec.head_size, runner.kv_dtype, 16, spec.context_length)
        kv.ensure(64, 0)
        return kv

    prompts = [[5, 9, 11, 40, 2, 7, 7], [300, 4], [18, 19, 20, 21]]
    alone_first, alone_next = [], []
    for prompt in prompts:  # each alone, in its own buffer, its prompt in two chunks
        own = buffer(1)
        runner.prefill(own, 0, prompt[:1], 0)
        alone_first.append(runner.prefill(own, 0, prompt[1:], 1))
        alone_next.append(runner.decode(own, 1, np.array([33]), np.array([len(prompt)]))[0])

    kv = buffer(3)
    first = runner.prefill_fresh(kv, [0, 1, 2], prompts)
    following = runner.decode(kv, 3, np.array([33, 33, 33]), np.array([len(p) for p in prompts]))
    assert np.abs(first - np.stack(alone_first)).max() < 1e-5
    assert np.abs(following - np.stack(alone_next)).max() < 1e-5


async def test_concurrent_streams_get_the_tokens_each_gets_alone(optimum_model: Path) -> None:
    engine = GenerationEngine.load(optimum_model, EngineSettings(intra_op_threads=1, prefill_chunk_tokens=24))
    await engine.start()
    try:
        prompts = [prompt_of(engine, n, salt=n) for n in (3, 17, 40, 9, 30)]
        alone = [tokens_of(await collect(engine, p, GREEDY)) for p in prompts]
        together = await asyncio.gather(*(collect(engine, p, GREEDY) for p in prompts))
        assert [tokens_of(s) for s in together] == alone
    finally:
        await engine.stop()


def test_a_plain_attention_graph_without_positions_is_refused_at_load(optimum_model: Path, tmp_path: Path) -> None:
    for f in optimum_model.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "genai_config.json").read_text())
    config["model"]["decoder"]["inputs"]["position_ids"] = "positions"  # a name the graph lacks
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"neither GroupQueryAttention .* nor a 'positions' input"):
        GenerationEngine.load(tmp_path, EngineSettings())
