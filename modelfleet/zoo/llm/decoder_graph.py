"""A Llama decoder as ONNX Runtime GenAI's model builder writes it for CPU FP32, from numpy alone.

``python -m onnxruntime_genai.models.builder -p fp32 -e cpu`` turns a Hugging Face Llama into
one graph: ``input_ids``, ``attention_mask`` and ``past_key_values.N.key/value`` in,
``logits`` and ``present.N.key/value`` out; per layer an RMSNorm (``SimplifiedLayerNormalization``
or, with the residual add fused, ``SkipSimplifiedLayerNormalization``), one MatMul for Q, K and
V together, ``GroupQueryAttention`` doing rotary embedding itself (``do_rotary``, from cos/sin
caches) and deriving each row's length and positions from ``attention_mask``, then a SiLU MLP.
This module writes that graph with the builder's node, value and initializer names, so that
anything made for the builder's output (the GenAI runtime, the edge's engine, quantizers that
pick MatMuls by name) takes ours, without torch. Weights stream tensor by tensor into
``model.onnx.data``: a ~200M-parameter shape is written in seconds."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from modelfleet.zoo.external import DATA_FILE, MODEL_FILE, ExternalDataWriter
from modelfleet.zoo.llm.decoder_shape import DecoderShape, Weights, WeightSource, rotary_caches

#: What the builder stamps on its graphs (ONNX opset 22 and the contrib domain, IR 10).
OPSET = 22
IR_VERSION = 10
PRODUCER = "modelfleet.zoo.llm"

INPUT_IDS, ATTENTION_MASK, LOGITS = "input_ids", "attention_mask", "logits"
PAST_KEY, PAST_VALUE = "past_key_values.%d.key", "past_key_values.%d.value"
PRESENT_KEY, PRESENT_VALUE = "present.%d.key", "present.%d.value"

_MASK = "/model/attn_mask_reformat/attn_mask_subgraph"
_SEQLENS, _TOTAL = f"{_MASK}/Sub/Cast/output_0", f"{_MASK}/Gather/Cast/output_0"
_ONE_1D, _ONE = "/model/constants/INT64/[1]", "/model/constants/INT64/1"
_BATCH, _SEQ, _TOTAL_SEQ, _PAST_SEQ = "batch_size", "sequence_length", "total_sequence_length", "past_sequence_length"


def _node(
    op: str, name: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs: object
) -> onnx.NodeProto:
    node = helper.make_node(op, inputs, outputs, name=name, domain=domain or None)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())  # in the builder's order
    return node


class _GraphWriter:
    """Collects the builder's nodes and the value infos of their outputs, and streams weights."""

    def __init__(self, shape: DecoderShape, data: ExternalDataWriter) -> None:
        self.shape, self.data = shape, data
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.values: list[onnx.ValueInfoProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.data.add(name, array.shape, iter([array])))
        self.values.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(array.shape)))
        return name

    def add(self, node: onnx.NodeProto, *shapes: tuple[int, list[int | str] | None]) -> None:
        """Add ``node``; ``shapes`` gives (element type, dims) of each non-empty output."""
        self.nodes.append(node)
        for out, (dtype, dims) in zip([o for o in node.output if o], shapes, strict=True):
            self.values.append(helper.make_tensor_value_info(out, dtype, dims))

    def act(self, width: int) -> tuple[int, list[int | str]]:
        return TensorProto.FLOAT, [_BATCH, _SEQ, width]

    def matmul(self, path: str, x: str, weight: str, width: int, out: str | None = None) -> str:
        out = out or f"{path}/MatMul/output_0"
        self.add(_node("MatMul", f"{path}/MatMul", [x, weight], [out]), self.act(width))
        return out

    def skip_norm(self, path: str, residual: str, x: str, weight: str, last: bool) -> tuple[str, str]:
        """RMSNorm of ``residual + x``; returns (normed, the sum as the next residual)."""
        out, summed = f"{path}/output_0", "" if last else f"{path}/output_3"
        outputs = [out] if last else [out, "", "", summed]
        eps = self.shape.rms_eps
        node = _node(
            "SkipSimplifiedLayerNormalization",
            f"{path}/SkipLayerNorm",
            [residual, x, weight],
            outputs,
            domain="com.microsoft",
            epsilon=eps,
        )
        self.add(node, *([self.act(self.shape.hidden)] * (1 if last else 2)))
        return out, summed


