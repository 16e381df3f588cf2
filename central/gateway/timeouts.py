"""How long the gateway waits for a node's answer to one inference request.

A fixed read timeout is wrong for every model but one: a ResNet batch of 8 can take
seconds where an MLP takes a millisecond, and a request that times out has already cost
the node its work, so it is not sent again (see ``central.gateway.proxy``). The gateway
learns instead: per model, the latencies of the answers it forwarded, with the batch
size (rows) of each request. A request's read timeout is ``factor`` × the model's p99,
scaled up when the request has more rows than the model's usual request, never below
``floor_s`` nor above ``cap_s``. Before a model has any answer the request may use all
of its deadline. An operator may fix a model's timeout (``gateway.model_timeouts``). The
gateway's deadline of a request is at least its read timeout: the deadline is meant to
bound the attempts that never ran, not the one that runs the model.

The rows of a request come from the first dimension of its inputs' ``shape``, found in
the JSON part of the body with a regular expression: the gateway never decodes tensors."""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ReadTimeouts", "request_rows"]

_SHAPE_FIRST_DIM = re.compile(rb'"shape"\s*:\s*\[\s*(\d{1,12})')
#: Answers a model's estimate is recomputed after (sorting the window on every request would cost).
_REFRESH_EVERY = 16


def request_rows(body: bytes, header_length: int | None) -> int:
    """The batch size of an OIP request: the largest first dimension of its inputs'
    shapes (1 when none is found). Only the JSON part is read."""
    text = body if header_length is None else body[: max(0, header_length)]
    dims = [int(m.group(1)) for m in _SHAPE_FIRST_DIM.finditer(text)]
    return max(max(dims, default=1), 1)


def _percentile(sorted_values: list[float], q: float) -> float:
    rank = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


@dataclass
class _ModelLatency:
    """The last answers of one model: (seconds, rows) pairs and the estimate made from them."""

    samples: deque[tuple[float, int]]
    fresh: int = 0
    p99_s: float = 0.0
    usual_rows: float = 1.0

    def estimate(self) -> tuple[float, float]:
        """(p99 seconds, median rows) of the window, recomputed when answers came in since."""
        if self.fresh:
            seconds = sorted(s for s, _ in self.samples)
            rows = sorted(float(r) for _, r in self.samples)
            self.p99_s, self.usual_rows = _percentile(seconds, 0.99), max(1.0, _percentile(rows, 0.5))
            self.fresh = 0
        return self.p99_s, self.usual_rows


class ReadTimeouts:
    """Per-model read timeouts learned from forwarded answers (one event loop, no locks)."""

    def __init__(
        self,
        *,
        factor: float = 4.0,
        floor_s: float = 5.0,
        cap_s: float = 120.0,
        fixed: Mapping[str, float] | None = None,
        window: int = 256,
        max_models: int = 4096,
    ) -> None:
        if factor <= 0 or floor_s <= 0 or cap_s < floor_s or window < 1 or max_models < 1:
            raise ValueError("factor and floor_s must be > 0, cap_s >= floor_s, window and max_models >= 1")
        self.factor = factor
        self.floor_s = floor_s
        self.cap_s = cap_s
        self.fixed: dict[str, float] = dict(fixed or {})
        self._window = window
        self._max_models = max_models
        self._models: OrderedDict[str, _ModelLatency] = OrderedDict()

    def observe(self, model: str, seconds: float, rows: int) -> None:
        """One answered request of ``model`` with ``rows`` rows took ``seconds``."""
        entry = self._models.get(model)
        if entry is None:
            entry = self._models[model] = _ModelLatency(deque(maxlen=self._window))
            if len(self._models) > self._max_models:  # names are the fleet's models, but bound it anyway
                self._models.popitem(last=False)
        else:
            self._models.move_to_end(model)
        entry.samples.append((seconds, max(rows, 1)))
        entry.fresh += 1
        if entry.fresh >= _REFRESH_EVERY or len(entry.samples) <= _REFRESH_EVERY:
            entry.estimate()

    def timeout_for(self, model: str, rows: int) -> float | None:
        """The read timeout of a request of ``model`` with ``rows`` rows; None while the
        model has no answer yet (the caller then waits as long as its deadline allows)."""
        fixed = self.fixed.get(model)
        if fixed is not None:
            return fixed
        entry = self._models.get(model)
        if entry is None or not entry.samples:
            return None
        p99_s, usual_rows = entry.p99_s, entry.usual_rows
        scaled = self.factor * p99_s * max(1.0, rows / usual_rows)
        return min(self.cap_s, max(self.floor_s, scaled))

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per model: p99 seconds, usual rows and the timeout of a usual request."""
        out = {}
        for model, entry in self._models.items():
            p99_s, usual_rows = entry.estimate()
            timeout = self.timeout_for(model, round(usual_rows))
            out[model] = {"p99_s": round(p99_s, 4), "usual_rows": usual_rows, "read_timeout_s": timeout or 0.0}
        return out
