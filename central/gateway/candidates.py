"""Where a model can be served: the gateway asks a ``NodeSource`` for the alive nodes
that report a model (version) ready, and routes among them.

``StaticNodeSource`` is a list set by hand (tests, fixed deployments); the live source
adapts the membership tracker (alive nodes and the models their heartbeats report)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fleetwire.manifest import Manifest

#: ``(model, version)`` → the stored manifest of that version (None: the model's newest) and
#: every stored version of the model, or None when the registry has no such model or version.
ModelCatalog = Callable[[str, str | None], Awaitable[tuple[Manifest, list[str]] | None]]


@dataclass(frozen=True)
class Candidate:
    """A node that can serve a request: its id and the ``host:port`` of its OIP HTTP API."""

    node_id: str
    http_address: str


@runtime_checkable
class NodeSource(Protocol):
    """The nodes that can serve a model now."""

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """Alive nodes reporting ``model`` ready (at ``version``; None: its default
        version), in any order. Called once per request, so it must be cheap and must
        not block. Duplicated node ids are ignored by the router."""
        ...


class StaticNodeSource:
    """A fixed list of nodes, each assumed to serve every model and version, optionally
    overridden per model name. Versions are not checked: a node that lacks one answers
    404, which the gateway passes through."""

    def __init__(self, nodes: Iterable[Candidate] = ()) -> None:
        self._nodes: list[Candidate] = list(nodes)
        self._by_model: dict[str, list[Candidate]] = {}

    def set(self, nodes: Iterable[Candidate]) -> None:
        """Replace the nodes that serve every model without an override."""
        self._nodes = list(nodes)

    def set_model(self, model: str, nodes: Iterable[Candidate] | None) -> None:
        """Serve ``model`` from ``nodes`` only (an empty list: from none); None drops the override."""
        if nodes is None:
            self._by_model.pop(model, None)
        else:
            self._by_model[model] = list(nodes)

    def candidates(self, model: str, version: str | None) -> list[Candidate]:
        """The override for ``model`` if there is one, else every node."""
        return list(self._by_model.get(model, self._nodes))
