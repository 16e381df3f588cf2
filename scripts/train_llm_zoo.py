"""Train the zoo's small language model and commit it in the ONNX Runtime GenAI layout (``make zoo-train``).

Optional and seeded; needs torch, transformers and onnxruntime-genai, which the project never
installs: run it from the torch venv with ``PYTHONPATH`` at the checkout::

    PYTHONPATH=$PWD /path/to/torchvenv/bin/python scripts/train_llm_zoo.py

Steps: split the Python standard library's top-level source (``modelfleet.zoo.llm.corpus``)
into training and held-out files; train the byte-level BPE tokenizer on the training files;
train a small ``LlamaForCausalLM`` on them (random 512-token windows, AdamW, cosine schedule);
measure held-out perplexity against a unigram model; export with the GenAI model builder
(``-p fp32 -e cpu``); check that ONNX Runtime's perplexity on the export matches torch's and that
``modelfleet.zoo.llm``'s own writer, given the same weights, writes the same logits; then write
the folder (``genai/``), ``eval.txt`` (the held-out text) and ``llm.json`` (how it was made and what it
scored) into ``modelfleet/zoo/weights/llm/``. A model not clearly better than unigram is not written."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import transformers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from modelfleet.zoo.llm import corpus
from modelfleet.zoo.llm.genai_folder import GENAI_CONFIG, TOKENIZER_FILES, copy_tokenizer, write_decoder
from modelfleet.zoo.llm.shapes import TRAINED_SHAPE
from modelfleet.zoo.llm.tokenizer import END_OF_TEXT, END_OF_TURN, save_tokenizer, train_tokenizer
from modelfleet.zoo.llm.trained import EVAL_FILE, GENAI_DIR, META_FILE, TRAINED_DIR

SEED = 0
#: Held-out files go into eval.txt whole, in name order, while they fit.
EVAL_BYTES = 64_000
#: The export must score as torch does; our writer's logits must match the builder's.
MAX_PPL_REL_DIFF, MAX_LOGIT_DIFF = 1e-3, 1e-4
#: Written only when held-out perplexity is below this fraction of the unigram model's.
MAX_PPL_OVER_UNIGRAM = 0.25


def eval_text(held_out: list[Path]) -> str:
    parts, size = [], 0
    for path in held_out:
        text = corpus.read_text(path)
        if size + len(text.encode()) <= EVAL_BYTES:
            parts.append(text)
            size += len(text.encode())
    return "\n".join(parts)


def windows(ids: np.ndarray, length: int) -> np.ndarray:
    """Non-overlapping windows of ``length`` tokens (the tail that does not fill one is dropped)."""
    n = len(ids) // length
    return ids[: n * length].reshape(n, length)


def unigram_perplexity(train_ids: np.ndarray, eval_ids: np.ndarray, vocab: int) -> float:
    counts = np.bincount(train_ids, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[eval_ids].mean()))


def train(model: LlamaForCausalLM, ids: np.ndarray, args: argparse.Namespace) -> list[float]:
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / args.steps)))
    )
    length, losses = TRAINED_SHAPE.context, []
    model.train()
    for step in range(args.steps):
        starts = rng.integers(0, len(ids) - length - 1, args.batch)
        batch = torch.from_numpy(np.stack([ids[s : s + length] for s in starts]))
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 25 == 0 or step == args.steps - 1:
            print(f"step {step:4d} loss {np.mean(losses[-25:]):.3f}", flush=True)
    model.eval()
    return losses


@torch.no_grad()
def torch_perplexity(model: LlamaForCausalLM, rows: np.ndarray) -> float:
    losses = [float(model(input_ids=torch.from_numpy(r[None]), labels=torch.from_numpy(r[None])).loss) for r in rows]
    return float(np.exp(np.mean(losses)))


def onnx_logits(folder: Path, rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    s = TRAINED_SHAPE
    feeds = {"input_ids": rows, "attention_mask": np.ones_like(rows)}
    empty = np.zeros((len(rows), s.kv_heads, 0, s.head_size), np.float32)
    feeds |= {f"past_key_values.{i}.{kind}": empty for i in range(s.layers) for kind in ("key", "value")}
    return session.run(["logits"], feeds)[0]


def onnx_perplexity(logits: np.ndarray, rows: np.ndarray) -> float:
    logits = logits[:, :-1].astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return float(np.exp(-np.take_along_axis(logp, rows[:, 1:, None], -1).mean()))


def export(model: LlamaForCausalLM, tok_dir: Path, work: Path) -> Path:
    hf_dir, out = work / "hf", work / "genai"
    model.save_pretrained(hf_dir)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tok_dir / name, hf_dir / name)
    GenerationConfig(bos_token_id=0, eos_token_id=[0, 4], pad_token_id=0).save_pretrained(hf_dir)
    builder = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out)]
    run = subprocess.run(
        [*builder, "-p", "fp32", "-e", "cpu", "-c", str(work / "cache")], capture_output=True, text=True
    )
    if run.returncode:
        sys.exit(f"the GenAI builder failed:\n{run.stdout}\n{run.stderr}")
    # The builder re-saves the tokenizer through transformers (dropping the chat_template key): ours, as trained.
    copy_tokenizer(tok_dir, out, TRAINED_SHAPE.context)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=360)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=TRAINED_DIR)
    parser.add_argument("--floor", type=float, default=MAX_PPL_OVER_UNIGRAM, help="max perplexity / unigram's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = TRAINED_SHAPE
    files = corpus.source_files()
    train_files, held_out = corpus.split(files)
    work = Path(tempfile.mkdtemp(prefix="llm-zoo-"))
    tokenizer = train_tokenizer((corpus.read_text(p) for p in train_files), shape.vocab or 0)
    tok_dir = save_tokenizer(tokenizer, work / "tokenizer", shape.context)
    eot = tokenizer.token_to_id(END_OF_TEXT)
    train_ids = np.concatenate([np.array([*tokenizer.encode(corpus.read_text(p)).ids, eot]) for p in train_files])
    text = eval_text(held_out)
    eval_ids = np.array(tokenizer.encode(text).ids, dtype=np.int64)
    rows = windows(eval_ids, shape.context)
    unigram = unigram_perplexity(train_ids, eval_ids, shape.vocab or 0)
    print(f"{len(train_files)} training files, {len(train_ids):,} tokens; eval.txt {len(eval_ids):,} tokens")

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.context, rms_norm_eps=shape.rms_eps, rope_theta=shape.rope_theta,
        bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    started = time.monotonic()
    losses = train(model, train_ids.astype(np.int64), args)
    seconds = time.monotonic() - started
    ppl = torch_perplexity(model, rows)
    print(f"trained in {seconds:.0f} s; held-out perplexity {ppl:.2f} (unigram {unigram:.1f})")
    if ppl > args.floor * unigram:
        sys.exit(f"held-out perplexity {ppl:.2f} is not clearly below unigram's {unigram:.1f}: not written")

    built = export(model, tok_dir, work)
    logits = onnx_logits(built, rows)
    onnx_ppl = onnx_perplexity(logits, rows)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    ours = write_decoder(work / "ours", shape, tok_dir, weights=state)
    writer_diff = float(np.abs(onnx_logits(ours, rows[:2]) - logits[:2]).max())
    same_config = json.loads((ours / GENAI_CONFIG).read_text()) == json.loads((built / GENAI_CONFIG).read_text())
    print(f"ONNX Runtime perplexity {onnx_ppl:.4f}; zoo writer vs builder, max logit diff {writer_diff:.2g}")
    if abs(onnx_ppl - ppl) > MAX_PPL_REL_DIFF * ppl or writer_diff > MAX_LOGIT_DIFF or not same_config:
        sys.exit("the export does not score as torch does, or the zoo writer disagrees with the builder")

    shutil.rmtree(args.out / GENAI_DIR, ignore_errors=True)
    (args.out / GENAI_DIR).mkdir(parents=True)
    for name in ("model.onnx", "model.onnx.data", GENAI_CONFIG, *TOKENIZER_FILES):
        shutil.copyfile(built / name, args.out / GENAI_DIR / name)
    (args.out / EVAL_FILE).write_text(text, encoding="utf-8")
    meta = {
        "architecture": "LlamaForCausalLM",
        "shape": dataclasses.asdict(shape),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "corpus": f"Python {sys.version.split()[0]} standard library, top-level *.py (modelfleet.zoo.llm.corpus)",
        "train_files": len(train_files), "train_tokens": len(train_ids),
        "held_out_files": [p.name for p in held_out], "eval_tokens": len(eval_ids), "eval_windows": len(rows),
        "heldout_perplexity": round(onnx_ppl, 3), "unigram_perplexity": round(unigram, 2),
        "final_train_loss": round(float(np.mean(losses[-25:])), 4),
        "steps": args.steps, "batch": args.batch, "sequence": shape.context, "lr": args.lr,
        "train_seconds": round(seconds, 1), "threads": args.threads, "seed": SEED,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "exported_with": "python -m onnxruntime_genai.models.builder -p fp32 -e cpu",
        "zoo_writer_max_logit_diff": writer_diff, "eos": [END_OF_TEXT, END_OF_TURN],
    }  # fmt: skip
    (args.out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {sum(p.stat().st_size for p in args.out.rglob('*') if p.is_file()):,} bytes")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
