"""Choosing the next token from a row of logits, in numpy.

Each request owns a ``np.random.Generator`` seeded from its ``seed`` and draws exactly one
number per sampled step, so its tokens do not depend on the other rows in the batch, and a
stream resumed after ``resume_offset`` tokens (on another node) skips that many draws and
draws what the first node would have drawn next."""

from __future__ import annotations

import numpy as np

from edge_node.generation.types import SamplingParams

__all__ = ["TokenSampler"]


class TokenSampler:
    """The sampling state of one sequence: its parameters, generator and seen tokens."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab: int) -> None:
        self.params = params
        # no seed: fresh OS entropy, as numpy does
        self._rng = np.random.Generator(np.random.PCG64(params.seed))
        if params.resume_offset and not params.greedy:
            self._rng.random(params.resume_offset)  # the draws of the tokens already sent
        self._penalised = params.repetition_penalty != 1.0
        self._seen = np.zeros(vocab, dtype=bool)
        if self._penalised:
            self._seen[np.asarray(prompt_ids, dtype=np.int64) % vocab] = True

    def next_token(self, logits: np.ndarray) -> int:
        """The token chosen from ``logits`` [vocab] (float32)."""
        p = self.params
        if self._penalised:
            logits = _penalise(logits, self._seen, p.repetition_penalty)
        token = int(np.argmax(logits)) if p.greedy else self._sample(logits)
        if self._penalised:
            self._seen[token] = True
        return token

    def _sample(self, logits: np.ndarray) -> int:
        p = self.params
        candidates = np.arange(logits.shape[0])
        scores = logits.astype(np.float64) / p.temperature
        if p.top_k == 0 and p.top_p >= 1.0:  # plain temperature: no sort needed
            probs = np.exp(scores - scores.max())
            cdf = np.cumsum(probs)
            index = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
            return min(index, scores.shape[0] - 1)
        if 0 < p.top_k < scores.shape[0]:
            candidates = np.argpartition(-scores, p.top_k - 1)[: p.top_k]
            scores = scores[candidates]
        order = np.argsort(-scores, kind="stable")
        candidates, scores = candidates[order], scores[order]
        probs = np.exp(scores - scores[0])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        draw = self._rng.random()
        index = min(int(np.searchsorted(np.cumsum(probs), draw, side="right")), len(candidates) - 1)
        return int(candidates[index])


def _penalise(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """Hugging Face's repetition penalty: seen tokens' positive logits divided, negative multiplied."""
    out = logits.copy()
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out
