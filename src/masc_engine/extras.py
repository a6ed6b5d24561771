"""Optional dependencies: the extra that provides a module, and the one-line error naming it.

The package lists of each extra are read from the installed distribution's metadata
(pyproject.toml ``[project.optional-dependencies]``), so the hint never drifts from the project.
masc-engine is not on PyPI: ``pip install 'masc-engine[x]'`` would fail, so the hint names the
packages themselves and the checkout form (``pip install -e '.[x]'``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from types import ModuleType

from .errors import MissingDependencyError

#: The extra (pyproject.toml) that provides each optional top-level module.
MODULE_EXTRA = {
    "pyarrow": "parquet",
    "spacy": "spacy",
    "scipy": "eval",
    "krippendorff": "eval",
    "sklearn": "eval",
    "matplotlib": "report",
    "ray": "ray",
    "torch": "export",
    "transformers": "export",
    "onnx": "export",
    "onnxscript": "export",
    "openvino": "openvino",
}


def extra_packages(extra: str) -> list[str]:
    """Requirement strings of ``extra`` (e.g. ``["pyarrow>=14"]``) from the installed metadata;
    empty when masc-engine's metadata is not available (a bare source tree on sys.path)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("masc-engine") or []
    except PackageNotFoundError:
        return []
    out = []
    for r in reqs:
        req, _, marker = r.partition(";")
        if re.search(r"""extra\s*==\s*["']""" + re.escape(extra) + r"""["']""", marker):
            out.append(req.strip().replace(" ", ""))
    return out


def install_hint(extra: str) -> str:
    """``pip install 'pyarrow>=14' (masc-engine's [parquet] extra; in a checkout: pip install -e '.[parquet]')``."""
    pkgs = extra_packages(extra)
    cmd = "pip install " + " ".join(shlex.quote(p) for p in pkgs) if pkgs else f"pip install -e '.[{extra}]'"
    return f"{cmd} (masc-engine's [{extra}] extra; in a checkout: pip install -e '.[{extra}]')"


def available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (cheap: no pyarrow load)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, purpose: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` or raise :class:`MissingDependencyError` in one line naming the fix.

    Args:
        module: dotted module name (``"pyarrow.parquet"``).
        purpose: what needs it, for the message (``"writing Parquet"``).
        extra: the extra providing it; default from :data:`MODULE_EXTRA` by top-level name.

    Raises:
        MissingDependencyError: the module (or one of its own dependencies) cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise missing(module, purpose, extra) from e


def check(module: str, purpose: str, extra: str | None = None) -> None:
    """Like :func:`require` but without importing (fail early, before a long run)."""
    if not available(module.split(".")[0]):
        raise missing(module, purpose, extra)


def missing(module: str, purpose: str, extra: str | None = None) -> MissingDependencyError:
    """The one-line error for a missing optional ``module`` (see :func:`require`)."""
    top = module.split(".")[0]
    extra = extra or MODULE_EXTRA.get(top, top)
    return MissingDependencyError(f"{purpose} needs {top}, which is not installed: {install_hint(extra)}")
