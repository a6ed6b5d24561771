#!/usr/bin/env python
"""Extract the Python surface of TensorRT's bindings from the ``tensorrt-cu13-bindings`` wheel.

The bindings cannot be imported without libnvinfer and a GPU driver, so they are *read*: the
wheel's ``tensorrt_bindings/tensorrt.so`` is a pybind11 module with its symbol table, and its
registration functions (``tensorrt::bindCore``, ``bindOnnx``, ``bindGraph``,
``bindFoundationalTypes``, ``bindPlugin``) are followed instruction by instruction
(``objdump -d``; a small symbolic pass tracks string and symbol addresses through registers and
stack slots, and follows pybind11's out-of-line ``class_::def`` / ``enum_`` functions). What pybind11
is handed at run time is then read where it is handed over:

- a class or enum: ``generic_type::initialize(type_record)``: its Python name and C++ ``typeid``;
- a function: ``cpp_function::initialize_generic(record, signature, types, nargs)``: the
  signature text pybind11 compiled (``"({%}, {int}) -> bool"``) and the ``types`` array behind
  each ``%`` (relocated ``typeinfo`` pointers, mapped back to Python class names); the record's
  name and each ``py::arg`` / ``py::arg_v`` (an ``arg_v`` has a default);
- where it lands: ``add_class_method`` (a method), ``def_property_static_impl`` (a property:
  getter, and setter unless read-only), ``enum_base::value`` (an enum member), and
  ``m.attr("float32") = ...`` (a module attribute);
- ``tensorrt_bindings/__init__.py`` (read with ``ast``): the Python-side names (``nptype``,
  ``__version__``, ``Logger.WARNING`` copied from ``ILogger.Severity``, ``DataType.itemsize``).

The result (tests/data/tensorrt_11_surface.json) maps each class to its methods (every overload's
signature, as pybind11 renders it: ``(self, name: str, shape: Dims) -> bool``), its properties
(type, read-only or not) and, for enums, its members. tests/test_trt_conformance.py checks the
library's TensorRT calls and the fake TensorRT against it with no network.

Argument names come from the ``py::arg`` records; where fewer names than parameters were
recovered, the parameters are named ``arg0``, ``arg1``... (pybind11's own names for unnamed
arguments) and the method is listed under ``notes.names_unrecovered``. The extraction checks
itself against facts from TensorRT's documentation before writing (``SELF_CHECKS``).

Needs binutils (``objdump``, ``c++filt``) and, without ``--wheel``, ``pip download`` (network).

Usage (repo root)::

    python scripts/extract_trt_surface.py                 # downloads the pinned wheel (1.3 MB)
    python scripts/extract_trt_surface.py --wheel PATH.whl --out tests/data/tensorrt_11_surface.json
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEEL_SPEC = "tensorrt-cu13-bindings==11.4.0.106"
DEFAULT_OUT = REPO / "tests" / "data" / "tensorrt_11_surface.json"
BIND_FUNCTIONS = (
    "_ZN8tensorrt8bindCoreERN8pybind117module_E",
    "_ZN8tensorrt8bindOnnxERN8pybind117module_E",
    "_ZN8tensorrt9bindGraphERN8pybind117module_E",
    "_ZN8tensorrt21bindFoundationalTypesERN8pybind117module_E",
    "_ZN8tensorrt10bindPluginERN8pybind117module_E",
)
#: Facts from TensorRT's Python API documentation the extraction must reproduce.
SELF_CHECKS = {
    ("IExecutionContext", "execute_async_v3"): "(self, stream_handle: int) -> bool",
    ("IExecutionContext", "update_device_memory_size_for_shapes"): "(self) -> int",
    ("IExecutionContext", "set_device_memory"): "(self, memory: int, size: int) -> None",
    ("IOptimizationProfile", "set_shape"): "(self, input: str, min: Dims, opt: Dims, max: Dims) -> None",
    ("IBuilderConfig", "add_optimization_profile"): "(self, profile: IOptimizationProfile) -> int",
    ("ICudaEngine", "get_tensor_name"): "(self, index: int) -> str",
    ("Builder", "create_optimization_profile"): "(self) -> IOptimizationProfile",
}


# --------------------------------------------------------------------------- ELF


class Elf:
    """Sections, symbols and dynamic relocations of an x86-64 shared object."""

    def __init__(self, path: Path):
        self.path = str(path)
        d = self.data = Path(path).read_bytes()
        if d[:4] != b"\x7fELF" or d[4] != 2:
            raise SystemExit(f"{path}: not a 64-bit ELF file")
        shoff = struct.unpack_from("<Q", d, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
        secs = []
        for i in range(shnum):
            f = struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize)
            secs.append({"name": f[0], "addr": f[3], "off": f[4], "size": f[5], "link": f[6]})
        names_at = secs[shstrndx]["off"]
        for s in secs:
            s["n"] = self._cstr_at(names_at + s["name"])
        self.sections = {s["n"]: s for s in secs}
        self.funcs, self.by_name, self.objects = {}, {}, {}
        for name, kind, value, size in self._symbols(self.sections[".symtab"], secs):
            if kind == 2 and size:
                self.funcs.setdefault(value, (name, size))
                self.by_name.setdefault(name, value)
            elif kind == 1:
                self.objects.setdefault(value, name)
        dynsyms = [(n, v) for n, _, v, _ in self._symbols(self.sections[".dynsym"], secs)]
        self.relocs = {}
        rela = self.sections[".rela.dyn"]
        for i in range(rela["size"] // 24):
            off, info, addend = struct.unpack_from("<QQq", d, rela["off"] + i * 24)
            kind, sym = info & 0xFFFFFFFF, info >> 32
            if kind == 8:  # R_X86_64_RELATIVE
                self.relocs[off] = addend
            elif kind in (1, 6):  # R_X86_64_64, R_X86_64_GLOB_DAT
                name, value = dynsyms[sym]
                self.relocs[off] = value + addend if value else name

    def _cstr_at(self, off: int) -> str:
        return self.data[off : self.data.index(b"\0", off)].decode("latin-1")

    def _symbols(self, table, secs):
        strtab = secs[table["link"]]["off"]
        for i in range(table["size"] // 24):
            name, info, _, _, value, size = struct.unpack_from("<IBBHQQ", self.data, table["off"] + i * 24)
            yield self._cstr_at(strtab + name), info & 0xF, value, size

    def rodata_string(self, addr: int) -> str | None:
        s = self.sections[".rodata"]
        if s["addr"] <= addr < s["addr"] + s["size"]:
            return self._cstr_at(s["off"] + addr - s["addr"])
        return None

    def symbol_at(self, addr: int) -> str | None:
        return self.objects.get(addr) or (self.funcs.get(addr) or (None,))[0]


# --------------------------------------------------------------------------- symbolic pass

_REG64 = {}
for _full, _parts in [
    ("rax", "eax ax al"),
    ("rbx", "ebx bx bl"),
    ("rcx", "ecx cx cl"),
    ("rdx", "edx dx dl"),
    ("rsi", "esi si sil"),
    ("rdi", "edi di dil"),
    ("rbp", "ebp bpl"),
    ("rsp", "esp spl"),
] + [(f"r{i}", f"r{i}d r{i}w r{i}b") for i in range(8, 16)]:
    _REG64[_full] = _full
    for _p in _parts.split():
        _REG64[_p] = _full
CALLER_SAVED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11")
ARG_REGS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
MEM = re.compile(r"^(-?0x[0-9a-f]+)?\(%(\w+)\)$")
#: pybind11 out-of-line functions whose bodies are followed (their events appear at the call site).
FOLLOW = (
    "_ZN8pybind116class_",
    "_ZN8pybind115enum_",
    "_ZN8pybind1112cpp_functionC",
    "_ZN8pybind116module_",
    "_ZN8pybind116detail18process_attributes",
    "_ZN8pybind115arg_v",
    "_ZN8pybind116detail9enum_base",
)
#: pybind11 calls recorded as events, with their argument registers and the stack memory they point to.
EVENTS = (
    "initialize_generic",
    "12generic_type10initialize",
    "add_class_method",
    "def_property_static_impl",
    "process_attributeINS_3argEvE4init",
    "process_attributeINS_5arg_vEvE4init",
    "enum_base5value",
    "make_function_record",
    "accessor_policies8str_attrEEaS",
    "7setattrENS_6handle",
)


class Tracer:
    """A linear symbolic pass: registers and stack slots hold ``("str", text)``, ``("sym", name,
    addr)``, ``("stack", slot)`` or ``("imm", n)``; everything else is unknown. Branches are not
    followed (pybind11 registration code is straight-line apart from error paths)."""

    def __init__(self, elf: Elf):
        self.elf = elf
        self._frames = 0

    @functools.lru_cache(None)  # noqa: B019 - one Disassembler per run; the cache lives as long as it
    def disasm(self, addr: int) -> list[tuple]:
        name, size = self.elf.funcs[addr]
        out = subprocess.run(
            [
                "objdump",
                "-d",
                "--no-show-raw-insn",
                f"--start-address={addr}",
                f"--stop-address={addr + size}",
                self.elf.path,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        ins = []
        for line in out.splitlines():
            m = re.match(r"\s+([0-9a-f]+):\t(\S+)\s*([^#<]*)(?:#\s*([0-9a-f]+))?", line)
            if not m:
                continue
            target = int(m.group(4), 16) if m.group(4) else None
            if m.group(2).startswith(("call", "j")):
                t = re.match(r"([0-9a-f]+)\s*<", m.group(3).strip() + " <") if m.group(3) else None
                target = int(t.group(1), 16) if t and re.fullmatch(r"[0-9a-f]+", t.group(1)) else None
            ins.append((m.group(2), _split_operands(m.group(3).strip()), target))
        return ins

    def value_at(self, addr: int):
        s = self.elf.rodata_string(addr)
        return ("str", s, addr) if s is not None else ("sym", self.elf.symbol_at(addr) or hex(addr), addr)

    def run(
        self, addr: int, init: dict | None = None, depth: int = 0, events: list | None = None, slots: dict | None = None
    ) -> list:
        """Events of the function at ``addr``: ``("call", name, args, memory)``, ``("store",
        offset, value)`` (a string stored through an unknown pointer: a function record's name
        at 0, its doc at 8), ``("enter", name)`` / ``("leave", name)`` around followed functions."""
        self._frames += 1
        st = _State(self, self._frames, dict(init or {}), {} if slots is None else slots)
        events = [] if events is None else events
        lo, hi = addr, addr + self.elf.funcs[addr][1]
        for mn, ops, target in self.disasm(addr):
            if mn in ("call", "jmp") and target is not None:
                if not lo <= target < hi:
                    self._call(st, target, depth, events)
                continue
            st.step(mn, ops, target, events)
        return events

    def _call(self, st, target, depth, events):
        if target in self.elf.funcs:
            name = self.elf.funcs[target][0]
            args = {r: st.regs.get(r) for r in ARG_REGS}
            if any(p in name for p in EVENTS):
                events.append(("call", name, args, st.pointed(args)))
            elif name.startswith(FOLLOW) and depth < 5:
                events.append(("enter", name))
                self.run(target, {r: v for r, v in args.items() if v is not None}, depth + 1, events, st.slots)
                events.append(("leave", name))
        for r in CALLER_SAVED:
            st.regs.pop(r, None)


class _State:
    def __init__(self, tracer, frame, regs, slots):
        self.t, self.frame, self.regs, self.slots = tracer, frame, regs, slots

    def key(self, op):
        m = MEM.match(op)
        if not m:
            return None
        g = m.group(1) or "0"
        off = -int(g[1:], 16) if g.startswith("-") else int(g, 16)
        base = _REG64.get(m.group(2), m.group(2))
        v = self.regs.get(base)
        if v and v[0] == "stack":
            return (v[1][0], v[1][1], v[1][2] + off)
        if base in ("rbp", "rsp"):
            return (self.frame, base, off)
        return ("reg", base, off)

    def get(self, op):
        if op.startswith("%"):
            r = op[1:]
            return self.regs.get(r) if _REG64.get(r) == r else None
        k = self.key(op)
        return self.slots.get(k) if k else None

    def pointed(self, args):
        """For each argument that points to the stack, the values stored at offsets 0..0xf8."""
        mem = {}
        for r, v in args.items():
            if v and v[0] == "stack":
                f, b, off = v[1]
                mem[r] = {
                    k: self.slots[(f, b, off + k)]
                    for k in range(0, 0x100, 8)
                    if self.slots.get((f, b, off + k)) is not None
                }
        return mem

    def step(self, mn, o, target, events):
        regs = self.regs
        if mn == "lea" and len(o) == 2 and o[1].startswith("%"):
            dst = _REG64.get(o[1][1:], o[1][1:])
            if "(%rip)" in o[0] and target is not None:
                regs[dst] = self.t.value_at(target)
            else:
                k = self.key(o[0])
                if k and k[0] != "reg":
                    regs[dst] = ("stack", k)
                else:
                    regs.pop(dst, None)
        elif mn in ("mov", "movq") and len(o) == 2:
            self._mov(o[0], o[1], target, events)
        elif mn == "punpcklqdq" and len(o) == 2 and o[0].startswith("%xmm") and o[1].startswith("%xmm"):
            regs[o[1][1:]] = ((regs.get(o[1][1:]) or (None, None))[0], (regs.get(o[0][1:]) or (None, None))[0])
        elif mn == "movhps" and len(o) == 2 and o[1].startswith("%xmm"):
            regs[o[1][1:]] = ((regs.get(o[1][1:]) or (None, None))[0], self.get(o[0]))
        elif mn in ("movups", "movaps", "movdqa", "movdqu") and len(o) == 2:
            self._vector_move(o[0], o[1])
        elif o and o[-1].startswith("%") and mn not in ("test", "cmp", "cmpq", "cmpb", "testb", "push"):
            regs.pop(_REG64.get(o[-1][1:], o[-1][1:]), None)

    def _mov(self, src, dst, target, events):
        if src.startswith("$"):
            t = src[1:]
            val = (
                ("imm", int(t, 16))
                if re.fullmatch(r"0x[0-9a-f]+", t)
                else ("imm", int(t))
                if re.fullmatch(r"-?\d+", t)
                else None
            )
        elif "(%rip)" in src and target is not None:
            p = self.t.elf.relocs.get(target)
            val = self.t.value_at(p) if isinstance(p, int) else (("sym", p, None) if p else None)
        else:
            val = self.get(src)
        if dst.startswith("%"):
            r = _REG64.get(dst[1:], dst[1:])
            if r.startswith("xmm"):
                self.regs[r] = (val, None)
            elif val is None or (_REG64.get(dst[1:]) != dst[1:] and val[0] != "imm"):
                self.regs.pop(r, None)
            else:
                self.regs[r] = val
            return
        k = self.key(dst)
        if k:
            self.slots[k] = val
            if val and val[0] == "str" and k[0] == "reg":
                events.append(("store", k[2], val))

    def _vector_move(self, src, dst):
        if src.startswith("%xmm") and not dst.startswith("%"):
            k = self.key(dst)
            pair = self.regs.get(src[1:]) or (None, None)
            if k:
                self.slots[k] = pair[0]
                self.slots[(k[0], k[1], k[2] + 8)] = pair[1]
        elif dst.startswith("%xmm"):
            k = self.key(src) if not src.startswith("%") else None
            self.regs[dst[1:]] = (self.slots.get(k), self.slots.get((k[0], k[1], k[2] + 8))) if k else None


def _split_operands(ops: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in ops:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()] if cur.strip() else parts


# --------------------------------------------------------------------------- registrations


def _s(v):
    return v[1] if v and v[0] == "str" else None


def collect(tracer: Tracer) -> tuple[list, list, dict]:
    """Classes (``{py, typeinfo, kind, owner}``), bound functions and module attributes, in
    registration order, from every ``bind*`` function."""
    classes, bound, attrs = [], [], {}
    for fn in BIND_FUNCTIONS:
        stack, cur, pending, made = [], None, None, []
        for e in tracer.run(tracer.elf.by_name[fn]):
            if e[0] == "enter":
                stack.append(e[1])
            elif e[0] == "leave":
                stack.pop()
            elif e[0] == "store":
                if pending is not None and e[1] in (0, 8):
                    pending["name" if e[1] == 0 else "doc"] = e[2][1]
            else:
                cur, pending, made = _event(e, stack, cur, pending, made, classes, bound, attrs)
    return classes, bound, attrs


def _event(e, stack, cur, pending, made, classes, bound, attrs):
    _, name, args, mem = e
    if "generic_type10initialize" in name:
        rec = mem.get("rsi", {})
        ti = rec.get(16)
        owner = next(
            (
                s
                for s in reversed(stack)
                if s.startswith(("_ZN8pybind116class_", "_ZN8pybind115enum_")) and re.search(r"EEC[12]I", s)
            ),
            None,
        )
        cur = {
            "py": _s(rec.get(8)),
            "typeinfo": ti[1] if ti and ti[0] == "sym" else None,
            "owner": owner,
            "kind": "enum" if owner and owner.startswith("_ZN8pybind115enum_") else "class",
        }
        classes.append(cur)
    elif "make_function_record" in name:
        pending = {"args": [], "defaults": [], "name": None, "doc": None}
    elif "process_attributeINS_3argEvE4init" in name or "process_attributeINS_5arg_vEvE4init" in name:
        if pending is not None:
            pending["args"].append(_s(mem.get("rdi", {}).get(0)))
            pending["defaults"].append("arg_v" in name)
    elif "initialize_generic" in name:
        f = pending or {"args": [], "defaults": [], "name": None, "doc": None}
        t = args.get("rcx")
        f.update(sig=_s(args.get("rdx")), types=t[2] if t and t[0] in ("sym", "str") else None, cls=cur)
        made.append(f)
        pending = None
    elif "add_class_method" in name or "7setattrENS_6handle" in name:
        if made and _s(args.get("rsi")):
            bound.append({**made[-1], "bound": _s(args.get("rsi")), "how": "method"})
        made = []
    elif "def_property_static_impl" in name:
        if _s(args.get("rsi")):
            bound.extend({**f, "bound": _s(args.get("rsi")), "how": "property"} for f in made)
        made = []
    elif "enum_base5value" in name:
        enum = next((s for s in reversed(stack) if s.startswith("_ZN8pybind115enum_")), None)
        if _s(args.get("rsi")):
            bound.append({"how": "enum_value", "bound": _s(args.get("rsi")), "enum": enum, "cls": cur})
    elif "accessor_policies8str_attrEEaS" in name:
        acc = mem.get("rdi", {})
        key = next(
            (_s(acc.get(k)) for k in (16, 8) if _s(acc.get(k)) and _s(acc.get(k)) != "_pybind11_conduit_v1_"), None
        )
        m = re.search(r"EEaSI(.+?)EEvOT_", name)
        if key:
            attrs[key] = m.group(1) if m else None
    return cur, pending, made


# --------------------------------------------------------------------------- rendering


def demangle(names) -> dict[str, str]:
    names = sorted({n for n in names if n})
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
    return dict(zip(names, out.stdout.splitlines()))


def _cpp_of_typeinfo(dm: str) -> str:
    return dm.replace("typeinfo for ", "").replace("nvinfer1::v_1_0::", "nvinfer1::")


def _first_template_arg(dm: str, prefix: str) -> str | None:
    i = dm.find(prefix + "<")
    if i < 0:
        return None
    i += len(prefix) + 1
    depth, j = 0, i
    while j < len(dm):
        if dm[j] == "<":
            depth += 1
        elif dm[j] == ">":
            if depth == 0:
                break
            depth -= 1
        elif dm[j] == "," and depth == 0:
            break
        j += 1
    return dm[i:j].strip().replace("nvinfer1::v_1_0::", "nvinfer1::")


class Namer:
    """C++ types (typeinfo symbols) to Python class names."""

    def __init__(self, elf: Elf, classes: list):
        owners = [c["owner"] for c in classes] + [c["typeinfo"] for c in classes]
        self.dm = demangle(owners)
        self.py_of_cpp = {}
        for c in classes:
            cpp = None
            if c["typeinfo"]:
                cpp = _cpp_of_typeinfo(self.dm[c["typeinfo"]]).replace(" [clone .lto_priv.0]", "")
            elif c["owner"]:
                cpp = _first_template_arg(
                    self.dm[c["owner"]], "pybind11::class_" if c["kind"] == "class" else "pybind11::enum_"
                )
            c["cpp"] = cpp
            if c["py"] is None and cpp:
                c["py"] = re.split(r"::", cpp)[-1]
            if cpp:
                self.py_of_cpp.setdefault(cpp, c["py"])
        self.elf = elf
        self.classes = classes

    def types(self, addr: int | None, n: int) -> list[str | None]:
        out = []
        for i in range(n):
            p = self.elf.relocs.get(addr + 8 * i) if addr else None
            out.append(self.elf.symbol_at(p) if isinstance(p, int) else p)
        dm = demangle(out)
        return [
            self.py_of_cpp.get(_cpp_of_typeinfo(dm[t]).replace(" [clone .lto_priv.0]", ""), _cpp_of_typeinfo(dm[t]))
            if t
            else None
            for t in out
        ]


def _io_name(tok: str, output: bool) -> str:
    """pybind11 3's ``@input@output@`` type names: the input one for parameters, else output."""
    return re.sub(r"@([^@]*)@([^@]*)@", lambda m: m.group(2) if output else m.group(1), tok)


