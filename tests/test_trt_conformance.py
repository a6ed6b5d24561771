"""The fake TensorRT must not be kinder than the real one (issue 9, item 4).

The real TensorRT Python bindings cannot be imported here: ``tensorrt.so`` loads libnvinfer, which
PyPI does not serve and which needs a GPU driver. So we *read* them. The wheel
``tensorrt-cu13-bindings==11.4.0.106`` (about 1.3 MB) is downloaded once with ``pip download
--no-deps`` into ``.cache/trt-bindings/`` (git-ignored; CI reaches PyPI) and opened as a zip:

- ``tensorrt_bindings/tensorrt.so``: pybind11 registers every class, method, property and enum
  member under its Python name, a NUL-terminated string literal in the library's read-only data.
  The linker merges a literal into a longer one that ends with it (``name`` lives inside
  ``get_tensor_name``), so a name counts as present when some NUL-terminated string *ends* with
  it. The check is one-sided: a name found may belong to another class (an over-approximation),
  but a name that is not found is certainly not bound, which is what catches an API that
  TensorRT removed (the weak-typing builder flags of TensorRT 10 were used and faked until this
  check existed).
- ``tensorrt_bindings/__init__.py``: the Python-side names (``Logger.WARNING`` via
  ``ILogger.Severity``, ``nptype``, ``__version__``), read with ``ast``.

Asserted: every ``tensorrt`` attribute that engine/backends/tensorrt.py uses (module attributes
and the methods and properties it calls on TensorRT objects, found by scanning its source) exists
in the real bindings; every public name the fake (tests/fake_tensorrt.py) offers exists there too;
and the names TensorRT 11 removed are absent from the real bindings, from the fake and from src/.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import zipfile
from enum import Enum
from pathlib import Path

import pytest

import fake_tensorrt
from conftest import REPO

WHEEL_SPEC = "tensorrt-cu13-bindings==11.4.0.106"
CACHE = REPO / ".cache" / "trt-bindings"
#: Removed in TensorRT 11 (10.x-to-11.x migration guide); none may appear in the fake or src/.
REMOVED = ("OBEY_PRECISION_CONSTRAINTS", "platform_has_fast_fp16", "set_output_type", "FP16", "EXPLICIT_BATCH")


class RealBindings:
    def __init__(self, wheel: Path):
        with zipfile.ZipFile(wheel) as z:
            so = z.read("tensorrt_bindings/tensorrt.so")
            init = z.read("tensorrt_bindings/__init__.py").decode()
        self.strings = [c.decode("latin-1") for c in so.split(b"\0") if c]
        self._exact = set(self.strings)
        tree = ast.parse(init)
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        names.add(t.id)
                    elif isinstance(t, ast.Attribute):
                        names.add(t.attr)
        self.python_names = names
        m = re.search(r'__version__\s*=\s*"([^"]+)"', init)
        self.version = m.group(1) if m else None

    def has(self, name: str) -> bool:
        if name in self.python_names or name in self._exact:
            return True
        return any(s.endswith(name) for s in self.strings)


@pytest.fixture(scope="session")
def real() -> RealBindings:
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob("tensorrt_cu13_bindings-11.4.0.106-*.whl"))
    if not wheels:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64",
                              WHEEL_SPEC, "-d", str(CACHE)], capture_output=True, text=True, timeout=300)
        wheels = sorted(CACHE.glob("tensorrt_cu13_bindings-11.4.0.106-*.whl"))
        if not wheels:
            pytest.fail(f"could not download {WHEEL_SPEC} from PyPI into {CACHE} (the conformance check needs "
                        f"it once): {res.stderr.strip()[-500:]}")
    return RealBindings(wheels[0])


#: Receivers of TensorRT objects in engine/backends/tensorrt.py -> what they hold.
_RECEIVERS = r"(trt|self\._trt|builder|network|parser|config|profile|self\.context|ctx|self\.engine|self\._runtime|cache)"


def used_names() -> set[str]:
    """Attribute names engine/backends/tensorrt.py reads from the tensorrt module and its objects."""
    src = (REPO / "src" / "masc_engine" / "engine" / "backends" / "tensorrt.py").read_text()
    found = set()
    for m in re.finditer(_RECEIVERS + r"\.([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?", src):
        found.add(m.group(2))
        if m.group(1) in ("trt", "self._trt") and m.group(3) and m.group(2)[0].isupper():
            found.add(m.group(3))  # enum members and class attributes: trt.BuilderFlag.TF32
    found.update(re.findall(r'getattr\(trt, "(\w+)"', src))  # optional names, looked up by string
    found.update(re.findall(r'getattr\(getattr\(trt, "\w+", None\), "(\w+)"', src))
    # Python-side bookkeeping, not TensorRT (the file's own attributes and the Path object `cache`).
    return found - {"name", "graph_entry", "profile", "_dev", "_stream", "_lock", "_dtypes", "input_names",
                    "output_names", "precision", "_runtime", "_trt", "context", "engine", "parent", "mkdir",
                    "is_file", "read_bytes", "write_bytes", "with_suffix", "_run_once", "run_device", "backend"}


def fake_surface() -> set[str]:
    """Every public name the fake tensorrt module offers: module attributes, and the public members
    (methods, properties, enum members) of its classes and of the objects it hands out."""
    names = set(fake_tensorrt.MODULE_ATTRS)
    classes = [getattr(fake_tensorrt, n) for n in fake_tensorrt.MODULE_ATTRS if isinstance(getattr(fake_tensorrt, n), type)]
    classes += [getattr(fake_tensorrt, n) for n in fake_tensorrt.OBJECT_CLASSES]
    for cls in classes:
        if issubclass(cls, Enum):
            names.update(cls.__members__)
            continue
        names.update(k for k in vars(cls) if not k.startswith("_"))
    names.update(k for k in vars(fake_tensorrt.OnnxParser(None, None)) if not k.startswith("_") and k != "network")
    return names


def test_reading_method_finds_known_names_and_misses_removed_ones(real):
    assert real.version == "11.4.0.106"
    for name in ("Builder", "OnnxParser", "Runtime", "build_serialized_network", "execute_async_v3",
                 "set_tensor_address", "STRONGLY_TYPED", "TF32", "nptype", "Logger", "WARNING"):
        assert real.has(name), name
    for name in REMOVED:
        assert not real.has(name), f"{name} is in the real 11.4 bindings"


def test_every_tensorrt_name_the_project_uses_exists_in_the_real_bindings(real):
    used = used_names()
    assert {"create_network", "NetworkDefinitionCreationFlag", "STRONGLY_TYPED", "BuilderFlag", "TF32",
            "set_input_shape", "get_tensor_shape", "execute_async_v3", "nptype", "deserialize_cuda_engine"} <= used
    missing = sorted(n for n in used if not real.has(n))
    assert not missing, f"engine/backends/tensorrt.py uses names the TensorRT 11.4 bindings lack: {missing}"


def test_the_fake_offers_nothing_the_real_bindings_lack(real):
    surface = fake_surface()
    assert {"Builder", "TF32", "STRONGLY_TYPED", "set_timing_cache", "get_tensor_shape", "num_errors"} <= surface
    extra = sorted(n for n in surface if not real.has(n))
    assert not extra, f"tests/fake_tensorrt.py offers names the real TensorRT 11.4 bindings lack: {extra}"
    assert not set(REMOVED) & surface


def test_no_removed_tensorrt_api_in_src():
    pattern = re.compile(r"BuilderFlag\.(FP16|BF16|OBEY_PRECISION_CONSTRAINTS)|platform_has_fast_fp16|set_output_type"
                         r"|layer\.precision|OBEY_PRECISION_CONSTRAINTS")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "src").rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits
