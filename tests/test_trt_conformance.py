"""Every TensorRT call the library makes, and everything the fake offers, checked against the real
TensorRT 11.4 Python surface by class, arity and argument kind, with no network.

The surface (tests/data/tensorrt_11_surface.json: class -> methods with their pybind11
signatures, properties with getter/setter, enums with their members) was read once from the
``tensorrt-cu13-bindings==11.4.0.106`` wheel by scripts/extract_trt_surface.py; the test reads the
committed file.

The checker (:func:`check_sources`) parses the TensorRT backend's modules (engine/backends/tensorrt.py,
the runner; trt_build.py, the builder; trt_device.py, the lazy import and GPU facts) with ``ast`` and types their
TensorRT objects: ``import_tensorrt()``, a parameter named ``trt`` and ``self._trt`` are the module;
``trt.Builder(...)`` makes a ``Builder``; a method call returns what its signature says
(``builder.create_builder_config()`` is an ``IBuilderConfig``, ``engine.create_execution_context()``
an ``IExecutionContext``); assignments carry types to names and to ``self`` attributes; parameters
and functions annotated ``"trt.X"`` (in any of the modules) are ``X``. Then, on each typed object: a method exists on *that*
class and some overload accepts the call's positional count and keyword names; a property exists
and is readable (or writable, when assigned); an enum member exists on *that* enum; an ``int``
parameter gets an int (a literal, ``int(...)``, ``len(...)``, ``x.ptr``, ``dev.ptr(x)``, an index of
``range``), not an object such as a stream. :func:`test_the_checker_catches_each_wrong_call` applies
each known wrong call to a copy of the module holding the call and asserts the checker reports it.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from enum import Enum

import pytest

from doubles import fake_tensorrt
from support import REPO

SURFACE_FILE = REPO / "tests" / "data" / "tensorrt_11_surface.json"
#: The TensorRT backend's modules: the runner, the builder, the lazy import and GPU facts.
SOURCES = [
    REPO / "src" / "masc_engine" / "engine" / "backends" / f"{m}.py" for m in ("tensorrt", "trt_build", "trt_device")
]
#: Removed in TensorRT 11 (10.x-to-11.x migration guide); none may appear in src/.
REMOVED = ("OBEY_PRECISION_CONSTRAINTS", "platform_has_fast_fp16", "set_output_type", "EXPLICIT_BATCH")


# ------------------------------------------------------------------ the surface


class Sig:
    """One overload: ``(self, name: str, shape: Dims = ...) -> bool``."""

    def __init__(self, text: str):
        m = re.match(r"^\((.*)\) -> (.*)$", text)
        self.text, self.returns, self.params = text, m.group(2), []
        for part in _split_top(m.group(1)):
            if part == "self":
                continue
            name, _, rest = part.partition(": ")
            self.params.append((name, rest.removesuffix(" = ..."), rest.endswith(" = ...")))
        self.named = not all(re.fullmatch(r"arg\d+", p[0]) for p in self.params) or not self.params

    def accepts(self, n_pos: int, keywords: list[str]) -> bool:
        names = [p[0] for p in self.params]
        if n_pos > len(names):
            return False
        if keywords and self.named and (set(keywords) - set(names[n_pos:]) or len(set(keywords)) < len(keywords)):
            return False
        given = set(names[:n_pos]) | set(keywords)
        return all(name in given or default for name, _, default in self.params)


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()] if cur.strip() else parts


class Surface:
    def __init__(self, data: dict):
        self.data = data
        self.classes = data["classes"]
        self.enums = data["enums"]
        self.module = (
            set(self.classes) | set(self.enums) | set(data["module"]["attributes"]) | set(data["module"]["python"])
        )

    def methods(self, cls: str, name: str) -> list[Sig] | None:
        sigs = self.classes.get(cls, {}).get("methods", {}).get(name)
        return [Sig(s) for s in sigs] if sigs else None

    def prop(self, cls: str, name: str) -> dict | None:
        return self.classes.get(cls, {}).get("properties", {}).get(name)

    def python_member(self, cls: str, name: str) -> bool:
        return name in self.classes.get(cls, {}).get("python", []) or name in self.enums.get(cls, {}).get("python", [])


@pytest.fixture(scope="module")
def surface() -> Surface:
    return Surface(json.loads(SURFACE_FILE.read_text()))


# ------------------------------------------------------------------ the checker

MODULE = ("module",)


def _instance(name):
    return ("instance", name)


class Checker(ast.NodeVisitor):
    """Types TensorRT objects through a module's functions and reports calls the surface lacks."""

    def __init__(self, surface: Surface, trees: list[ast.Module]):
        self.s, self.findings, self.checked, self.trees = surface, [], set(), trees
        self.returns = {}  # our functions' "trt.X" return annotations (every module's: they import each other's)
        self.int_functions = set()  # our functions annotated -> int
        for node in [n for tree in trees for n in ast.walk(tree)]:
            if isinstance(node, ast.FunctionDef) and node.returns is not None:
                self.returns[node.name] = _annotation(node.returns)
                if isinstance(node.returns, ast.Name) and node.returns.id == "int":
                    self.int_functions.add(node.name)
        self.env: dict = {}
        self.self_attrs: dict = {}

    # -- types

    def type_of(self, e):
        if isinstance(e, ast.Name):
            return self.env.get(e.id)
        if isinstance(e, ast.Attribute):
            if isinstance(e.value, ast.Name) and e.value.id == "self" and e.attr in self.self_attrs:
                return self.self_attrs[e.attr]
            base = self.type_of(e.value)
            if base == MODULE:
                if e.attr in self.s.enums:
                    return ("enum", e.attr)
                if e.attr in self.s.classes:
                    return ("class", e.attr)
            if base and base[0] == "enum":
                return ("member", base[1])
            if base and base[0] == "instance":
                p = self.s.prop(base[1], e.attr)
                return _instance(p["type"]) if p and p["type"] in self.s.classes else None
            return None
        if isinstance(e, ast.Call):
            return self.call_type(e)
        return None

    def call_type(self, e: ast.Call):
        f = e.func
        if isinstance(f, ast.Name):
            if f.id == "import_tensorrt":
                return MODULE
            r = self.returns.get(f.id)
            return _instance(r[0]) if r and len(r) == 1 else None
        if isinstance(f, ast.Attribute):
            ft = self.type_of(f)
            if ft and ft[0] == "class":  # trt.Builder(...): a constructor
                return _instance(ft[1])
            base = self.type_of(f.value)
            if base and base[0] == "instance":
                sigs = self.s.methods(base[1], f.attr)
                ret = sigs[0].returns if sigs else None
                return _instance(ret) if ret in self.s.classes else ("int",) if ret == "int" else None
        return None

    def int_like(self, e) -> bool:
        if isinstance(e, ast.Constant):
            return isinstance(e.value, int) and not isinstance(e.value, bool)
        if isinstance(e, ast.BinOp):
            return self.int_like(e.left) and self.int_like(e.right)
        if (
            isinstance(e, ast.Call)
            and isinstance(e.func, ast.Name)
            and (e.func.id in ("int", "len", "sum", "max", "min") or e.func.id in self.int_functions)
        ):
            return True
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "ptr":
            return True  # a device's ptr(x): the address as an int
        if isinstance(e, ast.Attribute) and e.attr in ("ptr", "nbytes"):
            return True  # a CUDA stream's / pointer's handle
        return self.type_of(e) == ("int",)

    # -- assignments

    def assign(self, target, value_type):
        if value_type is None:
            return
        if isinstance(target, ast.Name):
            self.env[target.id] = value_type
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self.self_attrs[target.attr] = value_type

    def visit_Assign(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Constant) and node.value.value is None:
            return  # close(): dropping a reference does not change what the attribute holds
        for t in node.targets:
            if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
                for elt, cls in zip(t.elts, self.returns.get(node.value.func.id) or ()):
                    self.assign(elt, _instance(cls))
            else:
                self.assign(t, self.type_of(node.value))
                if isinstance(t, ast.Attribute):
                    self.check_store(t)

    def visit_comprehension(self, node):
        if isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range":
            self.assign(node.target, ("int",))
        self.generic_visit(node)

    def visit_FunctionDef(self, node):
        saved = dict(self.env)
        for a in node.args.args:
            if a.arg == "trt":
                self.env[a.arg] = MODULE
            elif a.annotation is not None and _annotation(a.annotation):
                self.env[a.arg] = _instance(_annotation(a.annotation)[0])
        # comprehensions bind their targets before the element is checked
        for comp in [n for n in ast.walk(node) if isinstance(n, ast.comprehension)]:
            self.visit_comprehension(comp)
        self.generic_visit(node)
        self.env = saved

    # -- checks

    def report(self, node, text):
        self.findings.append(f"line {node.lineno}: {text}")

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load):
            return
        base = self.type_of(node.value)
        if base == MODULE:
            self.checked.add(("tensorrt", node.attr))
            if node.attr not in self.s.module and node.attr != "__version__":
                self.report(node, f"tensorrt has no attribute {node.attr!r}")
        elif base and base[0] == "enum":
            self.checked.add((base[1], node.attr))
            if node.attr not in self.s.enums[base[1]]["members"]:
                self.report(
                    node,
                    f"{base[1]} has no member {node.attr!r} (members: {', '.join(self.s.enums[base[1]]['members'])})",
                )
        elif base and base[0] == "class":
            self.checked.add((base[1], node.attr))
            if not self.s.python_member(base[1], node.attr) and not self.s.methods(base[1], node.attr):
                self.report(node, f"class {base[1]} has no attribute {node.attr!r}")
        elif base and base[0] == "instance" and not self._is_call_func(node):
            cls = base[1]
            self.checked.add((cls, node.attr))
            p = self.s.prop(cls, node.attr)
            if p is None and not self.s.methods(cls, node.attr) and not self.s.python_member(cls, node.attr):
                self.report(node, f"{cls} has no attribute {node.attr!r}")
            elif p is not None and not p["get"]:
                self.report(node, f"{cls}.{node.attr} is a write-only property")

    def check_store(self, t: ast.Attribute):
        base = self.type_of(t.value)
        if base and base[0] == "instance":
            cls = base[1]
            self.checked.add((cls, t.attr))
            p = self.s.prop(cls, t.attr)
            if p is None:
                self.report(t, f"{cls} has no property {t.attr!r} to assign")
            elif not p["set"]:
                self.report(t, f"{cls}.{t.attr} is read-only")

    def _is_call_func(self, node) -> bool:
        return id(node) in self._call_funcs

    def visit_Call(self, node):
        self._call_funcs.add(id(node.func))
        self.generic_visit(node)
        f = node.func
        if (
            isinstance(f, ast.Name)
            and f.id == "getattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
        ):
            self._check_getattr(node)
            return
        if not isinstance(f, ast.Attribute):
            return
        ft, base = self.type_of(f), self.type_of(f.value)
        if ft and ft[0] == "class":
            self._check_call(node, ft[1], "__init__", self.s.methods(ft[1], "__init__"))
        elif base and base[0] == "instance":
            sigs = self.s.methods(base[1], f.attr)
            if sigs is None:
                kind = "a property, not a method" if self.s.prop(base[1], f.attr) else "no method"
                self.report(node, f"{base[1]} has {kind} {f.attr!r}")
                self.checked.add((base[1], f.attr))
                return
            self._check_call(node, base[1], f.attr, sigs)

    def _check_getattr(self, node):
        obj, name = node.args[0], node.args[1].value
        base = self.type_of(obj)
        if (
            isinstance(obj, ast.Call)
            and isinstance(obj.func, ast.Name)
            and obj.func.id == "getattr"
            and self.type_of(obj.args[0]) == MODULE
            and isinstance(obj.args[1], ast.Constant)
        ):
            enum = obj.args[1].value
            self.checked.add((enum, name))
            if name not in self.s.enums.get(enum, {}).get("members", []):
                self.report(node, f"{enum} has no member {name!r}")
        elif base == MODULE:
            self.checked.add(("tensorrt", name))
            if name not in self.s.module:
                self.report(node, f"tensorrt has no attribute {name!r}")

    def _check_call(self, node, cls, name, sigs):
        self.checked.add((cls, name))
        if not sigs:
            self.report(node, f"{cls}.{name} is not callable here")
            return
        n_pos, keywords = len(node.args), [k.arg for k in node.keywords if k.arg]
        fitting = [s for s in sigs if s.accepts(n_pos, keywords)]
        if not fitting:
            self.report(
                node,
                f"{cls}.{name} called with {n_pos} positional and keywords {keywords}; the "
                f"bindings have {' | '.join(s.text for s in sigs)}",
            )
            return
        for i, arg in enumerate(node.args):
            if all(s.params[i][1] == "int" for s in fitting) and not self.int_like(arg):
                self.report(
                    node,
                    f"argument {i + 1} of {cls}.{name} is `{ast.unparse(arg)}`, not an int "
                    f"({fitting[0].params[i][0]}: int)",
                )

    def run(self, tree):
        self._call_funcs = set()
        # self attributes first (assigned in __init__, read in other methods)
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            for fn in [n for n in cls.body if isinstance(n, ast.FunctionDef)]:
                probe = Checker(self.s, self.trees)
                probe._call_funcs, probe.self_attrs = set(), self.self_attrs
                probe.visit(fn)
        self.visit(tree)
        return self.findings


def _annotation(node) -> tuple[str, ...] | None:
    """``"trt.X"`` -> ``("X",)``; ``"tuple[trt.A, trt.B]"`` -> ``("A", "B")``; ``"trt.X | None"`` -> ``("X",)``."""
    text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
    if text is None:
        return None
    names = re.findall(r"\btrt\.(\w+)", text)
    if not names:
        return None
    return tuple(names) if text.startswith("tuple[") else (names[0],)


def check_sources(sources: dict[str, str], surface: Surface) -> tuple[list[str], set]:
    """``(findings, checked)`` over ``{name: source}``: each module checked with the return
    annotations of all of them known; each finding prefixed with its module's name."""
    trees = {name: ast.parse(src) for name, src in sources.items()}
    findings, checked = [], set()
    for name, tree in trees.items():
        checker = Checker(surface, list(trees.values()))
        findings += [f"{name} {f}" for f in checker.run(tree)]
        checked |= checker.checked
    return findings, checked


def _read_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in SOURCES}


# ------------------------------------------------------------------ tests: the library


def test_surface_file_is_the_pinned_bindings(surface):
    src = surface.data["source"]
    assert src["tensorrt_version"] == "11.4.0.106" and src["wheel"].startswith("tensorrt_cu13_bindings-11.4.0.106-")
    assert surface.methods("IExecutionContext", "execute_async_v3")[0].params == [("stream_handle", "int", False)]
    assert "USER_MANAGED" in surface.enums["ExecutionContextAllocationStrategy"]["members"]
    for flag in ("FP16", "BF16", "INT8", "FP8", "INT4", "OBEY_PRECISION_CONSTRAINTS"):
        assert flag not in surface.enums["BuilderFlag"]["members"]
    assert {"INT8", "FP8", "INT4"} <= set(surface.enums["DataType"]["members"])  # where those names live now
    assert (
        surface.prop("Builder", "max_batch_size") is None
        and surface.methods("IExecutionContext", "execute_async") is None
    )
    assert surface.prop("ICudaEngine", "num_bindings") is None


