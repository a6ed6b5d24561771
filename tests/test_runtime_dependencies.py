"""What a module imports at load time is installed with it: the runtime layers (everything but
``export/``, which needs the export extra, and ``serve/``, which needs the serve extra) import at
module level only the packages ``pip install .`` brings, so ``masc-run`` works from a plain install
(the demo's environment). Read with ``ast``: nothing is imported to check it."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "masc_engine"
#: Distribution name -> the top-level module it installs, where they differ.
MODULE_OF = {"pillow": "PIL"}
#: Layers that load with an extra: their modules may import its packages at module level.
EXTRA_LAYERS = ("export", "serve")


def _runtime_modules() -> set[str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    return {MODULE_OF.get(n, n.replace("-", "_")) for n in names}


def _module_level_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"masc_engine", "__future__"}


def test_runtime_layers_import_only_runtime_dependencies_at_load():
    allowed = _runtime_modules()
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] in EXTRA_LAYERS:
            continue
        for mod in sorted(_module_level_imports(path) - allowed):
            bad.append(f"{rel}: {mod} (not in pyproject's [project] dependencies; import it where it is used)")
    assert not bad, bad


def test_the_check_sees_a_module_level_import():
    assert "cachetools" in _module_level_imports(PKG / "jobs" / "mask_source.py")
    assert "cachetools" in _runtime_modules() and "PIL" in _runtime_modules()
