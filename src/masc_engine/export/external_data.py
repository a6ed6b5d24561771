"""ONNX external data shared between a bundle's graphs: one copy of each weight on disk.

ONNX stores large tensors outside the protobuf as ``(location, offset, length)`` into a data file
beside the graph (onnx ``external_data_helper``; ONNX Runtime reads any offset into any file of
the model's folder). A graph made from another one by a transform (the fused ``ort-cpu``
variant, export/fusion.py) holds mostly the same tensors: :func:`share_tensors` points each of
its tensors whose bytes equal a tensor already stored in the source graph's data file at that
tensor, so only what differs is written again (:func:`save_model`). Tensors are matched by
content (dtype, shape and a BLAKE2b digest of the bytes), never by name: a transform may rename.
The source's data file is read tensor by tensor with plain reads, never all in memory.

The manifest lists each graph file's data files (``external_data``, :func:`data_files`) and the
runtime checks their sha256 before the graph's first use (engine/bundle.py).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: Tensors of at least this many bytes go to a data file (onnx's own default ``size_threshold``);
#: smaller ones (scalars, shapes, biases of tiny models) stay inside the graph.
SIZE_THRESHOLD = 1024

#: ``(data_type, dims, digest)`` -> ``(location, offset, length)``.
TensorIndex = dict


def tensor_key(data_type: int, dims, raw: bytes | memoryview) -> tuple:
    """The content key of a tensor: element type, shape and a 16-byte BLAKE2b digest of its bytes."""
    return int(data_type), tuple(int(d) for d in dims), hashlib.blake2b(raw, digest_size=16).digest()


def _external_info(tensor) -> dict:
    return {kv.key: kv.value for kv in tensor.external_data}


def data_files(path: str | Path) -> list[str]:
    """The external data files an ONNX file's tensors point at (relative names, sorted); the graph
    is read without its weights."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    model = onnx.load(str(path), load_external_data=False)
    return sorted({_external_info(t)["location"] for t in _get_all_tensors(model) if uses_external_data(t)})


def _file_digest(f, offset: int, length: int, buf: bytearray) -> bytes:
    """BLAKE2b (16 bytes) of ``length`` bytes of ``f`` at ``offset``, read through ``buf``: plain
    reads, not a memory map, so the file's pages never count in this process's RSS."""
    h = hashlib.blake2b(digest_size=16)
    f.seek(offset)
    view = memoryview(buf)
    while length > 0:
        n = f.readinto(view[: min(length, len(buf))])
        if not n:
            raise ValueError(f"{f.name}: external data ends before offset {offset} + length")
        h.update(view[:n])
        length -= n
    return h.digest()


def external_tensor_index(path: str | Path, shapes: set | None = None) -> TensorIndex:
    """Index the external tensors of the ONNX file ``path`` by content (one tensor at a time, in
    16 MiB reads: the weights are never in memory).

    Args:
        shapes: only tensors whose ``(data_type, dims)`` is in this set (None: all).
    """
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    index: TensorIndex = {}
    files: dict = {}
    buf = bytearray(1 << 24)
    try:
        for t in _get_all_tensors(model):
            if not uses_external_data(t) or (shapes is not None and (t.data_type, tuple(t.dims)) not in shapes):
                continue
            info = _external_info(t)
            loc = info["location"]
            if loc not in files:
                files[loc] = open(path.parent / loc, "rb")  # noqa: SIM115 (closed below)
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else os.fstat(files[loc].fileno()).st_size - offset
            key = (int(t.data_type), tuple(int(d) for d in t.dims), _file_digest(files[loc], offset, length, buf))
            index.setdefault(key, (loc, offset, length))
    finally:
        for f in files.values():
            f.close()
    return index


def point_at(tensor, location: str, offset: int, length: int) -> None:
    """Make ``tensor`` read its bytes from ``location`` at ``offset`` (dropping its own bytes)."""
    from onnx import TensorProto

    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def share_tensors(model, index: TensorIndex) -> int:
    """Point every initializer of ``model`` (an ``onnx.ModelProto`` with its weights loaded) whose
    bytes equal a tensor of ``index`` at that tensor (in place).

    Returns:
        the number of tensors pointed at ``index``'s.
    """
    n = 0
    for t in model.graph.initializer:
        if not t.HasField("raw_data") or len(t.raw_data) < SIZE_THRESHOLD:
            continue
        hit = index.get(tensor_key(t.data_type, t.dims, t.raw_data))
        if hit is not None:
            point_at(t, *hit)
            n += 1
    return n


def storage_facts(model, shared_files: list[str]) -> dict:
    """Where ``model``'s initializers live: ``shared_tensors`` / ``shared_bytes`` (in one of
    ``shared_files``) and ``own_tensors`` / ``own_bytes`` (their own bytes, of at least
    :data:`SIZE_THRESHOLD`: what :func:`save_model` writes to the graph's own data file)."""
    from onnx.external_data_helper import uses_external_data

    facts = {"shared_tensors": 0, "shared_bytes": 0, "own_tensors": 0, "own_bytes": 0}
    for t in model.graph.initializer:
        if uses_external_data(t) and not t.HasField("raw_data"):
            info = _external_info(t)
            if info.get("location") in shared_files:
                facts["shared_tensors"] += 1
                facts["shared_bytes"] += int(info.get("length", 0))
        elif t.HasField("raw_data") and len(t.raw_data) >= SIZE_THRESHOLD:
            facts["own_tensors"] += 1
            facts["own_bytes"] += len(t.raw_data)
    return facts


def save_model(model, dst: str | Path) -> list[str]:
    """Write ``model`` to ``dst``: tensors already pointing at a data file stay there, every other
    tensor of at least :data:`SIZE_THRESHOLD` bytes goes to ``<dst>.data`` (created only if one
    does), streamed tensor by tensor (onnx ``save_model``). Returns :func:`data_files` of ``dst``."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    dst = Path(dst)
    own = dst.with_name(dst.name + ".data")
    for old in (dst, own):
        old.unlink(missing_ok=True)
    convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location=own.name, size_threshold=SIZE_THRESHOLD
    )
    onnx.save_model(model, str(dst))
    return data_files(dst)