def test_every_tensorrt_call_of_the_library_exists_with_its_arity(surface):
    findings, checked = check_sources(_read_sources(), surface)
    assert not findings, "engine/backends/ TensorRT modules vs the TensorRT 11.4 bindings:\n" + "\n".join(findings)
    # the typing reaches every object the library uses (else the check would pass vacuously)
    expected = {
        ("tensorrt", "Builder"),
        ("Builder", "__init__"),
        ("Builder", "create_network"),
        ("Builder", "create_builder_config"),
        ("Builder", "create_optimization_profile"),
        ("Builder", "build_serialized_network"),
        ("OnnxParser", "__init__"),
        ("OnnxParser", "parse_from_file"),
        ("OnnxParser", "num_errors"),
        ("OnnxParser", "get_error"),
        ("ParserError", "desc"),
        ("IBuilderConfig", "set_memory_pool_limit"),
        ("IBuilderConfig", "clear_flag"),
        ("IBuilderConfig", "add_optimization_profile"),
        ("IBuilderConfig", "create_timing_cache"),
        ("IBuilderConfig", "set_timing_cache"),
        ("IBuilderConfig", "get_timing_cache"),
        ("ITimingCache", "serialize"),
        ("IOptimizationProfile", "set_shape"),
        ("INetworkDefinition", "num_layers"),
        ("Runtime", "deserialize_cuda_engine"),
        ("ICudaEngine", "create_execution_context"),
        ("ICudaEngine", "get_tensor_name"),
        ("ICudaEngine", "num_io_tensors"),
        ("ICudaEngine", "get_tensor_mode"),
        ("ICudaEngine", "get_tensor_dtype"),
        ("ICudaEngine", "get_device_memory_size_for_profile_v2"),
        ("ICudaEngine", "num_optimization_profiles"),
        ("IExecutionContext", "set_input_shape"),
        ("IExecutionContext", "get_tensor_shape"),
        ("IExecutionContext", "set_tensor_address"),
        ("IExecutionContext", "execute_async_v3"),
        ("IExecutionContext", "update_device_memory_size_for_shapes"),
        ("IExecutionContext", "set_device_memory"),
        ("BuilderFlag", "TF32"),
        ("MemoryPoolType", "WORKSPACE"),
        ("TensorIOMode", "INPUT"),
        ("ExecutionContextAllocationStrategy", "USER_MANAGED"),
        ("Logger", "WARNING"),
        ("NetworkDefinitionCreationFlag", "STRONGLY_TYPED"),
        ("tensorrt", "nptype"),
    }
    assert expected <= checked, sorted(expected - checked)


