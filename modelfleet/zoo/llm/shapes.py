"""The zoo's language-model shapes: the trained one, and random-weight ones for tests and speed."""

from __future__ import annotations

from modelfleet.zoo.llm.decoder_graph import DecoderShape

#: The model ``scripts/train_llm_zoo.py`` trains (about 1.3M parameters, 5 MB in FP32).
TRAINED_SHAPE = DecoderShape(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, vocab=2048, context=512)

#: Random-weight shapes by name; ``vocab`` open: the tokenizer's (the trained model's, 2,048).
SHAPES: dict[str, DecoderShape] = {
    # Tests: milliseconds per step, still two layers and grouped KV heads.
    "tiny": DecoderShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, context=512),
    # Benchmarks: a ~200M-parameter decoder at 2,048 tokens of context (757 MB in FP32).
    "200m": DecoderShape(hidden=1024, layers=16, heads=16, kv_heads=4, intermediate=2816, context=2048),
}
