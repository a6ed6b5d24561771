"""One docstring dialect in src/: Google style, typed where the signature is not.

An ``Args:`` entry names a parameter of its function (or of the class's ``__init__``, or a field of
a dataclass); it carries ``(type)`` exactly when that parameter has no annotation, so a type is
written once, in the signature when there is one. An ast scan, no import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "masc_engine"
SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters):\s*$")
ENTRY = re.compile(r"^(?P<names>\*{0,2}\w+(?:, \*{0,2}\w+)*)(?: \((?P<type>(?:[^()]|\([^()]*\))*)\))?:(?:\s|$)")


def _params(node) -> dict[str, bool]:
    """``{name: annotated}`` for a function's parameters (self and cls left out)."""
    a = node.args
    out = {p.arg: p.annotation is not None for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    for p in (a.vararg, a.kwarg):
        if p is not None:
            out[p.arg] = p.annotation is not None
    out.pop("self", None)
    out.pop("cls", None)
    return out


def _class_params(node: ast.ClassDef) -> dict[str, bool]:
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        return _params(init)
    return {n.target.id: True for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _args_entries(doc: str) -> list[tuple[int, str, str | None]]:
    """``(line offset, names, type or None)`` of every entry of the docstring's Args sections."""
    lines = doc.expandtabs().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = SECTION.match(lines[i])
        i += 1
        if not m:
            continue
        base, entry_indent = len(m.group(1)), None
        while i < len(lines):
            line = lines[i]
            if line.strip():
                indent = len(line) - len(line.lstrip())
                if indent <= base:
                    break
                if entry_indent is None:
                    entry_indent = indent
                if indent == entry_indent:
                    e = ENTRY.match(line.strip())
                    out.append((i, e["names"] if e else line.strip(), e["type"] if e else "?malformed"))
            i += 1
    return out


def _problems() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = _params(node)
            elif isinstance(node, ast.ClassDef):
                params = _class_params(node)
            else:
                continue
            doc = ast.get_docstring(node, clean=True)
            if not doc:
                continue
            where = f"{path.relative_to(SRC.parent)}:{node.lineno} {node.name}"
            for _, names, typ in _args_entries(doc):
                if typ == "?malformed":
                    found.append(f"{where}: Args entry not 'name: text' or 'name (type): text': {names[:60]!r}")
                    continue
                for name in (n.lstrip("*") for n in names.split(", ")):
                    if name not in params:
                        found.append(
                            f"{where}: Args names {name!r}, which is not a parameter "
                            f"(parameters: {', '.join(params) or 'none'})"
                        )
                    elif params[name] and typ is not None:
                        found.append(f"{where}: {name} is annotated in the signature: drop '({typ})'")
                    elif not params[name] and typ is None:
                        found.append(f"{where}: {name} has no annotation: write its type, '{name} (type): ...'")
    return found


def test_args_entries_name_parameters_and_are_typed_exactly_where_the_signature_is_not():
    problems = _problems()
    assert not problems, f"{len(problems)} docstring entries off the dialect:\n" + "\n".join(problems)


def test_the_scan_reads_google_args_blocks():
    doc = (
        "Summary.\n\nArgs:\n    path: where.\n    n (int): how many,\n        on two lines.\n"
        "    *rest: more.\n\nReturns:\n    x (not an arg): the result.\n"
    )
    assert _args_entries(doc) == [(3, "path", None), (4, "n", "int"), (6, "*rest", None)]
    fn = ast.parse("def f(path: str, n, *rest: int): pass").body[0]
    assert _params(fn) == {"path": True, "n": False, "rest": True}


def test_no_other_dialect():
    """No numpydoc section underlines and no Sphinx field lists in src/'s docstrings."""
    other = re.compile(
        r"^\s*(Parameters|Returns|Raises|Yields)\s*\n\s*-{3,}\s*$|^\s*:(param|type|returns?|raises|rtype)\b", re.M
    )
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
                doc = ast.get_docstring(node, clean=True) or ""
                if other.search(doc):
                    found.append(f"{path.relative_to(SRC.parent)}:{getattr(node, 'lineno', 1)}")
    assert not found, found