#: The wrong calls the checker must catch: (what, old text, new text, finding).
MUTATIONS = [
    (
        "a removed precision flag (a DataType name)",
        "trt.BuilderFlag.TF32",
        "trt.BuilderFlag.INT8",
        "BuilderFlag has no member 'INT8'",
    ),
    ("a removed precision flag", "trt.BuilderFlag.TF32", "trt.BuilderFlag.FP8", "BuilderFlag has no member 'FP8'"),
    ("a removed precision flag", "trt.BuilderFlag.TF32", "trt.BuilderFlag.INT4", "BuilderFlag has no member 'INT4'"),
    (
        "a removed builder property",
        "    builder = trt.Builder(trt_logger(trt))\n",
        "    builder = trt.Builder(trt_logger(trt))\n    builder.max_batch_size = 16\n",
        "Builder has no property 'max_batch_size'",
    ),
    (
        "a removed builder property, read",
        "    builder = trt.Builder(trt_logger(trt))\n",
        "    builder = trt.Builder(trt_logger(trt))\n    print(builder.max_batch_size)\n",
        "Builder has no attribute 'max_batch_size'",
    ),
    (
        "a method of a plugin class, not of the context",
        "ctx.execute_async_v3(stream.ptr)",
        "ctx.execute_async(stream.ptr)",
        "IExecutionContext has no method 'execute_async'",
    ),
    (
        "a removed engine property through another name",
        "        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]\n",
        "        eng = self.engine\n        bindings = eng.num_bindings\n"
        "        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]\n",
        "ICudaEngine has no attribute 'num_bindings'",
    ),
    (
        "a stream object for the stream handle",
        "ctx.execute_async_v3(stream.ptr)",
        "ctx.execute_async_v3(stream)",
        "argument 1 of IExecutionContext.execute_async_v3 is `stream`, not an int (stream_handle: int)",
    ),
    (
        "a stream attribute for the handle",
        "ctx.execute_async_v3(stream.ptr)",
        "ctx.execute_async_v3(self._stream)",
        "argument 1 of IExecutionContext.execute_async_v3 is `self._stream`, not an int",
    ),
    (
        "a missing argument",
        'profile.set_shape(name, s["min"], s["opt"], s["max"])',
        'profile.set_shape(name, s["min"], s["max"])',
        "IOptimizationProfile.set_shape called with 3 positional",
    ),
    (
        "a wrong keyword",
        "config.set_timing_cache(cache, ignore_mismatch=False)",
        "config.set_timing_cache(cache, ignore=False)",
        "IBuilderConfig.set_timing_cache called with 1 positional and keywords ['ignore']",
    ),
    (
        "a read-only property assigned",
        "    builder = trt.Builder(trt_logger(trt))\n",
        "    builder = trt.Builder(trt_logger(trt))\n    builder.num_DLA_cores = 2\n",
        "Builder.num_DLA_cores is read-only",
    ),
    (
        "a property called as a method",
        "int(ctx.update_device_memory_size_for_shapes())",
        "int(ctx.update_device_memory_size_for_shapes())\n        ctx.device_memory(0)",
        "IExecutionContext has a property, not a method 'device_memory'",
    ),
    (
        "an optional flag looked up by string",
        'getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)',
        'getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "EXPLICIT_BATCH", None)',
        "NetworkDefinitionCreationFlag has no member 'EXPLICIT_BATCH'",
    ),
]


