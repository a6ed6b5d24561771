"""The external-data files an ONNX graph reads, found without loading it or its weights.

ONNX Runtime (and OpenVINO, TensorRT's parser) read a tensor's weights from the file its
``external_data`` entry ``location`` names, relative to the graph's folder. A bundle must hash
and confine exactly those files (engine/bundle.py), so the runtime reads them from the graph
itself. The ``onnx`` package is an export-time extra, so this module walks the protobuf wire
format directly: every tensor of the model (initializers, sparse initializers, node attributes,
subgraphs of control-flow nodes, functions, training graphs), skipping the weight bytes
without copying them (the file is memory-mapped).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Union

# Field numbers of onnx.proto3 (checked against onnx's descriptors in tests/test_bundle_confinement.py).
_MODEL = {7: "graph", 25: "function", 20: "training"}
_TRAINING = {1: "graph", 2: "graph"}
_GRAPH = {1: "node", 5: "tensor", 15: "sparse"}
_NODE = {5: "attribute"}
_ATTRIBUTE = {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"}
_FUNCTION = {7: "node", 11: "attribute"}
_SPARSE = {1: "tensor", 2: "tensor"}
_TENSOR_EXTERNAL_DATA = 13
_SCHEMA = {
    "model": _MODEL,
    "training": _TRAINING,
    "graph": _GRAPH,
    "node": _NODE,
    "attribute": _ATTRIBUTE,
    "function": _FUNCTION,
    "sparse": _SPARSE,
}
#: Nesting deeper than this (subgraphs of subgraphs...) is refused rather than walked.
MAX_DEPTH = 64
#: The model's bytes: the memory-mapped file (or bytes, in the tests).
_Buf = Union[mmap.mmap, bytes]
_Span = tuple[int, int]


class WireError(ValueError):
    """The bytes are not a well-formed ONNX model (protobuf wire format)."""


def _varint(buf: _Buf, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= end or shift > 63:
            raise WireError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def _fields(buf: _Buf, start: int, end: int) -> Iterator[tuple[int, _Span]]:
    """``(field number, (start, end))`` of each length-delimited field of one message; other
    wire types are skipped."""
    i = start
    while i < end:
        key, i = _varint(buf, i, end)
        wire = key & 7
        if wire == 0:
            _, i = _varint(buf, i, end)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = _varint(buf, i, end)
            if i + n > end:
                raise WireError("a field runs past the end of its message")
            yield key >> 3, (i, i + n)
            i += n
        else:
            raise WireError(f"wire type {wire} is not used by ONNX")
    if i != end:
        raise WireError("a field runs past the end of its message")


def _entry(buf: _Buf, span: _Span) -> tuple[str, str]:
    kv = {f: buf[a:b] for f, (a, b) in _fields(buf, *span) if f in (1, 2)}
    try:
        return kv.get(1, b"").decode("utf-8"), kv.get(2, b"").decode("utf-8")
    except UnicodeDecodeError as e:
        raise WireError("an external_data entry is not UTF-8") from e


def _walk(buf: _Buf, kind: str, span: _Span, depth: int, out: list[str]) -> None:
    if depth > MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH} levels")
    if kind == "tensor":
        for f, sub in _fields(buf, *span):
            if f == _TENSOR_EXTERNAL_DATA:
                key, value = _entry(buf, sub)
                if key == "location":
                    out.append(value)
        return
    schema = _SCHEMA[kind]
    for f, sub in _fields(buf, *span):
        if f in schema:
            _walk(buf, schema[f], sub, depth + 1, out)


def external_data_locations(path: str | Path) -> list[str]:
    """The ``location`` of every tensor's external data in the ONNX model at ``path``, in file
    order, duplicates removed (relative to the model's folder, as ONNX Runtime resolves them).

    Raises:
        WireError: the file is not a well-formed ONNX protobuf.
        OSError: the file cannot be read.
    """
    out: list[str] = []
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise WireError("the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            _walk(mm, "model", (0, size), 0, out)
    return list(dict.fromkeys(out))