def _mask_subgraph(g: _GraphWriter) -> None:
    """``seqlens_k`` (each row's tokens minus one) and ``total_sequence_length`` for GroupQueryAttention."""
    i64, i32 = TensorProto.INT64, TensorProto.INT32
    one = helper.make_tensor(_ONE_1D, i64, [1], np.int64(1).tobytes(), raw=True)
    g.add(_node("Constant", "/model/constant_nodes/INT64/[1]", [], [_ONE_1D], value=one), (i64, []))
    g.add(
        _node(
            "ReduceSum", f"{_MASK}/ReduceSum", [ATTENTION_MASK, _ONE_1D], [f"{_MASK}/ReduceSum/output_0"], keepdims=0
        ),
        (i64, [_BATCH]),
    )
    g.add(
        _node("Sub", f"{_MASK}/Sub", [f"{_MASK}/ReduceSum/output_0", _ONE_1D], [f"{_MASK}/Sub/output_0"]),
        (i64, [_BATCH]),
    )
    g.add(_node("Cast", f"{_MASK}/Sub/Cast", [f"{_MASK}/Sub/output_0"], [_SEQLENS], to=i32), (i32, [_BATCH]))
    g.add(_node("Shape", f"{_MASK}/Shape", [ATTENTION_MASK], [f"{_MASK}/Shape/output_0"]), (i64, [2]))
    scalar_one = helper.make_tensor(_ONE, i64, [], np.int64(1).tobytes(), raw=True)
    g.add(_node("Constant", "/model/constant_nodes/INT64/1", [], [_ONE], value=scalar_one), (i64, []))
    g.add(
        _node("Gather", f"{_MASK}/Gather", [f"{_MASK}/Shape/output_0", _ONE], [f"{_MASK}/Gather/output_0"], axis=0),
        (i64, []),
    )
    g.add(_node("Cast", f"{_MASK}/Gather/Cast", [f"{_MASK}/Gather/output_0"], [_TOTAL], to=i32), (i32, None))


def _attention(g: _GraphWriter, w: WeightSource, i: int, normed: str, caches: Callable[[], tuple[str, str]]) -> str:
    s, path, hf = g.shape, f"/model/layers.{i}/attn", f"model.layers.{i}.self_attn."
    qkv_w = g.weight(
        f"model.layers.{i}.attn.qkv_proj.MatMul.weight",
        w.matmul(hf + "q_proj.weight", hf + "k_proj.weight", hf + "v_proj.weight"),
    )
    qkv = g.matmul(f"{path}/qkv_proj", normed, qkv_w, s.qkv_width)
    cos, sin = caches()
    inputs = [qkv, "", "", PAST_KEY % i, PAST_VALUE % i, _SEQLENS, _TOTAL, cos, sin, "", "", ""]
    outputs = [f"{path}/GroupQueryAttention/output_0", PRESENT_KEY % i, PRESENT_VALUE % i]
    gqa = _node(
        "GroupQueryAttention",
        f"{path}/GroupQueryAttention",
        inputs,
        outputs,
        domain="com.microsoft",
        num_heads=s.heads,
        kv_num_heads=s.kv_heads,
        scale=1.0 / math.sqrt(s.head_size),
        local_window_size=-1,
        softcap=0.0,
        do_rotary=1,
        rotary_interleaved=0,
    )
    g.nodes.append(gqa)
    g.values.append(helper.make_tensor_value_info(outputs[0], TensorProto.FLOAT, [_BATCH, _SEQ, s.hidden]))
    o_w = g.weight(f"model.layers.{i}.attn.o_proj.MatMul.weight", w.matmul(hf + "o_proj.weight"))
    return g.matmul(f"{path}/o_proj", outputs[0], o_w, s.hidden)


def _mlp(g: _GraphWriter, w: WeightSource, i: int, normed: str) -> str:
    s, path, hf = g.shape, f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp."
    proj = {
        n: g.weight(f"model.layers.{i}.mlp.{n}.MatMul.weight", w.matmul(f"{hf}{n}.weight"))
        for n in ("gate_proj", "up_proj", "down_proj")
    }
    gate = g.matmul(f"{path}/gate_proj", normed, proj["gate_proj"], s.intermediate)
    up = g.matmul(f"{path}/up_proj", normed, proj["up_proj"], s.intermediate)
    act = f"{path}/act_fn"
    g.add(_node("Sigmoid", f"{act}/Sigmoid", [gate], [f"{act}/Sigmoid/output_0"]), g.act(s.intermediate))
    g.add(_node("Mul", f"{act}/Mul", [gate, f"{act}/Sigmoid/output_0"], [f"{act}/Mul/output_0"]), g.act(s.intermediate))
    g.add(_node("Mul", f"{path}/Mul", [f"{act}/Mul/output_0", up], [f"{path}/Mul/output_0"]), g.act(s.intermediate))
    return g.matmul(f"{path}/down_proj", f"{path}/Mul/output_0", proj["down_proj"], s.hidden)