def parse_signature(sig: str, types: list) -> tuple[list[str], str]:
    """``"({%}, {str}) -> bool"`` and the types behind ``%`` -> (parameter types, return type)."""
    it = iter(types)

    def fill(tok, output):
        tok = _io_name(tok, output)
        return re.sub(r"%", lambda m: str(next(it, None) or "object"), tok)

    m = re.match(r"^\((.*)\) -> (.*)$", sig, re.S)
    body, toks, depth, cur = m.group(1), [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
            if depth == 1:
                cur = ""
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                toks.append(cur)
                continue
        if depth:
            cur += ch
    params = [_plain(fill(t, False)) for t in toks]
    return params, _plain(fill(m.group(2), True))


def _plain(t: str) -> str:
    t = t.replace("typing.SupportsInt", "int").replace("typing.SupportsFloat", "float")
    t = re.sub(r"collections\.abc\.(Sequence|Iterable)", r"\1", t)
    return t


def render(namer: Namer, bound: list, attrs: dict, init_py: str) -> dict:
    classes_out, enums_out, unrecovered = {}, {}, []
    for c in namer.classes:
        target = enums_out if c["kind"] == "enum" else classes_out
        target.setdefault(
            c["py"],
            {"cpp": c["cpp"], **({"members": []} if c["kind"] == "enum" else {"methods": {}, "properties": {}})},
        )
    dm_enum = demangle([f["enum"] for f in bound if f["how"] == "enum_value"])
    for f in bound:
        if f["how"] == "enum_value":
            cpp = _first_template_arg(dm_enum.get(f["enum"], ""), "pybind11::enum_")
            name = namer.py_of_cpp.get(cpp) or (f["cls"] or {}).get("py")
            if name in enums_out and f["bound"] not in enums_out[name]["members"]:
                enums_out[name]["members"].append(f["bound"])
            continue
        if not f.get("sig"):
            continue
        _render_function(namer, f, classes_out, enums_out, unrecovered)
    module = {
        "attributes": {
            k: namer.py_of_cpp.get(demangle([f"_ZTI{v}"]).get(f"_ZTI{v}", "").replace("typeinfo for ", ""), v)
            for k, v in sorted(attrs.items())
        }
    }
    python_side(init_py, module, classes_out, enums_out)
    return {
        "module": module,
        "classes": _sorted(classes_out),
        "enums": _sorted(enums_out),
        "notes": {"names_unrecovered": sorted(set(unrecovered))},
    }


def _render_function(namer, f, classes_out, enums_out, unrecovered):
    """One bound function into its class: a method overload or half of a property."""
    types = namer.types(f["types"], f["sig"].count("%"))
    params, ret = parse_signature(f["sig"], types)
    is_method = f["sig"].startswith("({%}") or f["bound"] == "__init__"
    owner = (f["cls"] or {}).get("py")
    if is_method and f["bound"] != "__init__" and types and types[0] in classes_out:
        owner = types[0]  # the self type (a class's methods may be added after another class's)
    entry = classes_out.get(owner)
    if entry is None or f["bound"] == "_pybind11_conduit_v1_":
        return  # enums keep their members only; the conduit is pybind11's cross-module hook
    rest = params[1:] if is_method else params
    if f["how"] == "property":
        prop = entry["properties"].setdefault(f["bound"], {"type": None, "get": False, "set": False})
        if rest:
            prop.update(type=prop["type"] or rest[0], set=True)
        else:
            prop.update(type=ret, get=True)
        return
    names, defaults = list(f["args"]), list(f["defaults"])
    if len(names) != len(rest) or any(a is None or not re.fullmatch(r"\w+", a) for a in names):
        if rest:
            unrecovered.append(f"{owner}.{f['bound']}")
        names, defaults = [f"arg{i}" for i in range(len(rest))], [False] * len(rest)
    parts = (["self"] if is_method else []) + [
        f"{a}: {t}" + (" = ..." if d else "") for a, t, d in zip(names, rest, defaults)
    ]
    sig = f"({', '.join(parts)}) -> {ret}"
    overloads = entry["methods"].setdefault(f["bound"], [])
    if sig not in overloads:
        overloads.append(sig)


def _sorted(d):
    return {k: d[k] for k in sorted(d)}


def python_side(init_py: str, module: dict, classes: dict, enums: dict) -> None:
    """Names ``tensorrt_bindings/__init__.py`` adds: module functions and constants, class
    attributes assigned there, and ``setattr(Logger, attr, value)`` over an enum's members."""
    tree = ast.parse(init_py)
    python = set()
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef)
            and not node.name.startswith("_")
            or isinstance(node, ast.FunctionDef)
            and node.name == "__version__"
        ):
            python.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and (not t.id.startswith("_") or t.id == "__version__"):
                    python.add(t.id)
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                    owner = classes.get(t.value.id) or enums.get(t.value.id)
                    if owner is not None and not t.attr.startswith("__"):
                        owner.setdefault("python", []).append(t.attr)
        elif isinstance(node, ast.For):
            _setattr_loop(node, classes, enums)
    module["python"] = sorted(python)


