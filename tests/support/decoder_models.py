"""Small language models built by code (onnx.helper + numpy + tokenizers) in the layout ONNX
Runtime GenAI's builder writes: ``model.onnx`` + ``model.onnx.data`` (a Llama-like decoder:
GroupQueryAttention over a KV cache, ``past_key_values.%d.key`` in, ``present.%d.key`` out),
``genai_config.json``, ``tokenizer.json`` (byte-level BPE trained on standard-library source),
``tokenizer_config.json`` and ``chat_template.jinja``.

``peaked=True`` makes the weights carry a strong, quantization-proof signal (the output
head is the embedding's transpose, so every token predicts itself by a wide margin), so
4-bit weights keep its decisions: a model the text guard passes. ``peaked=False`` is plain
random weights, whose near-uniform decisions 4 bits may flip."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def train_tokenizer(path: Path, vocab: int) -> int:
    """A byte-level BPE of at most ``vocab`` tokens, trained on ``textwrap.py``; its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([text], trainer)
    tokenizer.save(str(path))
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def _graph(layers: int, vocab: int, hidden: int, heads: int, kv_heads: int, peaked: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    head = hidden // heads
    embed = rng.standard_normal((vocab, hidden)).astype(np.float32)
    scale = 0.02 if peaked else 0.15
    inits = [numpy_helper.from_array(embed, "embed")]
    inits.append(numpy_helper.from_array((embed.T * (0.1 if peaked else 0.05)).astype(np.float32).copy(), "lm_head"))
    for name, value in (("one", [1]), ("axis1", [1])):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))
    inits.append(numpy_helper.from_array(np.asarray(1, dtype=np.int64), "idx1"))
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens64"]),
        helper.make_node("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "idx1"], ["total64"], axis=0),
        helper.make_node("Cast", ["total64"], ["total_len"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embed", "input_ids"], ["h0"]),
    ]
    h = "h0"
    qkv_width = (heads + 2 * kv_heads) * head
    for i in range(layers):
        for name, shape in (("qkv", (hidden, qkv_width)), ("o", (hidden, hidden)), ("up", (hidden, 2 * hidden))):
            w = (rng.standard_normal(shape) * scale).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"l{i}.{name}"))
        down = (rng.standard_normal((2 * hidden, hidden)) * scale).astype(np.float32)
        inits.append(numpy_helper.from_array(down, f"l{i}.down"))
        nodes += [
            helper.make_node("MatMul", [h, f"l{i}.qkv"], [f"l{i}.qkv_out"], name=f"l{i}.qkv_proj"),
            helper.make_node(
                "GroupQueryAttention",
                [
                    f"l{i}.qkv_out",
                    "",
                    "",
                    f"past_key_values.{i}.key",
                    f"past_key_values.{i}.value",
                    "seqlens_k",
                    "total_len",
                ],
                [f"l{i}.attn", f"present.{i}.key", f"present.{i}.value"],
                domain="com.microsoft",
                num_heads=heads,
                kv_num_heads=kv_heads,
                name=f"l{i}.gqa",
            ),
            helper.make_node("MatMul", [f"l{i}.attn", f"l{i}.o"], [f"l{i}.o_out"], name=f"l{i}.o_proj"),
            helper.make_node("Add", [h, f"l{i}.o_out"], [f"l{i}.h1"]),
            helper.make_node("MatMul", [f"l{i}.h1", f"l{i}.up"], [f"l{i}.up_out"], name=f"l{i}.up_proj"),
            helper.make_node("Relu", [f"l{i}.up_out"], [f"l{i}.act"]),
            helper.make_node("MatMul", [f"l{i}.act", f"l{i}.down"], [f"l{i}.down_out"], name=f"l{i}.down_proj"),
            helper.make_node("Add", [f"l{i}.h1", f"l{i}.down_out"], [f"l{i}.h2"]),
        ]
        h = f"l{i}.h2"
    nodes.append(helper.make_node("MatMul", [h, "lm_head"], ["logits"], name="lm_head"))
    cache = ["batch_size", kv_heads, "past_sequence_length", head]
    present = ["batch_size", kv_heads, "total_sequence_length", head]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])]
    for i in range(layers):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", TensorProto.FLOAT, cache))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", TensorProto.FLOAT, present))
    graph = helper.make_graph(nodes, "tiny_decoder", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def genai_config(layers: int, vocab: int, hidden: int, heads: int, kv_heads: int) -> dict[str, object]:
    """The ``genai_config.json`` ONNX Runtime GenAI's builder writes for such a model."""
    return {
        "model": {
            "bos_token_id": 0,
            "context_length": 512,
            "decoder": {
                "filename": "model.onnx",
                "head_size": hidden // heads,
                "hidden_size": hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": heads,
                "num_hidden_layers": layers,
                "num_key_value_heads": kv_heads,
            },
            "eos_token_id": 0,
            "pad_token_id": 0,
            "type": "llama",
            "vocab_size": vocab,
        },
        "search": {"do_sample": False, "max_length": 512, "top_k": 50, "top_p": 1.0, "temperature": 1.0},
    }


def build_decoder(
    directory: Path,
    *,
    layers: int = 2,
    vocab: int = 320,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    peaked: bool = True,
    genai: bool = True,
) -> Path:
    """A decoder in the GenAI layout (``genai=False``: graph and tokenizer only, as Optimum
    leaves a plain decoder); the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    train_tokenizer(directory / "tokenizer.json", vocab)
    model = _graph(layers, vocab, hidden, heads, kv_heads, peaked)
    onnx.save_model(model, str(directory / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    if genai:
        config = genai_config(layers, vocab, hidden, heads, kv_heads)
        (directory / "genai_config.json").write_text(json.dumps(config, indent=4))
        tokenizer_config = {"bos_token": EOS, "eos_token": EOS, "pad_token": EOS, "model_max_length": 512}
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
        (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return directory


def edit_json(path: Path, change: dict[str, object]) -> None:
    """Set dotted keys of a JSON file (``{"model.decoder.num_hidden_layers": 4}``)."""
    data = json.loads(path.read_text())
    for dotted, value in change.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[last] = value
    path.write_text(json.dumps(data, indent=4))
