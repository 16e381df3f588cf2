"""Fail when modules of central, edge_node or fleetwire import each other in a cycle.

Two checks, both must find no cycle:

1. module-level imports: what runs when a module is first imported (``import`` and ``from ...
   import`` statements, also inside module-level ``try``/``if``/``with`` blocks). A cycle here
   can leave a module half-initialised.
2. all imports, function-local (lazy) ones too. Those cannot break an import, but a cycle
   through them is still two modules that need each other (the two cycles of issue 23,
   ``auth.tokens <-> auth.postgres_tokens`` and ``rollout.store <-> rollout.postgres_store``,
   went through lazy imports of the optional psycopg extra).

Never counted: imports under ``if TYPE_CHECKING:`` (they never run). A lazy cycle listed in
``KNOWN_LAZY_CYCLES`` (with why it is left) is reported but does not fail the check.

Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so an edge to a
module is also an edge to each package above it; a cycle through a package's ``__init__`` is
as real as any other.

Usage: ``python scripts/check_import_cycles.py [ROOT]``; prints each cycle and exits 1 if any."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("central", "edge_node", "fleetwire")

#: Cycles through function-local imports that are known and left, each by the lazy edge that
#: closes it -> why. Only a cycle that contains one of these edges is excused.
KNOWN_LAZY_CYCLES: dict[tuple[str, str], str] = {}


def module_name(root: Path, path: Path) -> str:
    """``central/storage/__init__.py`` -> ``central.storage``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt], lazy: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run at import time (see the module doc); with ``lazy`` also those
    in function bodies."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _imports(node.body, lazy)
            yield from _imports(node.orelse, lazy)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _imports(block, lazy)
        elif isinstance(node, ast.With | ast.For | ast.While | ast.ClassDef) or (
            lazy and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ):  # a class body runs at import time, a function body only when called
            yield from _imports(node.body, lazy)


def _targets(node: ast.Import | ast.ImportFrom, this: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``node`` imports (``from pkg import sub`` names the submodule)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    base = this if is_package else this.rpartition(".")[0]
    for _ in range(max(node.level - 1, 0)):
        base = base.rpartition(".")[0]
    module = node.module or ""
    if node.level:
        module = f"{base}.{module}" if module else base
    found = {module}
    found.update(f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in known)
    return found


def _with_parents(name: str, known: set[str]) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known


def import_graph(root: Path, *, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules its import runs first (``lazy``: or any of its functions runs)."""
    files = {module_name(root, p): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in _imports(tree.body, lazy):
            for target in _targets(node, name, path.name == "__init__.py", known):
                edges |= _with_parents(target, known)
        edges.discard(name)
        # A module's own packages are loaded before it: no edge from a submodule back up.
        graph[name] = {e for e in edges if not name.startswith(e + ".")}
    return graph


class _Tarjan:
    """Strongly connected components of a directed graph (Tarjan's algorithm)."""

    def __init__(self, graph: dict[str, set[str]]) -> None:
        self.graph = graph
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.found: list[list[str]] = []

    def visit(self, v: str) -> None:
        self.index[v] = self.low[v] = len(self.index)
        self.stack.append(v)
        self.on_stack.add(v)
        for w in sorted(self.graph.get(v, ())):
            if w not in self.index:
                self.visit(w)
                self.low[v] = min(self.low[v], self.low[w])
            elif w in self.on_stack:
                self.low[v] = min(self.low[v], self.index[w])
        if self.low[v] == self.index[v]:
            self._pop_component(v)

    def _pop_component(self, root: str) -> None:
        component = []
        while True:
            w = self.stack.pop()
            self.on_stack.discard(w)
            component.append(w)
            if w == root:
                break
        if len(component) > 1:
            self.found.append(sorted(component))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, each sorted."""
    sys.setrecursionlimit(10_000)
    tarjan = _Tarjan(graph)
    for v in sorted(graph):
        if v not in tarjan.index:
            tarjan.visit(v)
    return tarjan.found


def main(argv: list[str]) -> int:
    """Check module-level imports, then all imports (lazy ones too); 1 if either has a cycle."""
    args = [a for a in argv[1:] if not a.startswith("--")]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    status = 0
    for lazy, what in ((False, "module-level imports"), (True, "all imports, function-local ones too")):
        graph = import_graph(root, lazy=lazy)
        found = cycles(graph)
        for component in found:
            excuse = _known(component, graph) if lazy else None
            print(f"import cycle ({what}): " + " <-> ".join(component) + (f" [known: {excuse}]" if excuse else ""))
            status |= 0 if excuse else 1
        edges = sum(len(v) for v in graph.values())
        print(f"{what}: {len(graph)} modules, {edges} edges, {len(found)} cycles")
    return status


def _known(component: list[str], graph: dict[str, set[str]]) -> str | None:
    """Why ``component`` is left, when it is one of ``KNOWN_LAZY_CYCLES``."""
    members = set(component)
    for (source, target), why in KNOWN_LAZY_CYCLES.items():
        if source in members and target in members and target in graph.get(source, set()):
            return why
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv))