def _setattr_loop(node, classes, enums):
    """``for attr, value in ILogger.Severity.__members__.items(): setattr(Logger, attr, value)``."""
    src = ast.unparse(node.iter)
    m = re.match(r"(\w+)\.(\w+)\.__members__\.items\(\)", src)
    for stmt in node.body:
        call = getattr(stmt, "value", None)
        if m and isinstance(call, ast.Call) and getattr(call.func, "id", "") == "setattr":
            target = call.args[0].id
            members = enums.get(m.group(2), {}).get("members", [])
            if target in classes:
                classes[target].setdefault("python", []).extend(members)


# --------------------------------------------------------------------------- main


def fetch_wheel(dest: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_28_x86_64",
            WHEEL_SPEC,
            "-d",
            str(dest),
        ],
        check=True,
    )
    return sorted(dest.glob("tensorrt_cu13_bindings-*.whl"))[0]


def extract(wheel: Path) -> dict:
    for tool in ("objdump", "c++filt"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} (binutils) is needed to read tensorrt.so")
    with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as tmp:
        so = Path(tmp) / "tensorrt.so"
        so.write_bytes(z.read("tensorrt_bindings/tensorrt.so"))
        init_py = z.read("tensorrt_bindings/__init__.py").decode()
        elf = Elf(so)
        tracer = Tracer(elf)
        classes, bound, attrs = collect(tracer)
        namer = Namer(elf, classes)
        surface = render(namer, bound, attrs, init_py)
    version = re.search(r'__version__\s*=\s*"([^"]+)"', init_py).group(1)
    return {
        "format": "masc-tensorrt-surface",
        "format_version": 1,
        "source": {
            "wheel": wheel.name,
            "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "tensorrt_version": version,
            "extractor": "scripts/extract_trt_surface.py",
            "method": "pybind11 registrations read from tensorrt.so (objdump, symbolic pass) and "
            "__init__.py (ast); no TensorRT import",
        },
        **surface,
    }


