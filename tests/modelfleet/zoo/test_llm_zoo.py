"""The zoo's language models: the trained one scores on text it never saw; the random writer's
graph keeps its KV cache and rotary positions right; ``modelfleet zoo llm`` writes a folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from modelfleet.cli import app
from modelfleet.zoo.llm import SHAPES, eval_text, trained_llm, trained_meta, write_decoder, write_random_llm
from modelfleet.zoo.llm.decoder_shape import hf_weight_shapes
from modelfleet.zoo.llm.genai_folder import resolve_vocab

#: What a push of the GenAI layout takes, and nothing else.
GENAI_FILES = {
    "model.onnx",
    "model.onnx.data",
    "genai_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
}


class Decoder:
    """One ``InferenceSession`` over a GenAI folder's graph, fed as the GenAI runtime feeds it."""

    def __init__(self, folder: Path) -> None:
        self.session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        config = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
        self.layers, self.kv_heads, self.head = (
            config["num_hidden_layers"],
            config["num_key_value_heads"],
            config["head_size"],
        )

    def empty(self, batch: int) -> list[np.ndarray]:
        return [np.zeros((batch, self.kv_heads, 0, self.head), np.float32)] * (2 * self.layers)

    def __call__(self, ids: np.ndarray, past: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """(logits, present KV) for ``ids`` after ``past`` (keys and values, layer by layer)."""
        total = past[0].shape[2] + ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], total), np.int64)}
        for i in range(self.layers):
            feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = past[2 * i], past[2 * i + 1]
        names = ["logits"] + [f"present.{i}.{kind}" for i in range(self.layers) for kind in ("key", "value")]
        logits, *present = self.session.run(names, feeds)
        return logits, present


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_llm(tmp_path_factory.mktemp("llm") / "tiny", "tiny", seed=3)


def test_the_trained_model_predicts_held_out_source_far_better_than_chance() -> None:
    folder = trained_llm()
    assert {p.name for p in folder.iterdir()} == GENAI_FILES
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = np.array(tokenizer.encode(eval_text()).ids[1000:1256], np.int64)[None]
    decoder = Decoder(folder)
    logits, _ = decoder(ids, decoder.empty(1))
    nll = -np.take_along_axis(log_softmax(logits[0, :-1]), ids[0, 1:, None], -1).mean()
    perplexity = float(np.exp(nll))
    # Uniform guessing scores the vocabulary's size; training beat the unigram model clearly.
    assert perplexity < vocab / 20
    assert perplexity < trained_meta()["unigram_perplexity"] / 4


