"""Mixed-precision ONNX graphs (fp16 / bf16 with fp32 islands): the policy and the transform.

TensorRT 11 builds *strongly typed* networks only: every tensor's type comes from the ONNX graph
(TensorRT 10.x-to-11.x migration guide: the weak-typing builder flags for fp16/bf16, precision
constraints and per-layer precision and output types are gone). So the precision lives in the
bundle's graphs:

- **The converter** is ONNX Runtime's ``onnxruntime.transformers.float16.convert_float_to_float16``
  (``keep_io_types=True``: graph inputs and outputs keep their float32 / int / bool types, so the
  runtime feeds and reads them as for an fp32 bundle; Casts are inserted at island borders).
- **The policy** (ours, :func:`fp32_onnx_nodes`) lists the nodes kept in fp32, passed as the
  converter's ``node_block_list``: LayerNorm, softmax, reductions and L2 norms, the tanh-GELU's
  whole decomposition (``x**3`` overflows fp16 past |x| ~ 40), and the exporter's own ``Cast``
  nodes (the mask's bool -> float cast, ``node__to_copy``: a converted Cast target gives a graph
  that fails to load with a type mismatch).
- **bf16**: the converter has no bf16 target, and ONNX Runtime's CPU provider has no bf16 kernels
  for MatMul, Add, Mul, Tanh or Softmax (checked with onnxruntime 1.32). A bf16 graph is the
  converter's fp16 output with every float16 element type retyped to bfloat16 (same islands, same
  Casts) and its reduced-precision initializers re-rounded from the fp32 originals (round to
  nearest even), :func:`retype_fp16_to_bf16`. It runs on TensorRT and ONNX Runtime CUDA. On CPU it
  is measured **emulated** (:func:`emulate_bf16`): every bfloat16 tensor of the graph becomes a
  float32 tensor rounded to bfloat16 right where it is produced (a ``Cast`` to bfloat16 and back
  after every node output and initializer that is bfloat16 in the real graph); each op then
  computes in float32 from bf16-valued inputs, as TensorRT's bf16 GEMMs accumulate in fp32.

The transform (:class:`PrecisionTransform`) plugs into export/transforms.py's pipeline; the
exporter validates its output against PyTorch with the reduced-precision gates in
:mod:`masc_engine.tolerances`. The converter appends its island-border Casts at the end of the
node list, so its graphs are not in topological order, which the ONNX spec requires and
``onnx.checker`` enforces (ONNX Runtime and TensorRT's parser sort nodes themselves, so they ran
anyway); :func:`topological_sort` restores the order before the graph is written.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

PRECISIONS = ("fp32", "fp16", "bf16")
#: Bumped when the policy below changes (recorded in the manifest and the engine sidecars).
POLICY_VERSION = 1

#: ONNX ops kept in fp32 in reduced-precision graphs, and why.
FP32_ONNX_OPS = {
    "LayerNormalization": "LayerNorm: variance of activations in the hundreds overflows fp16",
    "Softmax": "softmax: exp and the row sum need fp32 range and accuracy",
    "ReduceSum": "reduction: long sums lose precision / overflow in fp16",
    "ReduceMean": "reduction: long sums lose precision / overflow in fp16",
    "ReduceL2": "L2 norm: sum of squares over D = 1152 overflows fp16 past |x| ~ 7.5",
    "ReduceSumSquare": "L2 norm: sum of squares overflows fp16",
    "ReduceMax": "max of cosines: kept exact",
    "Cast": "the exporter's dtype casts (mask bool -> float, node__to_copy): a converted Cast target "
    "makes the graph fail to load with a type mismatch",
}
#: torch ops whose whole ONNX decomposition is kept in fp32 (read from the node's
#: ``pkg.torch.onnx.fx_node`` metadata, which torch's dynamo exporter writes).
FP32_TORCH_OPS = {
    "aten.gelu": "tanh-GELU: x**3 overflows fp16 past |x| ~ 40",
    "aten.layer_norm": "LayerNorm (decomposed)",
    "aten.softmax": "softmax (decomposed)",
    "aten.linalg_vector_norm": "L2 norm (decomposed)",
}


def policy() -> dict:
    """The policy as recorded in the manifest and in TensorRT engine sidecars."""
    return {
        "version": POLICY_VERSION,
        "fp32_onnx_ops": dict(FP32_ONNX_OPS),
        "fp32_torch_ops": dict(FP32_TORCH_OPS),
        "io_types": "kept (float32 / int / bool): the runtime feeds and reads graphs as for fp32",
    }


def fp32_onnx_nodes(nodes: Sequence[tuple[str, str, str]]) -> dict[str, str]:
    """``{node name: reason}`` of the ONNX nodes to keep in fp32.

    Args:
        nodes: ``(name, op_type, fx_node metadata or "")`` per node of the graph
            (:func:`graph_nodes`).
    """
    keep = {}
    for name, op, fx in nodes:
        if op in FP32_ONNX_OPS:
            keep[name] = FP32_ONNX_OPS[op]
            continue
        for torch_op, reason in FP32_TORCH_OPS.items():
            if torch_op in (fx or ""):
                keep[name] = reason
                break
    return keep


def graph_nodes(model) -> list[tuple[str, str, str]]:
    """``(name, op_type, fx_node metadata)`` per node of an ``onnx.ModelProto``."""
    return [
        (n.name, n.op_type, next((p.value for p in n.metadata_props if p.key == "pkg.torch.onnx.fx_node"), ""))
        for n in model.graph.node
    ]


def initializer_dtypes(path: str | Path) -> dict[str, dict[str, int]]:
    """``{dtype: {"count": n, "elements": e}}`` over an ONNX file's initializers (and Constant nodes)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    counts: dict[str, dict[str, int]] = {}
    tensors = list(model.graph.initializer) + [
        a.t for n in model.graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
    ]
    for t in tensors:
        name = onnx.TensorProto.DataType.Name(t.data_type).lower()
        c = counts.setdefault(name, {"count": 0, "elements": 0})
        c["count"] += 1
        c["elements"] += int(np.prod(t.dims)) if len(t.dims) else 1
    return counts


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (finite inputs)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (returned as float32)."""
    return (_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def retype_fp16_to_bf16(model16, model32):
    """The converter's fp16 graph with every float16 element type made bfloat16 (in place).

    Reduced-precision initializers are re-rounded to bfloat16 from ``model32``'s fp32 values of the
    same name (the fp16 values would carry fp16's rounding and range clamp).

    Raises:
        ValueError: a float16 initializer without an fp32 original.
    """
    import onnx
    from onnx import TensorProto, numpy_helper

    originals = {t.name: t for t in model32.graph.initializer}

    def retensor(t):
        if t.data_type != TensorProto.FLOAT16:
            return
        if t.name in originals:
            src = numpy_helper.to_array(originals[t.name]).astype(np.float32)
        else:  # a Constant node's value or an unnamed tensor: its fp16 values widen exactly
            src = numpy_helper.to_array(t).astype(np.float32)
        bits = _bf16_bits(src).reshape(src.shape)
        t.ClearField("int32_data")
        t.ClearField("raw_data")
        t.data_type = TensorProto.BFLOAT16
        t.raw_data = bits.tobytes()

    g = model16.graph
    for t in g.initializer:
        retensor(t)
    for n in g.node:
        for a in n.attribute:
            if a.name == "to" and a.i == TensorProto.FLOAT16:
                a.i = TensorProto.BFLOAT16
            if a.type == onnx.AttributeProto.TENSOR:
                retensor(a.t)
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        tt = vi.type.tensor_type
        if tt.elem_type == TensorProto.FLOAT16:
            tt.elem_type = TensorProto.BFLOAT16
    return model16


def topological_sort(graph) -> int:
    """Reorder ``graph.node`` (an ``onnx.GraphProto``, in place) so that every node comes after
    the nodes producing its inputs, as the ONNX spec requires; stable (nodes already in order keep
    their relative order). Inputs of subgraphs (``If`` / ``Loop`` bodies) that name outer values
    count as inputs of the node holding them.

    Returns:
        the number of nodes that moved.

    Raises:
        ValueError: a node reads a value no graph input, initializer or node produces, or the
            nodes form a cycle (the message names the node and the value).
    """
    import heapq

    nodes = list(graph.node)
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    known |= {t.name for t in graph.sparse_initializer}
    producer = {out: i for i, n in enumerate(nodes) for out in n.output if out}
    waits: list[set[int]] = [set() for _ in nodes]
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for name in _node_reads(n):
            if name in known:
                continue
            if name not in producer:
                raise ValueError(
                    f"node {n.name or n.op_type!r} reads {name!r}, which no input, initializer or "
                    "node of the graph produces"
                )
            if producer[name] != i:
                waits[i].add(producer[name])
                users.setdefault(producer[name], []).append(i)
    ready = [i for i, w in enumerate(waits) if not w]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users.get(i, ()):
            waits[j].discard(i)
            if not waits[j]:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        stuck = next(nodes[i] for i in range(len(nodes)) if i not in set(order))
        raise ValueError(f"the graph's nodes form a cycle (through {stuck.name or stuck.op_type!r})")
    moved = sum(1 for pos, i in enumerate(order) if pos != i)
    if moved:
        del graph.node[:]
        graph.node.extend(nodes[i] for i in order)
    return moved


def _node_reads(node) -> set[str]:
    """Values a node reads: its inputs, and the outer-scope values its subgraphs read."""
    import onnx

    reads = set(node.input)
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            inner = {i.name for i in g.input} | {t.name for t in g.initializer}
            inner |= {o for n in g.node for o in n.output}
            reads |= {r for n in g.node for r in _node_reads(n)} - inner
    return reads


def emulate_bf16(model):
    """A float32 graph that rounds to bfloat16 wherever the bf16 ``model`` has a bfloat16 tensor.

    For ONNX Runtime CPU, which has no bf16 kernels. Every bfloat16 initializer becomes float32
    (its values are exactly bfloat16 values); every Cast to bfloat16 becomes a Cast to bfloat16
    followed by a Cast back to float32 (the rounding at the graph's cast points); and every other
    node output that is bfloat16 in the real graph (by ONNX shape inference) is computed in float32
    and rounded the same way right after the node. So each op computes in float32 on bf16 values
    and its result is rounded to bf16, as the real graph stores it.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    del model.graph.value_info[:]  # possibly stale; re-inferred from the graph itself
    model = onnx.shape_inference.infer_shapes(model)
    g = model.graph
    bf16_tensors = {vi.name for vi in g.value_info if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16}
    for t in list(g.initializer):
        if t.data_type == TensorProto.BFLOAT16:
            bits = np.frombuffer(t.raw_data, np.uint16).astype(np.uint32) << 16
            new = numpy_helper.from_array(bits.view(np.float32).reshape(tuple(t.dims)), t.name)
            t.CopyFrom(new)
    nodes = []
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.BFLOAT16:
                bits = np.frombuffer(a.t.raw_data, np.uint16).astype(np.uint32) << 16
                a.t.CopyFrom(numpy_helper.from_array(bits.view(np.float32).reshape(tuple(a.t.dims))))
        nodes.append(n)
        if n.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.BFLOAT16 for a in n.attribute):
            # A cast point: keep the Cast to bf16 (the rounding), then widen for float32 consumers.
            out = n.output[0]
            n.output[0] = out + "__bf16"
            nodes.append(
                helper.make_node("Cast", [out + "__bf16"], [out], to=TensorProto.FLOAT, name=f"{n.name}__emu_widen")
            )
            continue
        for j, out in enumerate(n.output):
            if out in bf16_tensors:  # computed in float32 here; rounded as the real graph stores it
                n.output[j] = out + "__f32"
                nodes.append(
                    helper.make_node(
                        "Cast", [out + "__f32"], [out + "__bf16"], to=TensorProto.BFLOAT16, name=f"{out}__emu_round"
                    )
                )
                nodes.append(
                    helper.make_node("Cast", [out + "__bf16"], [out], to=TensorProto.FLOAT, name=f"{out}__emu_widen")
                )
    del g.node[:]
    g.node.extend(nodes)
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        tt = vi.type.tensor_type
        if tt.elem_type == TensorProto.BFLOAT16:
            tt.elem_type = TensorProto.FLOAT
    return model


def emulated_bf16_file(src: str | Path, dst: str | Path) -> Path:
    """Write :func:`emulate_bf16` of the bf16 ONNX file ``src`` to ``dst``."""
    import onnx

    model = emulate_bf16(onnx.load(str(src)))
    # The emulation widens bf16 weights to float32 (2x): a real so400m text graph passes protobuf's
    # 2 GiB cap, so large results keep external weights beside them, as the exporter's do.
    external = model.ByteSize() > _EXTERNAL_DATA_BYTES
    if external:
        Path(str(dst) + ".data").unlink(missing_ok=True)
    onnx.save(
        model, str(dst), save_as_external_data=external, location=(Path(dst).name + ".data") if external else None
    )
    return Path(dst)


def graph_precision(path: str | Path) -> str:
    """``fp16``, ``bf16`` or ``fp32``: the reduced type carried by most float initializer elements."""
    counts = initializer_dtypes(path)
    best = max(("float16", "bfloat16", "float"), key=lambda k: counts.get(k, {}).get("elements", 0))
    return {"float16": "fp16", "bfloat16": "bf16", "float": "fp32"}[best]


#: Graphs in the bundle whose weights and activations are converted, per precision. bf16 keeps the
#: CP head (no weights; ~0.3% of a pair's FLOPs at so400m shapes) in fp32: its output is a cosine,
#: and bfloat16's 8-bit significand rounds cosines in [0.5, 1) to steps of 2**-8 ~ 3.9e-3, wider
#: than the 2e-3 |dCP| gate; measured on the tiny model's validation cases: |dCP| 2.6e-3 (fails).
GRAPHS = {"fp16": ("vision", "pool", "text", "cp"), "bf16": ("vision", "pool", "text")}
#: ONNX protobufs are capped at 2 GiB; larger graphs keep external weights.
_EXTERNAL_DATA_BYTES = 1_800_000_000


class PrecisionTransform:
    """fp16 / bf16 graphs by the converter under :func:`fp32_onnx_nodes` (an export/transforms.py
    :class:`~masc_engine.export.transforms.GraphTransform` that replaces each graph)."""

    variant: str | None = None  # replaces each graph (GraphTransform.variant)

    def __init__(self, precision: str):
        if precision not in ("fp16", "bf16"):
            raise ValueError(f"precision must be fp16 or bf16, got {precision!r}")
        self.precision = precision
        self.graphs = GRAPHS[precision]
        self.name = f"precision-{precision}"
        self.gates = precision

    def settings(self) -> dict:
        import onnxruntime

        return {
            "precision": self.precision,
            "converter": "onnxruntime.transformers.float16.convert_float_to_float16",
            "onnxruntime": onnxruntime.__version__,
            "keep_io_types": True,
            "op_block_list": "converter default",
            "node_block_list": "policy (fp32_onnx_nodes)",
            "bf16": "fp16 output retyped to bfloat16, initializers re-rounded from fp32"
            if self.precision == "bf16"
            else None,
            "policy_version": POLICY_VERSION,
        }

    def apply(self, graph: str, src: Path, dst: Path) -> dict:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        # fp16 reads only the node names from the fp32 graph; bf16 re-rounds from its fp32 values
        model32 = onnx.load(str(src), load_external_data=self.precision == "bf16")
        keep = fp32_onnx_nodes(graph_nodes(model32))
        model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True, node_block_list=list(keep))
        # The converter leaves value_info entries whose types its own casts contradict (strict shape
        # inference fails on them); they are optional, so drop them.
        del model.graph.value_info[:]
        if self.precision == "bf16":
            model = retype_fp16_to_bf16(model, model32)
        moved = topological_sort(model.graph)
        external = model.ByteSize() > _EXTERNAL_DATA_BYTES
        onnx.save(
            model, str(dst), save_as_external_data=external, location=(Path(dst).name + ".data") if external else None
        )
        counts = initializer_dtypes(dst)
        total = sum(c["elements"] for c in counts.values()) or 1
        reduced = counts.get("float16" if self.precision == "fp16" else "bfloat16", {}).get("elements", 0)
        return {
            "fp32_nodes": len(keep),
            "fp32_node_reasons": dict(Counter(keep.values())),
            "nodes_reordered": moved,
            "initializer_dtypes": counts,
            "reduced_weight_fraction": round(reduced / total, 4),
        }
