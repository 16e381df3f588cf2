"""Prefix-aware routing of text requests: the chained block hashes, the per-node LRU index,
and the policy (session pin, longest prefix, bounded load, least loaded)."""

from __future__ import annotations

from collections import Counter

from central.gateway.candidates import Candidate, StaticNodeSource
from central.gateway.prefix_index import BLOCK_BYTES, PrefixIndex, block_hashes, prompt_bytes
from central.gateway.router import GatewayRouter
from central.gateway.text_routing import GenerationLoads, TextRouting, load_bound, worth_waiting
from fleetwire.mqtt.payloads import GenerationInfo, Heartbeat, ModelInfo

NODES = [Candidate(f"n{i}", f"127.0.0.1:{9000 + i}") for i in range(3)]
MODEL = "chat"


def _routing(loads: GenerationLoads | None = None, blocks_per_node: int = 1024) -> TextRouting:
    return TextRouting(GatewayRouter(StaticNodeSource(NODES)), loads or GenerationLoads(), PrefixIndex(blocks_per_node))


def _heartbeat(node: str, running: int, waiting: int = 0) -> Heartbeat:
    generation = GenerationInfo(running=running, waiting=waiting)
    model = ModelInfo(name=MODEL, version="1", state="ready", generation=generation)
    return Heartbeat(node_id=node, bdseq=0, seq=1, ts=0, interval_s=1.0, models=[model])


def _chat(*turns: str) -> list[bytes]:
    messages = [{"role": "system", "content": "Be brief."}] + [{"role": "user", "content": t} for t in turns]
    return block_hashes(prompt_bytes({"messages": messages}, chat=True))


def test_hashes_chain_whole_blocks_so_a_longer_conversation_extends_the_shorter() -> None:
    assert block_hashes(b"x" * (BLOCK_BYTES - 1)) == []
    one = block_hashes(b"a" * BLOCK_BYTES * 3)
    assert len(one) == 3 and len(set(one)) == 3  # same bytes, different positions: chained
    first, later = _chat("q" * 600), _chat("q" * 600, "r" * 600)
    assert later[: len(first)] == first and len(later) > len(first)
    assert _chat("p" * 600)[0] != first[0]
    # Key order and extra fields do not matter; the messages' role and content do.
    a = prompt_bytes({"messages": [{"role": "user", "content": "hi", "name": "x"}]}, chat=True)
    b = prompt_bytes({"messages": [{"content": "hi", "role": "user"}]}, chat=True)
    assert a == b
    assert prompt_bytes({"prompt": ["abc"]}, chat=False) == b"abc"
    assert prompt_bytes({"prompt": [1, 2, 3]}, chat=False) == b"[1,2,3]"


def test_the_index_matches_leading_blocks_and_forgets_the_least_recent() -> None:
    index = PrefixIndex(blocks_per_node=4)
    hashes = block_hashes(b"z" * BLOCK_BYTES * 3)
    index.record("n0", hashes)
    assert index.match("n0", hashes) == 3 and index.match("n1", hashes) == 0
    other = block_hashes(b"y" * BLOCK_BYTES * 2)
    index.record("n0", other)  # 5 blocks > 4: the oldest (hashes[0]) goes
    assert index.match("n0", other) == 2
    assert index.match("n0", hashes) == 0  # the chain's first block is gone: no prefix left
    index.forget("n0")
    assert index.snapshot() == {}


def test_a_prefix_sticks_to_the_node_it_was_sent_to() -> None:
    routing = _routing()
    first = _chat("q" * 600)
    choice = routing.order(MODEL, None, first, None, set())
    assert choice.reason == "least"
    home = choice.order[0].node_id
    routing.sent(home, first)
    for turn in range(2, 6):
        hashes = _chat(*["q" * 600] * turn)
        choice = routing.order(MODEL, None, hashes, None, set())
        assert (choice.order[0].node_id, choice.reason) == (home, "prefix")
        routing.sent(home, hashes)
    # The longest match wins: another node sent a shorter run of the same prefix loses.
    other = next(c.node_id for c in NODES if c.node_id != home)
    routing.sent(other, first)
    assert routing.order(MODEL, None, _chat(*["q" * 600] * 6), None, set()).order[0].node_id == home


