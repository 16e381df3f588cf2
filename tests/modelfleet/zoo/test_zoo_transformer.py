"""The transformer encoder classifiers: trained on digits as tokens, and the family at other sizes."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from modelfleet.zoo import ZooModel, build_transformer_random, eval_accuracy
from modelfleet.zoo.digits_data import digit_sequence, digits_split, pad_sequences
from modelfleet.zoo.transformer import (
    MINILM,
    TransformerConfig,
    parameter_count,
    random_transformer_weights,
    transformer_graph,
)

#: MiniLM's family (BERT vocabulary size, 4x FFN) at a width a test can afford.
TINY_MINILM = TransformerConfig(vocab=30522, max_positions=64, hidden=32, heads=4, layers=2, ffn=128, classes=2)


def _session(model: ZooModel) -> ort.InferenceSession:
    return ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])


def _eval(model: ZooModel) -> dict[str, np.ndarray]:
    assert model.eval_path is not None
    with np.load(model.eval_path) as data:
        return {k: data[k] for k in data.files}


def test_trained_transformer_reaches_its_accuracy_on_the_held_out_split(transformer_digits: ZooModel) -> None:
    assert transformer_digits.family == "transformer"
    assert transformer_digits.input_names == ("input_ids", "attention_mask")
    assert transformer_digits.fp32_accuracy is not None and transformer_digits.fp32_accuracy >= 0.95
    assert eval_accuracy(transformer_digits) == transformer_digits.fp32_accuracy
    data = _eval(transformer_digits)
    assert sorted(data) == ["attention_mask", "input_ids", "label"]
    assert data["input_ids"].dtype == np.int64 and data["attention_mask"].dtype == np.int64
    lengths = data["attention_mask"].sum(axis=1)
    assert lengths.min() < 20 and lengths.max() > 40  # lengths really vary


def test_inputs_are_int64_with_dynamic_batch_and_sequence(transformer_digits: ZooModel) -> None:
    model = onnx.load(str(transformer_digits.onnx_path))
    for graph_input in model.graph.input:
        assert graph_input.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in graph_input.type.tensor_type.shape.dim] == ["batch", "sequence"]


def test_a_padded_batch_gives_what_each_unpadded_sequence_gives(transformer_digits: ZooModel) -> None:
    session = _session(transformer_digits)
    sequences = [digit_sequence(pixels) for pixels in digits_split().test_x[:8]]
    ids, mask = pad_sequences(sequences, length=60)  # more padding than any sequence needs
    (batched,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    assert batched.shape == (8, 10)
    for row, seq in enumerate(sequences):
        (alone,) = session.run(None, {"input_ids": seq[None], "attention_mask": np.ones((1, len(seq)), np.int64)})
        np.testing.assert_allclose(alone[0], batched[row], rtol=1e-4, atol=1e-5)


def test_the_mask_decides_what_counts(transformer_digits: ZooModel) -> None:
    session = _session(transformer_digits)
    seq = digit_sequence(digits_split().test_x[0])
    ids, mask = pad_sequences([seq], length=len(seq) + 5)
    ids[0, len(seq) :] = seq[1:6]  # real tokens in the padding: the mask must hide them
    (masked,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    (alone,) = session.run(None, {"input_ids": seq[None], "attention_mask": np.ones((1, len(seq)), np.int64)})
    np.testing.assert_allclose(masked, alone, rtol=1e-4, atol=1e-5)
    mask[0, len(seq) :] = 1
    (unmasked,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    assert np.abs(unmasked - alone).max() > 1e-3


def test_minilm_family_at_a_tiny_width_takes_batch_1_and_8_at_two_lengths(zoo_cache: Path) -> None:
    model = build_transformer_random(zoo_cache, config=TINY_MINILM, name="transformer-tiny")
    assert model.calibration_path is not None and model.eval_path is None
    with np.load(model.calibration_path) as data:
        ids, mask = data["input_ids"], data["attention_mask"]
    assert ids.min() >= 0 and ids.max() < TINY_MINILM.vocab and set(np.unique(mask)) == {0, 1}
    session = _session(model)
    for batch in (1, 8):
        for length in (7, 33):
            feeds = {"input_ids": ids[:batch, :length], "attention_mask": np.ones((batch, length), np.int64)}
            (logits,) = session.run(None, feeds)
            assert logits.shape == (batch, 2) and np.all(np.isfinite(logits))


def test_onnx_runtimes_transformer_optimizer_fuses_its_attention(tmp_path: Path) -> None:
    # What quantizing a transformer starts from: the graph has the shape exporters write for BERT.
    from onnxruntime.transformers.optimizer import optimize_model

    config = TransformerConfig(vocab=50, max_positions=16, hidden=32, heads=4, layers=3, ffn=64, classes=3)
    onnx.save(transformer_graph(config, random_transformer_weights(config)), str(tmp_path / "m.onnx"))
    optimized = optimize_model(str(tmp_path / "m.onnx"), model_type="bert", num_heads=4, hidden_size=32, opt_level=0)
    ops = collections.Counter(n.op_type for n in optimized.model.graph.node)
    assert ops["Attention"] == 3 and ops["Softmax"] == 0


def test_minilm_shape_has_its_parameter_count() -> None:
    # sentence-transformers' all-MiniLM-L6-v2 has 22.7M parameters (the classifier head aside).
    assert 22_500_000 < parameter_count(MINILM) < 23_000_000