@pytest.fixture(scope="module")
def sharp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny shape with weights 15 times the random writer's: attention far from uniform, so a
    key at the wrong rotary position, or a cache row out of place, changes the logits."""
    shape = resolve_vocab(SHAPES["tiny"], trained_llm())
    rng = np.random.default_rng(7)
    weights = {
        name: (rng.standard_normal(dims) * 0.3).astype(np.float32) for name, dims in hf_weight_shapes(shape).items()
    }
    return write_decoder(tmp_path_factory.mktemp("llm") / "sharp", shape, trained_llm(), weights=weights)


@pytest.mark.parametrize("model", ["tiny", "sharp"])
def test_decoding_on_the_kv_cache_matches_a_full_prefill(model: str, request: pytest.FixtureRequest) -> None:
    folder: Path = request.getfixturevalue(model)
    decoder = Decoder(folder)
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    ids = np.random.default_rng(0).integers(0, vocab, (2, 12)).astype(np.int64)
    full, _ = decoder(ids, decoder.empty(2))
    # A prompt of 8, then 4 tokens one at a time on the growing cache: positions 8 to 11 as in one pass.
    logits, past = decoder(ids[:, :8], decoder.empty(2))
    np.testing.assert_allclose(logits, full[:, :8], atol=1e-4)
    for position in range(8, 12):
        step, past = decoder(ids[:, position : position + 1], past)
        assert past[0].shape == (2, SHAPES["tiny"].kv_heads, position + 1, SHAPES["tiny"].head_size)
        np.testing.assert_allclose(step[:, 0], full[:, position], atol=1e-4)


def test_random_llms_differ_by_seed_and_agree_with_their_config(tiny: Path, tmp_path: Path) -> None:
    other = write_random_llm(tmp_path / "other", "tiny", seed=4)
    assert {p.name for p in other.iterdir()} == GENAI_FILES
    assert (other / "model.onnx.data").read_bytes() != (tiny / "model.onnx.data").read_bytes()
    config = json.loads((tiny / "genai_config.json").read_text())["model"]
    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    assert config["vocab_size"] == tokenizer.get_vocab_size()
    assert config["eos_token_id"] == [tokenizer.token_to_id("<|endoftext|>"), tokenizer.token_to_id("<|end|>")]
    assert config["decoder"]["num_hidden_layers"] == SHAPES["tiny"].layers
    assert json.loads((tiny / "tokenizer_config.json").read_text())["model_max_length"] == config["context_length"]


def _tensor_ranges(folder: Path) -> dict[str, range]:
    """Initializer name → its byte range in ``model.onnx.data``."""
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    ranges = {}
    for t in graph.graph.initializer:
        info = {e.key: int(e.value) for e in t.external_data if e.key in ("offset", "length")}
        ranges[t.name] = range(info["offset"], info["offset"] + info["length"])
    return ranges


def test_a_fine_tune_of_some_layers_changes_only_their_bytes(tiny: Path, tmp_path: Path) -> None:
    tuned = write_random_llm(tmp_path / "tuned", "tiny", seed=3, layer_seeds={1: 7})
    ranges = _tensor_ranges(tiny)
    assert ranges == _tensor_ranges(tuned)  # same layout: a changed layer moves no other byte
    assert (tuned / "model.onnx").read_bytes() == (tiny / "model.onnx").read_bytes()
    before = np.fromfile(tiny / "model.onnx.data", np.uint8)
    after = np.fromfile(tuned / "model.onnx.data", np.uint8)
    changed = {
        name for name, r in ranges.items() if not np.array_equal(before[r.start : r.stop], after[r.start : r.stop])
    }
    assert changed == {
        f"model.layers.1.{w}.MatMul.weight"
        for w in ("attn.qkv_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    }
    outside = np.ones(len(before), bool)
    for name in changed:
        outside[ranges[name].start : ranges[name].stop] = False
    assert np.array_equal(before[outside], after[outside])
    with pytest.raises(ValueError, match="outside"):
        write_random_llm(tmp_path / "bad", "tiny", layer_seeds={2: 1})
    assert not (tmp_path / "bad").exists()


def test_the_cli_writes_a_folder_to_push_and_says_how(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["zoo", "llm", "--out", str(tmp_path / "llm"), "--shape", "tiny"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "llm").iterdir()} == GENAI_FILES
    assert f"modelfleet push {tmp_path / 'llm'} --name llm-tiny --fp32" in result.output
    result = CliRunner().invoke(app, ["zoo", "llm", "--out", str(tmp_path / "trained")])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "trained").iterdir()} == GENAI_FILES
    assert (tmp_path / "trained.eval.txt").read_text(encoding="utf-8") == eval_text()
    assert f"--eval {tmp_path / 'trained.eval.txt'}" in result.output


def test_the_cli_writes_a_fine_tune_of_some_layers(tmp_path: Path) -> None:
    args = ["zoo", "llm", "--out", str(tmp_path / "tuned"), "--shape", "tiny", "--seed", "3", "--tune", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "layers 1 from seed 4" in result.output
    assert (tmp_path / "tuned" / "model.onnx.data").read_bytes() == (
        write_random_llm(tmp_path / "api", "tiny", seed=3, layer_seeds={1: 4}) / "model.onnx.data"
    ).read_bytes()
    result = CliRunner().invoke(app, [*args[:3], str(tmp_path / "bad"), *args[4:-1], "2"])
    assert result.exit_code == 2 and "layers 0 to 1" in result.output
    assert not (tmp_path / "bad").exists()
