"""The server's import structure: no circles among its modules, and a domain that stays a domain.

Every import counts, those under ``if TYPE_CHECKING:`` and those inside functions included: a
circle that only a deferred import hides is still a circle. ``from package import module`` is an
edge to that module (what Python loads), not to the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"

# What the request's life may not know about: the HTTP layer, the console and the webhooks.
DOMAIN = "signoff.app.requests"
NOT_FROM_DOMAIN = (
    "signoff.app.schemas",
    "signoff.app.webhooks",
    "signoff.app.routers",
    "signoff.app.console",
    "signoff.app.main",
)


def _name(path: Path) -> str:
    parts = ["signoff", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in APP.rglob("*.py")}


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            named = [m for m in submodules if m in MODULES]
            yield from named or [node.module]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        found = set()
        for imported in _imports(path):
            # `import signoff.app.x.y` loads y; a name inside a module is an edge to the module.
            while imported and imported not in MODULES:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                found.add(imported)
        graph[name] = found
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_server_has_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_the_scan_finds_a_circle_when_there_is_one() -> None:
    graph = _graph()
    graph[DOMAIN + ".kernel"].add("signoff.app.requests.gate")
    assert any(DOMAIN + ".kernel" in c for c in _circles(graph))


def test_the_request_wing_imports_neither_the_http_layer_the_console_nor_webhooks() -> None:
    graph = _graph()
    wrong = {
        (module, imported)
        for module, imports in graph.items()
        if module == DOMAIN or module.startswith(DOMAIN + ".")
        for imported in imports
        if any(imported == x or imported.startswith(x + ".") for x in NOT_FROM_DOMAIN)
    }
    assert wrong == set()
