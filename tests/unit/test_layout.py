"""The shape of the code: every import points down the layers below, no module imports
itself back through others, and the root of `app/` holds the foundation only.

Read from the source with `ast` (imports inside functions and under TYPE_CHECKING count:
an arrow is an arrow), so a wrong import fails here before anyone reads it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A module may import its own layer's modules and any lower layer's; a part
# is a package (`app.journal`) or a module at the root of `app/` (`app.lines`).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(layer.split())
    for layer in (
        "app.errors app.clock app.ids app.standard_webhooks app.threads app.payloads app.client",
        "app.config",
        "app.lines",
        "app.telemetry",
        "app.journal",
        "app.admission",
        "app.delivery",
        "app.schedules app.recovery",
        "app.observe",
        "app.wiring app.celery_app",
        "app.intake app.local",
        "app.cli app.bench",
        "workers beat",
    )
)
MAX_ROOT_MODULES = 10


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in ("app", "workers", "beat"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> Iterator[str]:
    """The modules of ours `path` imports (a `from a import b` names `a.b` when b is one)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        yield from (name for name in names if name in MODULES)


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "app" or len(parts) == 1 else ".".join(parts[:2])


def _layer(module: str) -> int:
    part = _part(module)
    for index, layer in enumerate(LAYERS):
        if part in layer:
            return index
    raise AssertionError(f"{module} ({part}) is in no layer: give it one in LAYERS")


GRAPH = {name: sorted(set(_imports(path)) - {name}) for name, path in MODULES.items()}


def test_every_part_has_a_layer() -> None:
    for module in MODULES:
        if module != "app":
            _layer(module)


def test_every_import_points_to_the_same_layer_or_below() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if module != "app"
        for target in targets
        if target != "app" and _layer(target) > _layer(module)
    ]
    assert upward == []


def test_no_module_imports_itself_back_through_others() -> None:
    cycles = _cycles(GRAPH)
    assert cycles == []


def test_the_root_of_app_holds_at_most_ten_modules() -> None:
    root = sorted(path.name for path in (ROOT / "app").glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above is only as good as this: a two-module loop and a three-module one."""
    graph = {"a": ["b"], "b": ["a"], "c": ["d"], "d": ["e"], "e": ["c"], "f": ["a"]}
    assert sorted(sorted(cycle) for cycle in _cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found
