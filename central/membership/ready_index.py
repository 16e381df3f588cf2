"""Which nodes report which (model, version) ``ready``: an index kept as heartbeats arrive.

The index is a plain ``model → version → node ids`` dict; a node's own ``ready_keys`` is
the copy it is diffed against, so a heartbeat that changes nothing costs one comparison."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from central.membership.liveness import NodeLiveness
from central.membership.node_state import NO_KEYS, TrackedNode
from fleetwire.mqtt.fast import AnyHeartbeat

__all__ = ["ReadyIndex", "ready_ids", "ready_keys", "reindex"]

#: model → version → ids of nodes whose last heartbeat reports it ready (any state).
ReadyIndex = dict[str, dict[str, set[str]]]


def ready_keys(hb: AnyHeartbeat) -> frozenset[tuple[str, str]]:
    """The (model, version) pairs ``hb`` reports in state ``ready``."""
    models = hb.models
    return frozenset([(m.name, m.version) for m in models if m.state == "ready"]) if models else NO_KEYS


def reindex(index: ReadyIndex, node: TrackedNode, keys: frozenset[tuple[str, str]]) -> None:
    """Make ``index`` and ``node.ready_keys`` list ``node`` under exactly ``keys``."""
    node_id = node.node_id
    for name, version in node.ready_keys - keys:
        by_version = index[name]
        ids = by_version[version]
        ids.discard(node_id)
        if not ids:
            del by_version[version]
            if not by_version:
                del index[name]
    for name, version in keys - node.ready_keys:
        index.setdefault(name, {}).setdefault(version, set()).add(node_id)
    node.ready_keys = keys


def ready_ids(index: ReadyIndex, nodes: Mapping[str, TrackedNode], model: str, version: str | None) -> list[str]:
    """Ids of alive nodes with ``model`` ready (at ``version``; None = any), unsorted."""
    by_version = index.get(model)
    if not by_version:
        return []
    if version is not None:
        ids: Iterable[str] = by_version.get(version, ())
    elif len(by_version) == 1:
        ids = next(iter(by_version.values()))
    else:
        ids = set().union(*by_version.values())
    alive = NodeLiveness.ALIVE
    return [node_id for node_id in ids if nodes[node_id].state is alive]
