"""The zoo's language-model shapes: the trained one, and random-weight ones for tests and speed."""

from __future__ import annotations

from modelfleet.zoo.llm.decoder_shape import DecoderShape

#: The model ``scripts/train_llm_zoo.py`` trains (about 1.3M parameters, 5 MB in FP32).
TRAINED_SHAPE = DecoderShape(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, vocab=2048, context=512)

#: Random-weight shapes by name; ``vocab`` open: the tokenizer's (the trained model's, 2,048).
SHAPES: dict[str, DecoderShape] = {
    # Tests: 336K parameters, milliseconds per step, still two layers and grouped KV heads.
    "tiny": DecoderShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, context=512),
    # Benchmarks: 185M parameters with the 2,048-token vocabulary (739 MB in FP32; written in about
    # 5 s), at 2,048 tokens of context: ~28 tokens/s FP32 decode with onnxruntime-genai on 2 cores.
    "200m": DecoderShape(hidden=1024, layers=16, heads=16, kv_heads=4, intermediate=2816, context=2048),
    # Distribution: 517M parameters, 2.07 GB in FP32 (the bytes of a 1B model in FP16), 16 layers of
    # 127 MB; written in tens of seconds. Made to be moved around a fleet, too slow to serve on 2 cores.
    "500m": DecoderShape(hidden=1728, layers=16, heads=12, kv_heads=4, intermediate=4608, context=2048),
}
