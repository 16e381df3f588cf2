"""The text guard: a weight-only candidate against the pushed (reference) weights on
held-out text, by two measures, each with a one-sided confidence bound.

Each window is one forward pass with an empty KV cache (teacher forcing): at every
position but the last, the model's log-probability of the text's next token and its
argmax (the token greedy decoding would emit) are kept.

* **perplexity ratio** (candidate / reference): ``exp(mean over windows of d_w)``, where
  ``d_w`` is the window's mean of ``log p_ref − log p_cand`` over its tokens (the log of
  the window's perplexity ratio); its upper bound is ``exp(mean + z·sd/√n)`` over the n
  windows (windows, not tokens, are the independent samples). Passes when the upper bound
  is at most ``max_perplexity_ratio`` (1.10).
* **greedy agreement**: the share of positions where the candidate's argmax is the
  reference's, given the same (the text's) prefix: teacher-forced next-token agreement,
  not agreement of free-running generations (which diverge for good after one different
  token, and so measure mostly where the first difference falls). Its lower bound is the
  Wilson score bound over the positions. Passes when the lower bound is at least the
  threshold (0.90, or the push's ``--threshold``).

A candidate passes when both do. The measure that *decided* is the one that failed (the
perplexity ratio when both did), else the one with the smaller margin relative to its
threshold's distance from a perfect score."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from central.quantize.llm.text import TextWindows
from central.quantize.verdict import wilson_lower_bound
from central.registry.decoder import DecoderSpec

#: Largest exponent taken: a ratio past e^700 is "infinitely worse" all the same.
_MAX_EXPONENT = 700.0


def _exp(x: float) -> float:
    return math.exp(min(x, _MAX_EXPONENT))


@dataclass(frozen=True)
class TextRun:
    """One model on the windows: per position, the next token's log-probability and the argmax."""

    logprobs: np.ndarray  # [windows, tokens - 1] float64
    argmax: np.ndarray  # [windows, tokens - 1] int64
    seconds: float


def _kv_type(session: Any, name: str) -> type[np.floating[Any]]:
    text = next(i.type for i in session.get_inputs() if i.name == name)
    return np.float16 if "float16" in text else np.float32


def _feed(spec: DecoderSpec, session: Any, ids: np.ndarray) -> dict[str, np.ndarray]:
    """One window's inputs: the tokens, a full mask, positions, and an empty cache."""
    batch, length = ids.shape
    feed = {spec.input_ids: ids}
    if spec.attention_mask:
        feed[spec.attention_mask] = np.ones((batch, length), dtype=np.int64)
    if spec.position_ids:
        feed[spec.position_ids] = np.broadcast_to(np.arange(length, dtype=np.int64), (batch, length)).copy()
    assert spec.num_kv_heads is not None and spec.head_size is not None
    for layer in range(spec.num_layers):
        for name in spec.past_names(layer):
            feed[name] = np.zeros((batch, spec.num_kv_heads, 0, spec.head_size), dtype=_kv_type(session, name))
    return feed


def run_text(path: Path, spec: DecoderSpec, windows: TextWindows) -> TextRun:
    """Run the model at ``path`` on every window (see the module docstring)."""
    import time

    import onnxruntime as ort

    started = time.perf_counter()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    logprobs, argmax = [], []
    for row in windows.ids:
        ids = row[None, :]
        (logits,) = session.run([spec.logits], _feed(spec, session, ids))
        step = logits[0, :-1].astype(np.float64)
        shifted = step - step.max(axis=-1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        logprobs.append(np.take_along_axis(log_softmax, row[1:, None], axis=-1)[:, 0])
        argmax.append(step.argmax(axis=-1))
    return TextRun(np.stack(logprobs), np.stack(argmax), round(time.perf_counter() - started, 4))


@dataclass(frozen=True)
class TextVerdict:
    """Both measures of one candidate, their bounds and thresholds, and which decided."""

    perplexity_ratio: float
    perplexity_upper: float
    max_perplexity_ratio: float
    agreement: float
    agreement_lower: float
    min_agreement: float
    windows: int
    tokens: int
    reference_perplexity: float
    candidate_perplexity: float
    seconds: float

    @property
    def perplexity_passed(self) -> bool:
        return self.perplexity_upper <= self.max_perplexity_ratio

    @property
    def agreement_passed(self) -> bool:
        return self.agreement_lower >= self.min_agreement

    @property
    def passed(self) -> bool:
        return self.perplexity_passed and self.agreement_passed

    @property
    def decided_by(self) -> str:
        """``perplexity_ratio`` or ``greedy_agreement`` (see the module docstring)."""
        if not self.perplexity_passed:
            return "perplexity_ratio"
        if not self.agreement_passed:
            return "greedy_agreement"
        ppl_room = (self.max_perplexity_ratio - self.perplexity_upper) / max(self.max_perplexity_ratio - 1.0, 1e-9)
        agreement_room = (self.agreement_lower - self.min_agreement) / max(1.0 - self.min_agreement, 1e-9)
        return "perplexity_ratio" if ppl_room <= agreement_room else "greedy_agreement"

    def report(self, source: str, confidence: float) -> dict[str, Any]:
        """The guard's entries of a candidate's report."""
        return {
            "passed": self.passed,
            "decided_by": self.decided_by,
            "perplexity_ratio": {
                "value": round(self.perplexity_ratio, 6),
                "upper_bound": round(self.perplexity_upper, 6),
                "max": self.max_perplexity_ratio,
                "passed": self.perplexity_passed,
                "reference_perplexity": round(self.reference_perplexity, 4),
                "candidate_perplexity": round(self.candidate_perplexity, 4),
            },
            "greedy_agreement": {
                "value": round(self.agreement, 6),
                "lower_bound": round(self.agreement_lower, 6),
                "min": self.min_agreement,
                "passed": self.agreement_passed,
                "method": "teacher-forced next-token argmax agreement",
            },
            "windows": self.windows,
            "tokens": self.tokens,
            "samples_source": source,
            "confidence": confidence,
            "seconds": self.seconds,
        }


def judge_text(
    reference: TextRun, candidate: TextRun, *, z: float, max_ratio: float, min_agreement: float
) -> TextVerdict:
    """The candidate's verdict against the reference (see the module docstring)."""
    per_window = (reference.logprobs - candidate.logprobs).mean(axis=1)
    n = per_window.size
    mean = float(per_window.mean())
    spread = float(per_window.std(ddof=1)) / math.sqrt(n) if n > 1 else 0.0
    agree = reference.argmax == candidate.argmax
    tokens = int(agree.size)
    return TextVerdict(
        perplexity_ratio=_exp(mean),
        perplexity_upper=_exp(mean + z * spread),
        max_perplexity_ratio=max_ratio,
        agreement=float(agree.mean()),
        agreement_lower=wilson_lower_bound(int(agree.sum()), tokens, z),
        min_agreement=min_agreement,
        windows=n,
        tokens=tokens,
        reference_perplexity=_exp(-float(reference.logprobs.mean())),
        candidate_perplexity=_exp(-float(candidate.logprobs.mean())),
        seconds=candidate.seconds,
    )