def self_check(surface: dict) -> list[str]:
    problems = []
    for (cls, meth), want in SELF_CHECKS.items():
        got = surface["classes"].get(cls, {}).get("methods", {}).get(meth)
        if not got or want not in got:
            problems.append(f"{cls}.{meth}: {got} (want {want!r})")
    flags = surface["enums"].get("BuilderFlag", {}).get("members", [])
    if "TF32" not in flags or "FP16" in flags:
        problems.append(f"BuilderFlag members: {flags}")
    if "USER_MANAGED" not in surface["enums"].get("ExecutionContextAllocationStrategy", {}).get("members", []):
        problems.append("ExecutionContextAllocationStrategy.USER_MANAGED missing")
    if "WARNING" not in surface["classes"].get("Logger", {}).get("python", []):
        problems.append("Logger.WARNING (python side) missing")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, default=None, help=f"the {WHEEL_SPEC} wheel (default: pip download it)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = a.wheel or fetch_wheel(Path(tmp))
        surface = extract(wheel)
    problems = self_check(surface)
    if problems:
        print("extraction disagrees with TensorRT's documented API:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(surface, indent=1, sort_keys=False) + "\n")
    n_methods = sum(len(c.get("methods", {})) for c in surface["classes"].values())
    print(
        f"{a.out}: {len(surface['classes'])} classes, {n_methods} methods, {len(surface['enums'])} enums "
        f"({len(surface['notes']['names_unrecovered'])} methods without recovered argument names)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
