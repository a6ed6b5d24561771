"""The package's layers: no import circle, and the lower layers import nothing from above.

Every ``import`` / ``from ... import`` of a masc_engine module is an edge, wherever it stands
(module level or inside a function: a lazy import is still a dependency). Read from the source
with ``ast``, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "masc_engine"

#: Layers from the bottom; a module may import its own layer and those below it. ``core`` is the
#: package's shared leaves (errors, tolerances, extras: the optional-dependency hints);
#: ``metrics`` the pure statistics (on core alone, so every layer above may use them: the export
#: layer's reduced-precision gates do); ``api`` the package's __init__ (the MaSC drop-in, on the
#: runtime); ``export`` validates its graphs against the runtime's preprocessing and heads.
LAYERS = ("core", "metrics", "engine", "runtime", "api", "export", "jobs", "report", "serve", "cli")
LOW = ("metrics", "engine", "runtime", "export")
HIGH = ("jobs", "report", "serve", "cli")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph() -> dict[str, set[str]]:
    """``{module: {masc_engine modules it imports}}`` (a ``from pkg import name`` counts as an
    import of ``pkg.name`` when that is a module, else of ``pkg``)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for n in names:
                while n and n not in mods:
                    n = n.rpartition(".")[0]
                if n.startswith("masc_engine") and n != mod:
                    deps.add(n)
        graph[mod] = deps
    return graph


def layer_of(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1:
        return "api"
    if parts[1] in ("errors", "tolerances", "extras"):
        return "core"
    return parts[1]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph, WHITE)
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = GREY
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if color.get(m, BLACK) == GREY:
                return stack[stack.index(m) :] + [m]
            if color.get(m) == WHITE:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if color[n] == WHITE:
            found = visit(n)
            if found:
                return found
    return None


def test_graph_sees_known_edges():
    """The walker itself works: it finds edges we know exist (relative, absolute, lazy)."""
    g = import_graph()
    assert "masc_engine.runtime.scorer" in g["masc_engine"]
    assert "masc_engine.jobs.tables" in g["masc_engine.jobs.pairs.columns"]
    assert "masc_engine.export.int8" in g["masc_engine.jobs.int8_gate"]
    assert "masc_engine.jobs.pairs" in g["masc_engine.cli.run_cmd"]  # a lazy import inside main()
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle():
    cyc = _cycle(import_graph())
    assert cyc is None, "import circle: " + " -> ".join(cyc)


@pytest.mark.parametrize("low", LOW)
def test_lower_layers_import_nothing_from_above(low):
    bad = sorted(
        (m, d) for m, deps in import_graph().items() if layer_of(m) == low for d in deps if layer_of(d) in HIGH
    )
    assert not bad, f"{low}/ imports from the layers above it: {bad}"


def test_every_dependency_points_down():
    order = {name: i for i, name in enumerate(LAYERS)}
    g = import_graph()
    assert {layer_of(m) for m in g} <= set(LAYERS), "a new top-level module: place it in LAYERS"
    bad = sorted((m, d) for m, deps in g.items() for d in deps if order[layer_of(d)] > order[layer_of(m)])
    assert not bad, f"imports pointing up: {bad}"


def test_metric_modules_are_pure():
    """metrics/ imports nothing of the package but the shared leaves, and does no file I/O."""
    g = import_graph()
    for m, deps in g.items():
        if layer_of(m) == "metrics":
            assert {layer_of(d) for d in deps} <= {"core", "metrics"}, (m, deps)
            src = _modules()[m].read_text(encoding="utf-8")
            assert "open(" not in src and "read_text" not in src and "write_text" not in src, m


#: The most statements a function of the package keeps (its decorators, and every statement of its
#: body at any depth, the docstring left out): a function a reader takes in at once; longer ones are
#: split into named parts. Counted in statements, not lines, so that the formatter's wrapping of a
#: long call does not change the count (the longest, fusion.canonicalize_attention, has 61).
MAX_FUNCTION_STATEMENTS = 65


def _statements(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    doc = int(
        bool(body)
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    return sum(isinstance(x, ast.stmt) for x in ast.walk(node)) - 1 - doc + len(node.decorator_list)


def test_no_function_is_longer_than_a_reader_takes_in_at_once():
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := _statements(node)) > MAX_FUNCTION_STATEMENTS:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({n} statements)")
    assert not long, long
