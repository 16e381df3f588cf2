"""A tiny Llama-like decoder in the layout Optimum's ONNX export writes, from onnx helper code.

Inputs ``input_ids`` [b, s], ``attention_mask`` [b, past + s], ``position_ids`` [b, s] and
``past_key_values.N.key/value`` [b, heads, past, head]; outputs ``logits`` and
``present.N.key/value`` [b, heads, past + s, head]. Plain ONNX ops: RMSNorm from ReduceMean,
rotary embedding from ``position_ids`` (cos/sin tables gathered), the past concatenated with the
new keys and values, and attention masked by ``attention_mask`` and causality (a large negative
bias, as Hugging Face's ``_prepare_4d_causal_attention_mask``). Random weights; the tokenizer
files come from another folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, HEAD, LAYERS, INTER = 32, 2, 16, 2, 64
OPSET = 18


class _Graph:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, name: str, *shape: int) -> str:
        return self.const(name, (self.rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32))

    def op(self, op: str, *inputs: str, **attrs: object) -> str:
        self._n += 1
        out = f"{op.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], **attrs))
        return out

    def rms(self, x: str, name: str) -> str:
        var = self.op("ReduceMean", self.op("Mul", x, x), self.i64("axes_last", [-1]), keepdims=1)
        normed = self.op("Div", x, self.op("Sqrt", self.op("Add", var, self.f32("eps", 1e-6))))
        return self.op("Mul", normed, self.const(name, np.ones(HIDDEN, np.float32)))

    def i64(self, name: str, value: list[int]) -> str:
        if not any(i.name == name for i in self.inits):
            self.const(name, np.asarray(value, np.int64))
        return name

    def f32(self, name: str, value: float) -> str:
        if not any(i.name == name for i in self.inits):
            self.const(name, np.asarray(value, np.float32))
        return name


def _heads(g: _Graph, x: str) -> str:
    """[b, s, hidden] → [b, heads, s, head]."""
    shaped = g.op("Reshape", x, g.i64("split_heads", [0, 0, HEADS, HEAD]))
    return g.op("Transpose", shaped, perm=[0, 2, 1, 3])


def _rotary(g: _Graph, x: str, cos: str, sin: str) -> str:
    half = HEAD // 2
    x1 = g.op("Slice", x, g.i64("zero", [0]), g.i64("half", [half]), g.i64("axis3", [3]))
    x2 = g.op("Slice", x, g.i64("half", [half]), g.i64("full", [HEAD]), g.i64("axis3", [3]))
    rotated = g.op("Concat", g.op("Neg", x2), x1, axis=3)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def _attention_bias(g: _Graph) -> str:
    """[b, 1, s, past + s]: 0 where a query may look, -1e9 elsewhere."""
    total = g.op("Gather", g.op("Shape", "attention_mask"), g.i64("one", [1]), axis=0)
    seq = g.op("Gather", g.op("Shape", "input_ids"), g.i64("one", [1]), axis=0)
    zero, step = g.const("zero_s", np.asarray(0, np.int64)), g.const("one_s", np.asarray(1, np.int64))
    total_s = g.op("Squeeze", total, g.i64("zero", [0]))
    seq_s = g.op("Squeeze", seq, g.i64("zero", [0]))
    keys = g.op("Range", zero, total_s, step)
    queries = g.op("Range", g.op("Sub", total_s, seq_s), total_s, step)
    causal = g.op(
        "LessOrEqual", g.op("Unsqueeze", keys, g.i64("zero", [0])), g.op("Unsqueeze", queries, g.i64("one", [1]))
    )
    mask = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.BOOL), g.i64("axes12", [1, 2]))
    allowed = g.op("And", causal, mask)
    return g.op("Where", allowed, g.f32("no_bias", 0.0), g.f32("masked", -1e9))


def _layer(g: _Graph, i: int, x: str, cos: str, sin: str, bias: str, outputs: list[str]) -> str:
    h = g.rms(x, f"ln1_{i}")
    q = _rotary(g, _heads(g, g.op("MatMul", h, g.weight(f"q{i}", HIDDEN, HIDDEN))), cos, sin)
    k = _rotary(g, _heads(g, g.op("MatMul", h, g.weight(f"k{i}", HIDDEN, HIDDEN))), cos, sin)
    v = _heads(g, g.op("MatMul", h, g.weight(f"v{i}", HIDDEN, HIDDEN)))
    g.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.key", k], [f"present.{i}.key"], axis=2))
    g.nodes.append(helper.make_node("Concat", [f"past_key_values.{i}.value", v], [f"present.{i}.value"], axis=2))
    outputs += [f"present.{i}.key", f"present.{i}.value"]
    scores = g.op("MatMul", q, g.op("Transpose", f"present.{i}.key", perm=[0, 1, 3, 2]))
    scores = g.op("Add", g.op("Mul", scores, g.f32("scale", 1 / np.sqrt(HEAD))), bias)
    attended = g.op("MatMul", g.op("Softmax", scores, axis=-1), f"present.{i}.value")
    merged = g.op("Reshape", g.op("Transpose", attended, perm=[0, 2, 1, 3]), g.i64("merge_heads", [0, 0, HIDDEN]))
    x = g.op("Add", x, g.op("MatMul", merged, g.weight(f"o{i}", HIDDEN, HIDDEN)))
    h = g.rms(x, f"ln2_{i}")
    gate = g.op("MatMul", h, g.weight(f"gate{i}", HIDDEN, INTER))
    up = g.op("MatMul", h, g.weight(f"up{i}", HIDDEN, INTER))
    act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    return g.op("Add", x, g.op("MatMul", act, g.weight(f"down{i}", INTER, HIDDEN)))


def optimum_decoder(vocab: int, context: int, seed: int = 0) -> onnx.ModelProto:
    """The graph, with random weights drawn from ``seed``."""
    g = _Graph(seed)
    inv = 1.0 / 10000 ** (np.arange(0, HEAD, 2) / HEAD)
    angles = np.outer(np.arange(context), inv)
    table = np.concatenate([angles, angles], axis=1)
    cos = g.op(
        "Unsqueeze", g.op("Gather", g.const("cos", np.cos(table).astype(np.float32)), "position_ids"), g.i64("one", [1])
    )
    sin = g.op(
        "Unsqueeze", g.op("Gather", g.const("sin", np.sin(table).astype(np.float32)), "position_ids"), g.i64("one", [1])
    )
    x = g.op("Gather", g.weight("embed", vocab, HIDDEN), "input_ids")
    bias = _attention_bias(g)
    presents: list[str] = []
    for i in range(LAYERS):
        x = _layer(g, i, x, cos, sin, bias, presents)
    g.nodes.append(helper.make_node("MatMul", [g.rms(x, "final_ln"), g.weight("lm_head", HIDDEN, vocab)], ["logits"]))
    kv = ["batch_size", HEADS, "past_sequence_length", HEAD]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
    ] + [
        helper.make_tensor_value_info(f"past_key_values.{i}.{n}", TensorProto.FLOAT, kv)
        for i in range(LAYERS)
        for n in ("key", "value")
    ]
    present = ["batch_size", HEADS, "total_sequence_length", HEAD]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab])]
    outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, present) for n in presents]
    graph = helper.make_graph(g.nodes, "optimum_llama", inputs, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tests.support")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def write_optimum_folder(out: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    """A folder the engine loads: the graph as ``model.onnx``, a ``genai_config.json`` that
    names ``position_ids``, and the tokenizer files of ``tokenizer_from``."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((tokenizer_from / "genai_config.json").read_text())
    model, decoder = config["model"], config["model"]["decoder"]
    vocab, context = int(model["vocab_size"]), 256
    model["context_length"] = context
    decoder.update(num_hidden_layers=LAYERS, num_key_value_heads=HEADS, num_attention_heads=HEADS, head_size=HEAD)
    decoder.update(hidden_size=HIDDEN, filename="model.onnx")
    decoder["inputs"]["position_ids"] = "position_ids"
    config.setdefault("search", {})["max_length"] = context
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))
    onnx.save(optimum_decoder(vocab, context, seed), str(out / "model.onnx"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    return out