def test_bounded_load_sends_a_matching_request_to_the_least_loaded_node() -> None:
    loads = GenerationLoads()
    routing = _routing(loads)
    hashes = _chat("q" * 600)
    routing.sent("n1", hashes)
    loads.harvest("n0", _heartbeat("n0", running=4))
    loads.harvest("n1", _heartbeat("n1", running=6))  # 4 + max(2, 1) = 6: still within the bound
    loads.harvest("n2", _heartbeat("n2", running=5))
    assert load_bound(4) == 6
    choice = routing.order(MODEL, None, hashes, None, set())
    assert (choice.order[0].node_id, choice.reason) == ("n1", "prefix")
    # 10 > 6: too busy; its 4 extra requests cost more than the 3 blocks of prefix it would lose
    loads.harvest("n1", _heartbeat("n1", running=5, waiting=5))
    choice = routing.order(MODEL, None, hashes, None, set())
    assert (choice.order[0].node_id, choice.reason) == ("n0", "load")
    assert [c.node_id for c in choice.order] == ["n0", "n2", "n1"]
    # The gateway's own requests in flight count when the heartbeat has not caught up.
    for _ in range(9):
        routing.router.acquire("n0")
    assert routing.order(MODEL, None, [], None, set()).order[0].node_id == "n2"


def test_a_long_conversation_waits_for_its_node_while_that_costs_less_than_moving() -> None:
    loads = GenerationLoads()
    routing = _routing(loads)
    history = _chat(*["q" * 600] * 8)  # about 20 blocks, all on n1
    routing.sent("n1", history)
    hashes = _chat(*["q" * 600] * 8, "r" * 600)  # its next turn: 2 or 3 more blocks
    own = len(hashes) - len(history) + 1
    assert worth_waiting(1, len(hashes), {"n0": 0, "n1": len(history)}, NODES[1], NODES[0])
    for node, running in (("n0", 0), ("n1", 2 + len(history) // own), ("n2", 1)):
        loads.harvest(node, _heartbeat(node, running=running))
    # over the bound of 2, but the requests ahead cost less prefill than its ~20 blocks elsewhere
    choice = routing.order(MODEL, None, hashes, None, set())
    assert (choice.order[0].node_id, choice.reason) == ("n1", "prefix")
    loads.harvest("n1", _heartbeat("n1", running=3 + len(history) // own))
    choice = routing.order(MODEL, None, hashes, None, set())
    assert (choice.order[0].node_id, choice.reason) == ("n0", "load")

    # a new conversation that shares a system prompt of 3 blocks, 2 over the bound: 2 requests of
    # its own 3 blocks' prefill ahead cost more than those 3 blocks elsewhere
    def chat(user: str) -> list[bytes]:
        messages = [{"role": "system", "content": "s" * 780}, {"role": "user", "content": user}]
        return block_hashes(prompt_bytes({"messages": messages}, chat=True))

    routing.sent("n2", chat("a" * 600))
    loads.harvest("n2", _heartbeat("n2", running=4))
    assert routing.order(MODEL, None, chat("b" * 600), None, set()).order[0].node_id == "n0"


def test_a_session_key_pins_a_conversation_and_sessions_spread() -> None:
    routing = _routing()
    owners = Counter(routing.order(MODEL, None, [], f"user-{i}", set()).order[0].node_id for i in range(300))
    assert set(owners) == {"n0", "n1", "n2"} and min(owners.values()) > 50
    pinned = routing.order(MODEL, None, _chat("x"), "alice", set())
    assert pinned.reason == "session"
    again = [routing.order(MODEL, None, _chat("x", "y" * t), "alice", set()).order[0] for t in range(5)]
    assert {c.node_id for c in again} == {pinned.order[0].node_id}
    # A node left out (it failed this request) is never offered.
    assert pinned.order[0] not in routing.order(MODEL, None, [], "alice", {pinned.order[0].node_id}).order


def test_without_prefix_or_session_equal_loads_take_turns() -> None:
    routing = _routing()
    firsts = Counter(routing.order(MODEL, None, [], None, set()).order[0].node_id for _ in range(30))
    assert firsts == {"n0": 10, "n1": 10, "n2": 10}


def test_least_outstanding_text_routing_ignores_the_prompt_but_keeps_sessions() -> None:
    routing = TextRouting(GatewayRouter(StaticNodeSource(NODES)), GenerationLoads(), by_prefix=False)
    hashes = _chat("q" * 600)
    routing.sent("n0", hashes)
    firsts = Counter()
    for _ in range(30):
        choice = routing.order(MODEL, None, hashes, None, set())
        assert choice.reason == "least"
        firsts[choice.order[0].node_id] += 1
    assert firsts == {"n0": 10, "n1": 10, "n2": 10}
    assert routing.order(MODEL, None, hashes, "alice", set()).reason == "session"


def test_heartbeats_give_the_load_and_the_served_language_models() -> None:
    loads = GenerationLoads()
    loads.harvest("n0", _heartbeat("n0", running=2, waiting=3))
    assert loads.load("n0", MODEL) == 5 and loads.language_models() == {MODEL}
    loads.harvest("n0", Heartbeat(node_id="n0", bdseq=0, seq=2, ts=0, interval_s=1.0, models=[]))
    assert loads.load("n0", MODEL) == 0 and loads.language_models() == set()