@pytest.mark.parametrize("what,old,new,finding", MUTATIONS, ids=[f"{i}:{m[0]}" for i, m in enumerate(MUTATIONS)])
def test_the_checker_catches_each_wrong_call(surface, what, old, new, finding):
    sources = _read_sources()
    name = next((n for n, src in sources.items() if old in src), None)
    assert name is not None, f"mutation site missing: {old!r}"
    findings, _ = check_sources({**sources, name: sources[name].replace(old, new, 1)}, surface)
    assert any(finding in f for f in findings), f"{what}: not reported; findings: {findings}"


def test_no_removed_tensorrt_api_in_src():
    pattern = re.compile(
        r"BuilderFlag\.(FP16|BF16|INT8|FP8|INT4|OBEY_PRECISION_CONSTRAINTS)|platform_has_fast_fp16"
        r"|set_output_type|layer\.precision|OBEY_PRECISION_CONSTRAINTS|EXPLICIT_BATCH"
    )
    hits = [
        f"{p.relative_to(REPO)}:{i}"
        for p in (REPO / "src").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits


# ------------------------------------------------------------------ tests: the fake

#: Protocol methods the fake implements the Python way where the binding exposes a C-level slot.
FAKE_PROTOCOLS = {"__bytes__": "IHostMemory exposes the buffer protocol, which bytes() reads"}


def _fake_members(cls) -> dict:
    return {
        k: v
        for k, v in vars(cls).items()
        if (not k.startswith("_") or k in ("__init__", "__bool__", "__len__", "__getitem__", "__bytes__"))
    }


def _params(fn) -> list[tuple[str, bool]]:
    sig = inspect.signature(fn)
    return [(p.name, p.default is not inspect.Parameter.empty) for p in list(sig.parameters.values())[1:]]


def _compatible(fn, sigs: list[Sig]) -> bool:
    """The fake's parameters are those of one real overload: same names (where the surface has
    them), same count, the same parameters optional."""
    mine = _params(fn)
    for s in sigs:
        real = [(name, default) for name, _, default in s.params]
        if len(real) == len(mine) and all(
            d1 == d2 and (n1 == n2 or not s.named) for (n1, d1), (n2, d2) in zip(mine, real)
        ):
            return True
    return False


def test_the_fake_offers_only_what_the_real_bindings_have(surface):
    problems = []
    classes = {n: n for n in fake_tensorrt.MODULE_ATTRS if isinstance(getattr(fake_tensorrt, n), type)}
    classes.update(fake_tensorrt.OBJECT_CLASSES)
    for name in fake_tensorrt.MODULE_ATTRS:
        if name not in surface.module:
            problems.append(f"module attribute {name}")
    for fake_name, real in classes.items():
        cls = getattr(fake_tensorrt, fake_name)
        if issubclass(cls, Enum):
            extra = set(cls.__members__) - set(surface.enums[real]["members"])
            problems += [f"{real}.{m}" for m in sorted(extra)]
            continue
        for attr, value in _fake_members(cls).items():
            if attr in FAKE_PROTOCOLS or (attr == "__init__" and fake_name in fake_tensorrt.OBJECT_CLASSES):
                continue  # objects TensorRT hands out are made by the fake's factories, as by the real ones
            where = f"{fake_name} ({real}).{attr}"
            if isinstance(value, property):
                p = surface.prop(real, attr)
                if p is None or not p["get"] or (value.fset is not None and not p["set"]):
                    problems.append(f"{where}: no such property (or not readable/writable) in the bindings")
            elif callable(value):
                sigs = surface.methods(real, attr)
                if sigs is None:
                    problems.append(f"{where}: no such method in the bindings")
                elif not _compatible(value, sigs):
                    problems.append(f"{where}{inspect.signature(value)} matches no overload: {[s.text for s in sigs]}")
            elif not surface.python_member(real, attr):
                problems.append(f"{where}: no such class attribute in the bindings")
    assert not problems, "tests/doubles/fake_tensorrt.py vs the TensorRT 11.4 bindings:\n" + "\n".join(problems)


def test_the_fake_checker_sees_wrong_fakes(surface, monkeypatch):
    """The fake check fails for a fake method the bindings lack and for a wrong arity."""
    monkeypatch.setattr(fake_tensorrt._Context, "execute_async", lambda self, stream_handle: True, raising=False)
    with pytest.raises(AssertionError, match=r"_Context \(IExecutionContext\).execute_async: no such method"):
        test_the_fake_offers_only_what_the_real_bindings_have(surface)
    monkeypatch.delattr(fake_tensorrt._Context, "execute_async")
    monkeypatch.setattr(fake_tensorrt._Context, "execute_async_v3", lambda self, stream: True)
    with pytest.raises(AssertionError, match=r"execute_async_v3\(self, stream\) matches no overload"):
        test_the_fake_offers_only_what_the_real_bindings_have(surface)


def test_the_fake_device_has_the_device_interface():
    """tests/doubles/fake_tensorrt.py ``NumpyDevice`` offers every engine/device.py ``ArrayDevice`` method
    with the same parameters (so code written against the interface runs on the fake)."""
    from masc_engine.engine.device import ArrayDevice

    for name, fn in vars(ArrayDevice).items():
        if name.startswith("_") or not callable(fn):
            continue
        fake = getattr(fake_tensorrt.NumpyDevice, name, None)
        assert fake is not None, name
        assert [p for p, _ in _params(fake)] == [p for p, _ in _params(fn)], name


def test_the_fake_parser_imports_the_ops_read_from_onnx_tensorrt_sources():
    """The fake parser's op list is the one scripts/extract_onnx_trt_ops.py read from
    onnx-tensorrt's importer registrations (its own TRT_* ops and helpers left out)."""
    import importlib.util

    from doubles import fake_tensorrt

    spec = importlib.util.spec_from_file_location("extract_onnx_trt_ops", REPO / "scripts" / "extract_onnx_trt_ops.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    src = (
        "DEFINE_BUILTIN_OP_IMPORTER(MatMul)\n{}\nDEFINE_BUILTIN_OP_IMPORTER( QuantizeLinear )\n"
        "DEFINE_BUILTIN_OP_IMPORTER(TRT_FP8QuantizeLinear)\nDEFINE_BUILTIN_OP_IMPORTER(FallbackPluginImporter)\n"
    )
    assert script.importer_ops(src) == ["MatMul", "QuantizeLinear"]
    data = json.loads((REPO / "tests" / "data" / "onnx_tensorrt_ops.json").read_text())
    assert len(data["commit"]) == 40 and data["ref"]
    assert fake_tensorrt.SUPPORTED_OPS == frozenset(data["ops"]) and len(data["ops"]) == 150
    assert {"LayerNormalization", "QuantizeLinear", "DequantizeLinear", "MatMul"} <= fake_tensorrt.SUPPORTED_OPS
