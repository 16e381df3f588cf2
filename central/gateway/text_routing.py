"""Which node a text request goes to: where its prompt's prefix is likely cached, unless that
node is far busier than the others (bounded load), or where its session is pinned.

Per request, over the nodes the router admits (breakers closed, in least-outstanding order):

1. a session key (OpenAI's ``user``, or the ``X-Session-Id`` / affinity header) pins the
   conversation to one node by consistent hashing (the router's uhashring ring);
2. else the node that was recently sent the longest run of the prompt's leading blocks
   (``central.gateway.prefix_index``); ties go to the least loaded;
3. else the least loaded node (ties taken in turn).

New conversations that share a long system prompt all match the node that served the
first of them; the load bound is what spreads them (each then sticks where its own turns
went, its own blocks being the longer match), so under light load they share one node,
which costs nothing while it keeps up.

A node's load is the larger of what its last heartbeat said (``ModelInfo.generation``:
running + waiting) and the requests this gateway has in flight to it: the heartbeat sees
every client, the gateway's count sees the last second (a sum would count the gateway's own
requests twice). The chosen node (1 or 2) keeps its place while its load is at most
``least + max(2, 25 % of least)``; beyond it the least loaded node goes first, so a popular
prefix spreads instead of queueing on one node — unless (2) waiting is cheaper than moving:
the ``excess`` requests over the bound, each taken to cost about the request's own prefill
there (its blocks the node lacks), cost fewer blocks than the prefix the least loaded node
lacks and would prefill again (``worth_waiting``). A burst of a conversations' next turns
then no longer moves a long conversation because its node's share of the burst arrived
first, while a node far behind still sheds requests whose prefix is cheap to rebuild."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from central.gateway.candidates import Candidate
from central.gateway.prefix_index import PrefixIndex
from central.gateway.router import GatewayRouter
from fleetwire.mqtt.fast import AnyHeartbeat

__all__ = ["GenerationLoads", "TextRouting", "load_bound", "worth_waiting"]

#: Extra requests over the least loaded node a preferred node may have and keep its place.
SLACK_REQUESTS = 2
#: ... or this share of the least loaded node's load, whichever is larger.
SLACK_SHARE = 0.25


def load_bound(least: int) -> float:
    """The most load a preferred node may have when the least loaded node has ``least``."""
    return least + max(SLACK_REQUESTS, SLACK_SHARE * least)


def worth_waiting(excess: float, blocks: int, matches: dict[str, int], preferred: Candidate, least: Candidate) -> bool:
    """Whether a request should stay on ``preferred`` although its load is ``excess`` over the
    bound: the requests it would wait behind there, each about as much prefill as its own
    (the blocks ``preferred`` lacks, plus the tail short of a block), cost less than the blocks
    of its prefix the least loaded node lacks and would prefill again."""
    own = blocks - matches[preferred.node_id] + 1
    recomputed = matches[preferred.node_id] - matches[least.node_id]
    return excess * own <= recomputed


class GenerationLoads:
    """Per node and language model: running + waiting sequences, as the last heartbeat said."""

    def __init__(self) -> None:
        self._load: dict[tuple[str, str], int] = {}
        self._models: dict[str, set[str]] = {}

    def harvest(self, node_id: str, hb: AnyHeartbeat) -> None:
        """Keep the generation counts of one heartbeat (the tracker calls it for each)."""
        served = set()
        for m in hb.models:
            if m.generation is not None and m.state == "ready":
                self._load[(node_id, m.name)] = m.generation.running + m.generation.waiting
                served.add(m.name)
        for name in self._models.get(node_id, set()) - served:
            self._load.pop((node_id, name), None)
        self._models[node_id] = served

    def load(self, node_id: str, model: str) -> int:
        """Running + waiting of ``model`` on ``node_id`` (0 when unknown)."""
        return self._load.get((node_id, model), 0)

    def language_models(self) -> set[str]:
        """Names of the language models some node reported ready."""
        return set().union(*self._models.values()) if self._models else set()


@dataclass(frozen=True)
class Choice:
    """The order to try nodes in, and why the first one leads (for counters and tests)."""

    order: list[Candidate]
    reason: str
    """``session``, ``prefix``, ``load`` (the preferred node was too busy) or ``least``."""


class TextRouting:
    """Orders nodes for a text request (see the module doc) and remembers what each was sent."""

    def __init__(
        self, router: GatewayRouter, loads: GenerationLoads, index: PrefixIndex | None = None, *, by_prefix: bool = True
    ) -> None:
        """``by_prefix=False`` (``gateway.text_routing = "least_outstanding"``) skips step 2:
        the prompt is not looked at, only sessions and load choose."""
        self.router = router
        self.loads = loads
        self.index = index or PrefixIndex()
        self.by_prefix = by_prefix

    def load(self, node_id: str, model: str) -> int:
        """What routing counts as the node's load for ``model``."""
        return max(self.loads.load(node_id, model), self.router.outstanding(node_id))

    def order(
        self, model: str, version: str | None, hashes: Sequence[bytes], session: str | None, exclude: set[str]
    ) -> Choice:
        """The usable nodes for one request (leaving out ``exclude``), best first."""
        usable = [c for c in self.router.order(model, version) if c.node_id not in exclude]
        if not usable:
            return Choice([], "least")
        loads = {c.node_id: self.load(c.node_id, model) for c in usable}
        by_load = sorted(usable, key=lambda c: loads[c.node_id])  # stable: the router's turn breaks ties
        bound = load_bound(loads[by_load[0].node_id])
        preferred, reason = None, "least"
        matches: dict[str, int] = {}
        if session is not None:
            owner = self.router.owner(model, version, session)
            preferred = next((c for c in usable if c.node_id == owner), None)
            reason = "session"
        elif hashes and self.by_prefix:
            matches = {c.node_id: self.index.match(c.node_id, hashes) for c in usable}
            best = max(by_load, key=lambda c: matches[c.node_id])  # ties: the least loaded
            if matches[best.node_id] > 0:
                preferred, reason = best, "prefix"
        if preferred is None:
            return Choice(by_load, "least")
        excess = loads[preferred.node_id] - bound
        if excess > 0 and not (matches and worth_waiting(excess, len(hashes), matches, preferred, by_load[0])):
            return Choice(by_load, "load")
        return Choice([preferred, *(c for c in by_load if c is not preferred)], reason)

    def sent(self, node_id: str, hashes: Sequence[bytes]) -> None:
        """A request with ``hashes`` went to ``node_id``."""
        self.index.record(node_id, hashes)