def _decoder_nodes(g: _GraphWriter, w: WeightSource) -> None:
    s = g.shape
    _mask_subgraph(g)
    embed = g.weight("model.embed_tokens.weight", w.hf("model.embed_tokens.weight"))
    hidden = "/model/embed_tokens/Gather/output_0"
    g.add(_node("Gather", "/model/embed_tokens/Gather", [embed, INPUT_IDS], [hidden]), g.act(s.hidden))
    written: list[str] = []

    def caches() -> tuple[str, str]:  # after the first layer's QKV weight, where the builder puts them
        if not written:
            cos, sin = rotary_caches(s)
            written.extend([g.weight("cos_cache", cos), g.weight("sin_cache", sin)])
        return written[0], written[1]

    residual, mlp_out = hidden, ""
    for i in range(s.layers):
        path, norm_w = f"/model/layers.{i}/input_layernorm", f"model.layers.{i}.input_layernorm.weight"
        g.weight(norm_w, w.hf(norm_w))
        if i == 0:
            normed = f"{path}/output_0"
            node = _node(
                "SimplifiedLayerNormalization",
                f"{path}/LayerNorm",
                [hidden, norm_w],
                [normed],
                epsilon=s.rms_eps,
                axis=-1,
                stash_type=1,
            )
            g.add(node, g.act(s.hidden))
        else:
            normed, residual = g.skip_norm(path, residual, mlp_out, norm_w, last=False)
        attn_out = _attention(g, w, i, normed, caches)
        post_w = g.weight(
            f"model.layers.{i}.post_attention_layernorm.weight",
            w.hf(f"model.layers.{i}.post_attention_layernorm.weight"),
        )
        normed, residual = g.skip_norm(f"/model/layers.{i}/post_attention_layernorm", residual, attn_out, post_w, False)
        mlp_out = _mlp(g, w, i, normed)
    final = f"/model/layers.{s.layers}/final_norm_layernorm"
    final_w = g.weight(f"model.layers.{s.layers}.final_norm_layernorm.weight", w.hf("model.norm.weight"))
    normed, _ = g.skip_norm(final, residual, mlp_out, final_w, last=True)
    lm_w = g.weight("lm_head.MatMul.weight", w.matmul("lm_head.weight"))
    g.nodes.append(_node("MatMul", "/lm_head/MatMul", [normed, lm_w], [LOGITS]))


def _io(shape: DecoderShape) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info(INPUT_IDS, i64, [_BATCH, _SEQ]),
        helper.make_tensor_value_info(ATTENTION_MASK, i64, [_BATCH, _TOTAL_SEQ]),
    ]
    outputs = [helper.make_tensor_value_info(LOGITS, f32, [_BATCH, _SEQ, shape.vocab])]
    for names, seq, into in (
        (PAST_KEY, _PAST_SEQ, inputs),
        (PAST_VALUE, _PAST_SEQ, inputs),
        (PRESENT_KEY, _TOTAL_SEQ, outputs),
        (PRESENT_VALUE, _TOTAL_SEQ, outputs),
    ):
        into += [
            helper.make_tensor_value_info(names % i, f32, [_BATCH, shape.kv_heads, seq, "kv_cache_dim"])
            for i in range(shape.layers)
        ]
    return inputs, outputs


def write_decoder_graph(
    directory: Path,
    shape: DecoderShape,
    *,
    seed: int = 0,
    weights: Weights | None = None,
    layer_seeds: Mapping[int, int] | None = None,
) -> Path:
    """Write ``model.onnx`` + ``model.onnx.data`` for ``shape`` (``vocab`` resolved) into ``directory``.

    ``weights`` are a ``LlamaForCausalLM`` state dict as numpy arrays (``lm_head.weight``
    may be left out for tied embeddings); ``None`` draws them from ``seed``: normal with
    standard deviation ``INIT_STD``, norms at one, the layers ``layer_seeds`` names from
    their own seeds."""
    source = WeightSource(shape, seed, weights, layer_seeds)  # checks them before anything is written
    directory.mkdir(parents=True, exist_ok=True)
    data = ExternalDataWriter(directory / DATA_FILE)
    g = _GraphWriter(shape, data)
    try:
        _decoder_nodes(g, source)
    finally:
        data.close()
    inputs, outputs = _io(shape)
    graph = helper.make_graph(g.nodes, "main_graph", inputs, outputs, initializer=g.initializers, value_info=g.values)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER, ir_version=IR_VERSION)
    path = directory / MODEL_FILE
    onnx.save_model(model, str(path))
    return path
