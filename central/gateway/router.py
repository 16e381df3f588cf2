"""Which node a request goes to first, and which ones after it.

Two orders over the nodes that can serve a model (``NodeSource``), skipping nodes whose
circuit breaker is open:

- least outstanding: the node with the fewest requests in flight through this gateway
  first; ties are broken by an index that rotates on every request, so equally loaded
  nodes take turns;
- affinity: a consistent hash (uhashring) of a request key over the candidates' ids
  picks an owner that goes first; the rest follow by least outstanding. The key comes
  from the ``X-Modelfleet-Affinity-Key`` request header. With policy
  ``least_outstanding`` a request is hashed only when it carries a key; with policy
  ``affinity`` a request without one is hashed by its model (and version), so each
  model sticks to one node while it stays healthy.

The ring is built over the candidates whose breakers admit requests, so when a node
fails only its keys move; they come back when it recovers."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from uhashring import HashRing

from central.gateway.breaker import CircuitBreaker
from central.gateway.candidates import Candidate, NodeSource
from central.settings import Policy

POLICIES: tuple[Policy, ...] = ("least_outstanding", "affinity")

_RING_CACHE = 64


class GatewayRouter:
    """Orders candidates per request and tracks requests in flight and breakers per node."""

    def __init__(
        self,
        source: NodeSource,
        *,
        policy: Policy = "least_outstanding",
        failure_threshold: int = 3,
        open_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; use one of {', '.join(POLICIES)}")
        self.source = source
        self.policy: Policy = policy
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self._clock = clock
        self._outstanding: dict[str, int] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        self._turn = 0
        self._rings: OrderedDict[tuple[str, ...], HashRing] = OrderedDict()

    # -- per-node state -------------------------------------------------------------------

    def breaker(self, node_id: str) -> CircuitBreaker:
        """The breaker of ``node_id`` (created closed on first use)."""
        b = self._breakers.get(node_id)
        if b is None:
            b = self._breakers[node_id] = CircuitBreaker(self.failure_threshold, self.open_s, self._clock)
        return b

    def outstanding(self, node_id: str) -> int:
        """Requests in flight to ``node_id`` through this router."""
        return self._outstanding.get(node_id, 0)

    def acquire(self, node_id: str) -> None:
        """A request to ``node_id`` starts."""
        self._outstanding[node_id] = self._outstanding.get(node_id, 0) + 1

    def release(self, node_id: str) -> None:
        """A request to ``node_id`` ended (whatever its outcome)."""
        n = self._outstanding.get(node_id, 0) - 1
        if n > 0:
            self._outstanding[node_id] = n
        else:
            self._outstanding.pop(node_id, None)

    # -- ordering -------------------------------------------------------------------------

    def order(self, model: str, version: str | None, key: str | None = None) -> list[Candidate]:
        """The candidates to try for one request, best first; nodes with an open breaker
        are left out (a half-open one stays in while its trial slot is free). Empty when
        no node can serve."""
        by_id: dict[str, Candidate] = {}
        for c in self.source.candidates(model, version):
            by_id.setdefault(c.node_id, c)
        usable = [by_id[i] for i in sorted(by_id) if self.breaker(i).available()]
        if not usable:
            return []
        n = len(usable)
        self._turn += 1
        turn = self._turn % n
        ranked = sorted(range(n), key=lambda i: (self.outstanding(usable[i].node_id), (i - turn) % n))
        ordered = [usable[i] for i in ranked]
        if key is None and self.policy == "affinity":
            key = model if version is None else f"{model}:{version}"
        if key is None or n == 1:
            return ordered
        owner = self._ring(tuple(c.node_id for c in usable)).get_node(key)
        first = next(c for c in ordered if c.node_id == owner)
        return [first, *(c for c in ordered if c is not first)]

    def owner(self, model: str, version: str | None, key: str) -> str | None:
        """The node id that ``key`` hashes to among the usable candidates now (None: none)."""
        ids = tuple(sorted({c.node_id for c in self.source.candidates(model, version)}))
        usable = tuple(i for i in ids if self.breaker(i).available())
        return str(self._ring(usable).get_node(key)) if usable else None

    def _ring(self, node_ids: tuple[str, ...]) -> HashRing:
        ring = self._rings.get(node_ids)
        if ring is None:
            ring = self._rings[node_ids] = HashRing(nodes=list(node_ids))
            if len(self._rings) > _RING_CACHE:
                self._rings.popitem(last=False)
        else:
            self._rings.move_to_end(node_ids)
        return ring

    def snapshot(self) -> dict[str, Any]:
        """Per-node outstanding counts and breaker states, for the status endpoint."""
        ids = sorted(set(self._breakers) | set(self._outstanding))
        return {
            "policy": self.policy,
            "nodes": [
                {"node_id": i, "outstanding": self.outstanding(i), "breaker": self.breaker(i).snapshot()} for i in ids
            ],
        }
