"""Check ``modelfleet.zoo.llm``'s decoder against ONNX Runtime GenAI's model builder (a dev check).

Given a Hugging Face Llama folder and the builder's CPU FP32 export of it, write our graph from
the same safetensors and compare logits (a prompt, then one more token on its past KV), and the
two graphs' node lists; then load our folder with onnxruntime-genai and generate a few tokens.
Run it where ``safetensors``, ``onnxruntime`` and ``onnxruntime_genai`` are installed::

    python -m onnxruntime_genai.models.builder -i HF_DIR -o BUILT -p fp32 -e cpu
    PYTHONPATH=$PWD python scripts/check_llm_builder_parity.py HF_DIR BUILT"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from safetensors.numpy import load_file

from modelfleet.zoo.llm.decoder_shape import DecoderShape
from modelfleet.zoo.llm.genai_folder import write_decoder


def shape_of(hf_dir: Path) -> DecoderShape:
    c = json.loads((hf_dir / "config.json").read_text())
    theta = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 10000.0)
    return DecoderShape(
        hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
        kv_heads=c["num_key_value_heads"], intermediate=c["intermediate_size"], vocab=c["vocab_size"],
        context=c["max_position_embeddings"], rope_theta=theta, rms_eps=c["rms_norm_eps"],
    )  # fmt: skip


def run(session: ort.InferenceSession, shape: DecoderShape, ids: np.ndarray, past: list[np.ndarray] | None) -> list:
    b, s = ids.shape
    past_len = 0 if past is None else past[0].shape[2]
    feeds = {"input_ids": ids, "attention_mask": np.ones((b, past_len + s), np.int64)}
    for i in range(shape.layers):
        for j, kind in enumerate(("key", "value")):
            empty = np.zeros((b, shape.kv_heads, 0, shape.head_size), np.float32)
            feeds[f"past_key_values.{i}.{kind}"] = empty if past is None else past[2 * i + j]
    names = ["logits"] + [f"present.{i}.{kind}" for i in range(shape.layers) for kind in ("key", "value")]
    return session.run(names, feeds)


def nodes(path: Path) -> list[bytes]:
    """Each node, serialized: op, name, wiring and attributes (in order)."""
    g = onnx.load(str(path), load_external_data=False).graph
    return [n.SerializeToString() for n in g.node]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("built_dir", type=Path)
    args = parser.parse_args()
    shape = shape_of(args.hf_dir)
    weights = load_file(str(args.hf_dir / "model.safetensors"))
    out = Path(tempfile.mkdtemp()) / "ours"
    write_decoder(out, shape, args.hf_dir, weights=weights)
    print(
        "byte-identical nodes (ops, names, wiring, attributes):",
        nodes(out / "model.onnx") == nodes(args.built_dir / "model.onnx"),
    )
    ids = np.random.default_rng(0).integers(0, shape.vocab, (2, 23)).astype(np.int64)
    worst = 0.0
    sessions = [
        ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"]) for d in (out, args.built_dir)
    ]
    prefill = [run(s, shape, ids, None) for s in sessions]
    step = ids[:, :1] + 1
    decode = [run(s, shape, step, p[1:]) for s, p in zip(sessions, prefill, strict=True)]
    for name, (a, b) in {"prefill": prefill, "decode with past KV": decode}.items():
        diff = max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
        worst = max(worst, diff)
        print(f"{name}: max |logits, present diff| = {diff:.3g}")
    import onnxruntime_genai as og  # only this check needs it

    model = og.Model(str(out))
    tokenizer = og.Tokenizer(model)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=40)
    generator = og.Generator(model, params)
    generator.append_tokens(tokenizer.encode("def main():"))
    while not generator.is_done():
        generator.generate_next_token()
    print("onnxruntime-genai generated:", repr(tokenizer.decode(generator.get_sequence(0))))
    print("PASS" if worst < 1e-4 else "FAIL")


if __name__ == "__main__":
    main()
