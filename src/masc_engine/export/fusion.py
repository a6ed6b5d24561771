"""The ``ort-cpu`` graph variant: ONNX Runtime's transformer fusions on the exported fp32 graphs.

Build time only. ``onnxruntime.transformers.optimizer`` (the library ONNX Runtime ships for this,
which optimum's ``ORTOptimizer`` wraps) fuses each encoder layer's attention into one
``com.microsoft`` ``Attention`` node (one packed QKV GEMM plus ONNX Runtime's attention kernel),
residual Add + LayerNormalization into ``SkipLayerNormalization`` and the tanh GELU into
``FastGelu``. The fused graphs use contrib ops that TensorRT's ONNX parser cannot build, so the
bundle keeps the portable standard-op graphs and stores these beside them as the ``ort-cpu``
variant (``vision.ort-cpu.onnx``, ``text.ort-cpu.onnx``): :class:`FusionTransform` is one step of
the export-time transform pipeline (export/transforms.py), which validates each fused graph
against PyTorch and records it in the manifest; the exporter then checks CP and PF on the fused
graphs (:func:`check_scores`, export/fusion_scores.py: the score check against PyTorch, whose
names are importable from here). The runtime picks them for ONNX Runtime on CPU
(engine/bundle.py, runtime/scorer.py).

The fused graphs store no second copy of the weights: the optimizer works on the graph read
without its weights (the tensors a fusion reads come from disk on demand), every tensor it leaves
alone keeps pointing at the portable graph's ``.data`` file, and the packed QKV weight of each
``Attention`` node is a ``Concat`` of the portable Q, K and V (:func:`share_packed_qkv`), which ONNX
Runtime folds back when it creates the session. Only what differs (the packed QKV biases, a few
constants) goes to ``<graph>.ort-cpu.onnx.data`` (export/external_data.py).

Attention fusion needs the exported graph in a shape the optimizer's pattern matcher
(``fusion_attention.FusionAttention``, onnxruntime 1.32) recognises. torch's dynamo exporter
writes SigLIP2's attention differently in three ways, which :func:`canonicalize_attention`
rewrites (each rewrite computes the same values; the fused result is validated against PyTorch
afterwards, export/validate.py):

1. The NaFlex key_padding_mask is ``Mul(Cast(Unsqueeze(Equal(pixel_attention_mask, 0))), -30000)``;
   the matcher knows BERT's ``Mul(Sub(1, Cast(Unsqueeze(Unsqueeze(mask)))), value)``. Both give
   0 for a real patch and ``MASK_VALUE`` for a padding slot when the mask holds 0/1 (the runtime
   writes exactly that). The optimizer then carries ``pixel_attention_mask`` into every
   ``Attention`` node as a raw 2-D mask (``AttentionMaskFormat.AttentionMask``: any padding
   layout, not only right padding) with ``mask_filter_value`` = ``MASK_VALUE``.
2. Scores are scaled by ``Mul(QK^T, head_dim**-0.5)``; with a Mul-shaped mask the matcher takes
   the wrong Mul, so the scale becomes ``Div(QK^T, head_dim**0.5)``. The fused kernel applies its
   own default scale ``1/sqrt(head_size)``, which we check equals the exported one.
3. The text tower adds a constant all-visible mask (transformers 5 builds one even without an
   attention mask); a constant zero bias is dropped. The first layer's residual Add lists the
   embeddings first, and the matcher takes the first Add parent, so residual Adds put the
   attention branch first (addition commutes).

Every attention block must fuse: the variant is refused (:class:`FusionError`) if any Softmax is
left, so a partly fused graph never ships. The pooling head (``pool``) and the ``cp`` graph are
not fused: the pooling head's query is a learned constant (no self-attention pattern), its
attention weights are an output the fused kernel does not return, and both cost little.
"""

from __future__ import annotations

import collections
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

import numpy as np

from ..errors import MascEngineError
from . import external_data

# The score check's public names, re-exported (importable from the fusion module as before).
from .fusion_scores import (
    SCORE_PROMPTS,  # noqa: F401
    check_scores,
    score_prompt_ids,
    score_references_text,
    score_references_vision,
    validate_scores,  # noqa: F401
)

#: Name of the variant in the manifest and the infix of its files (``vision.ort-cpu.onnx``).
VARIANT = "ort-cpu"
#: Graphs the variant replaces; the rest (pool, cp) run the portable graphs.
FUSED_GRAPHS = ("vision", "text")
#: Contrib ops whose counts the manifest records.
FUSED_OP_TYPES = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "FastGelu",
    "BiasGelu",
    "Gelu",
    "LayerNormalization",
    "SkipSimplifiedLayerNormalization",
)


class FusionError(MascEngineError):
    """The optimizer could not fuse every attention block, or the graph is not one we know."""


class _Graph:
    """Producer/consumer lookups over an ``onnx.GraphProto`` (rebuilt after each rewrite)."""

    def __init__(self, graph):
        from onnx import numpy_helper

        self.g = graph
        self._np = numpy_helper
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers = collections.defaultdict(list)
        for n in graph.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.inits = {t.name: t for t in graph.initializer}
        self.inputs = {t.name: t for t in graph.input}

    def const(self, name: str):
        """The value of an initializer or Constant output, else None."""
        if name in self.inits:
            return self._np.to_array(self.inits[name])
        p = self.producer.get(name)
        if p is not None and p.op_type == "Constant" and p.attribute and p.attribute[0].name == "value":
            return self._np.to_array(p.attribute[0].t)
        return None

    def op(self, name: str) -> str | None:
        p = self.producer.get(name)
        return p.op_type if p is not None else None


def _scaled_scores(g: _Graph, name: str):
    """``(mul_node, scale)`` if ``name`` is ``Mul(MatMul(Q, K^T), scalar)``, else None."""
    mul = g.producer.get(name)
    if mul is None or mul.op_type != "Mul":
        return None
    for i, j in ((0, 1), (1, 0)):
        s = g.const(mul.input[j])
        if g.op(mul.input[i]) == "MatMul" and s is not None and s.size == 1:
            return mul, i, float(s.reshape(()))
    return None


def _all_visible(g: _Graph, name: str) -> bool:
    """True if the additive mask ``name`` is a constant zero tensor: an initializer of zeros, or
    ``Where(cond, 0, x)`` with ``cond`` (or the ``Expand`` input behind it) constant all-True."""
    v = g.const(name)
    if v is not None:
        return bool(np.all(v == 0))
    w = g.producer.get(name)
    if w is None or w.op_type != "Where":
        return False
    cond = g.const(w.input[0])
    if cond is None and g.op(w.input[0]) == "Expand":
        cond = g.const(g.producer[w.input[0]].input[0])
    zero = g.const(w.input[1])
    return cond is not None and bool(np.all(cond)) and zero is not None and bool(np.all(zero == 0))


def _padding_mask_source(g: _Graph, name: str):
    """``(graph_input, mask_value)`` if ``name`` is the exporter's NaFlex key_padding_mask
    ``Mul(Cast(Unsqueeze(Equal(input, 0), axes=[1, 2])), value)``, value < 0; else None."""
    mul = g.producer.get(name)
    if mul is None or mul.op_type != "Mul":
        return None
    for i, j in ((0, 1), (1, 0)):
        value = g.const(mul.input[j])
        cast = g.producer.get(mul.input[i])
        if value is None or value.size != 1 or float(value.reshape(())) >= 0 or cast is None or cast.op_type != "Cast":
            continue
        unsq = g.producer.get(cast.input[0])
        if unsq is None or unsq.op_type != "Unsqueeze":
            continue
        axes = g.const(unsq.input[1]) if len(unsq.input) > 1 else None
        eq = g.producer.get(unsq.input[0])
        if axes is None or sorted(axes.ravel().tolist()) != [1, 2] or eq is None or eq.op_type != "Equal":
            continue
        zero = g.const(eq.input[1])
        if eq.input[0] in g.inputs and zero is not None and np.all(zero == 0):
            return eq.input[0], float(value.reshape(()))
    return None


def _residual_add(g: _Graph, softmax) -> tuple | None:
    """The residual ``Add`` after an attention block and the index of its attention-branch input:
    Softmax -> MatMul(P, V) -> Transpose -> Reshape -> MatMul(out_proj) -> Add(bias) -> Add."""
    node = softmax
    for op in ("MatMul", "Transpose", "Reshape", "MatMul", "Add", "Add"):
        nxt = [c for c in g.consumers[node.output[0]] if c.op_type == op]
        if len(nxt) != 1:
            return None
        prev, node = node, nxt[0]
    return node, list(node.input).index(prev.output[0])


class AttentionReport(TypedDict):
    """What :func:`canonicalize_attention` found and rewrote: attention blocks, padding masks made
    canonical, constant all-visible masks dropped, unmasked blocks, and the additive mask value
    (None: no padding mask)."""

    attention_blocks: int
    padding_masks: int
    constant_masks_dropped: int
    unmasked: int
    mask_value: float | None


def canonicalize_attention(model, head_dim: int) -> AttentionReport:
    """Rewrite ``model`` (an ``onnx.ModelProto``, in place) so that ONNX Runtime's attention
    fusion recognises every attention block (see the module docstring for the three rewrites).

    Args:
        model (onnx.ModelProto): an exported SigLIP2 vision or text graph (export/graphs.py).
        head_dim: the attention head size; the exported score scale must be ``head_dim**-0.5``
            (the fused kernel's default).

    Returns:
        ``{"attention_blocks", "padding_masks", "constant_masks_dropped", "unmasked",
        "mask_value"}``: what was found and rewritten.

    Raises:
        FusionError: a score scale other than ``head_dim**-0.5``, or an additive mask of a form
            this adapter does not know (fusing it could drop the mask).
    """
    from onnx import TensorProto, helper

    g = _Graph(model.graph)
    report = AttentionReport(attention_blocks=0, padding_masks=0, constant_masks_dropped=0, unmasked=0, mask_value=None)
    canonical: dict[str, str] = {}  # graph input -> canonical additive mask tensor
    new_nodes, new_inits = [], []
    inv_scale_name = None
    want = head_dim**-0.5
    for sm in [n for n in model.graph.node if n.op_type == "Softmax"]:
        src = g.producer.get(sm.input[0])
        if src is None:
            continue
        mask = None
        scaled = _scaled_scores(g, sm.input[0])
        if scaled is None and src.op_type == "Add":
            for i in (0, 1):
                scaled = _scaled_scores(g, src.input[i])
                if scaled is not None:
                    scores, mask = src.input[i], src.input[1 - i]
                    break
        if scaled is None:
            continue  # not a self-attention block of ours (left for the count check)
        mul, qk_index, scale = scaled
        if not math.isclose(scale, want, rel_tol=1e-6):
            raise FusionError(
                f"attention at {sm.name}: score scale {scale!r} is not head_dim**-0.5 = {want!r}; "
                "the fused kernel would scale differently"
            )
        report["attention_blocks"] += 1
        if mask is None:
            report["unmasked"] += 1
        elif _all_visible(g, mask):
            sm.input[0] = scores
            report["constant_masks_dropped"] += 1
        else:
            found = _padding_mask_source(g, mask)
            if found is None:
                raise FusionError(
                    f"attention at {sm.name}: additive mask {mask!r} has a form the fusion "
                    "adapter does not know; refusing rather than risk dropping it"
                )
            inp, value = found
            if report["mask_value"] not in (None, value):
                raise FusionError("attention blocks use different mask values")
            report["mask_value"] = value
            if inp not in canonical:
                nm = f"masc_kpm_{inp}"
                one = helper.make_tensor(nm + "_one", TensorProto.FLOAT, [], [1.0])
                ax1 = helper.make_tensor(nm + "_axis1", TensorProto.INT64, [1], [1])
                ax2 = helper.make_tensor(nm + "_axis2", TensorProto.INT64, [1], [2])
                val = helper.make_tensor(nm + "_value", TensorProto.FLOAT, [], [value])
                new_inits += [one, ax1, ax2, val]
                new_nodes += [
                    helper.make_node("Unsqueeze", [inp, ax1.name], [nm + "_u1"], name=nm + "_u1"),
                    helper.make_node("Unsqueeze", [nm + "_u1", ax2.name], [nm + "_u2"], name=nm + "_u2"),
                    helper.make_node("Cast", [nm + "_u2"], [nm + "_f"], name=nm + "_cast", to=TensorProto.FLOAT),
                    helper.make_node("Sub", [one.name, nm + "_f"], [nm + "_hidden"], name=nm + "_sub"),
                    helper.make_node("Mul", [nm + "_hidden", val.name], [nm], name=nm + "_mul"),
                ]
                canonical[inp] = nm
            src.input[0], src.input[1] = scores, canonical[inp]
            report["padding_masks"] += 1
        # Mul(QK^T, s) -> Div(QK^T, 1/s): see rewrite 2 in the module docstring.
        if inv_scale_name is None:
            inv_scale_name = "masc_attention_inv_scale"
            new_inits.append(
                helper.make_tensor(inv_scale_name, TensorProto.FLOAT, [], [float(1.0 / np.float64(scale))])
            )
        mul.op_type = "Div"
        mul.input[:] = [mul.input[qk_index], inv_scale_name]
        res = _residual_add(g, sm)
        if res is not None and res[1] != 0:
            add, i = res
            add.input[0], add.input[i] = add.input[i], add.input[0]
    model.graph.initializer.extend(new_inits)
    for n in reversed(new_nodes):  # inputs are graph inputs and initializers: safe at the top
        model.graph.node.insert(0, n)
    return report


def fuse_graph(src: str | Path, dst: str | Path, num_heads: int, hidden_size: int) -> dict:
    """Fuse one exported encoder graph with ONNX Runtime's transformer optimizer.

    Runs :func:`canonicalize_attention`, then ``onnxruntime.transformers.optimizer.optimize_model``
    (model type ``bert``: its fusions cover SigLIP2's pre-LN encoder; raw 2-D attention mask,
    embedding fusion off, ``opt_level=0`` so the stored graph holds only the Python fusions and
    no hardware-specific ONNX Runtime rewrites; ONNX Runtime applies those at session creation).

    Args:
        src: the portable graph (``vision.onnx`` or ``text.onnx``).
        dst: where to write the fused graph. Its tensors equal to tensors of ``src``'s data file
            (same folder) point there; the rest go to ``<dst>.data`` (:func:`_share_with_source`).
        num_heads, hidden_size: the tower's attention heads and width.

    Returns:
        Facts for the manifest: ``fusions`` (fused node counts by op type), ``adapter`` (:func:`canonicalize_attention`'s report),
        ``external_data`` (data files and the shared / own tensors and bytes), ``optimizer`` settings and version.

    Raises:
        FusionError: an attention block was left unfused (any Softmax remains), or fewer
            ``Attention`` nodes than attention blocks.
    """
    import onnx
    import onnxruntime
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions

    from .transforms import op_counts

    # The graph without its weights: the optimizer's symbolic shape inference copies the model
    # several times (at the base shape a fully loaded vision graph of 0.34 GB peaked at 2.2 GB);
    # the few tensors a fusion reads (Q, K, V to pack) are read from disk when it reads them
    # (onnx's to_array resolves external data against the working directory: the graph's folder).
    model = onnx.load(str(src), load_external_data=False)
    with _working_dir(Path(src).parent):
        adapter = canonicalize_attention(model, hidden_size // num_heads)
        options = FusionOptions("bert")
        options.attention_mask_format = AttentionMaskFormat.AttentionMask
        options.enable_embed_layer_norm = False  # our embeddings are not BERT's (patches, positions)
        opt = optimizer.optimize_model(
            model,
            model_type="bert",
            num_heads=num_heads,
            hidden_size=hidden_size,
            opt_level=0,
            optimization_options=options,
        )
    fused = opt.model
    after = op_counts(fused)
    blocks = adapter["attention_blocks"]
    if after.get("Softmax", 0) or after.get("com.microsoft::Attention", 0) != blocks or blocks == 0:
        raise FusionError(
            f"{Path(src).name}: {after.get('com.microsoft::Attention', 0)} of {blocks} attention blocks "
            f"fused ({after.get('Softmax', 0)} Softmax left); refusing a partly fused graph"
        )
    attn = [n for n in fused.graph.node if n.op_type == "Attention"]
    masks = {n.input[3] if len(n.input) > 3 else "" for n in attn}
    if adapter["padding_masks"] and masks != {"pixel_attention_mask"}:
        raise FusionError(
            f"{Path(src).name}: fused Attention nodes take mask {sorted(masks)}, not pixel_attention_mask"
        )
    if not adapter["padding_masks"] and masks != {""}:
        raise FusionError(f"{Path(src).name}: unexpected attention mask inputs {sorted(masks)}")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    opt.topological_sort()
    if not any(o.domain == "com.microsoft" for o in fused.opset_import):  # as the optimizer's own save adds it
        fused.opset_import.add(domain="com.microsoft", version=1)
    del model, opt
    shared = _share_with_source(fused, Path(src), dst)
    # Weights in data files beside the graph (the portable graph's, and ``<dst>.data`` for what
    # differs): ONNX Runtime reads them without parsing a protobuf of the model's size, which made
    # session creation for the base vision graph 2.6 s instead of 4.3 s here; also keeps so400m
    # under protobuf's 2 GiB.
    files = external_data.save_model(fused, dst)
    return {
        "fusions": {k.split("::", 1)[1]: v for k, v in after.items() if k.startswith("com.microsoft::")},
        "adapter": adapter,
        "external_data": {"files": files, **shared},
        "optimizer": {
            "tool": "onnxruntime.transformers.optimizer.optimize_model",
            "onnxruntime": onnxruntime.__version__,
            "model_type": "bert",
            "opt_level": 0,
            "num_heads": int(num_heads),
            "hidden_size": int(hidden_size),
            "attention_mask_format": "AttentionMask (raw 2-D)",
            "enable_embed_layer_norm": False,
        },
    }


def share_packed_qkv(model, index: external_data.TensorIndex) -> tuple[int, int]:
    """Replace each ``Attention`` node's packed QKV weight ``[D, 3D]`` whose three ``[D, D]``
    column blocks are tensors of ``index`` (the portable graph's separate Q, K and V weights) by a
    ``Concat`` of those three, pointing at the portable graph's data (in place).

    The packed weight is the only large tensor the fusion makes (3/11 of an encoder layer's
    weights at SigLIP2's shapes); ONNX Runtime folds the ``Concat`` into the same packed tensor at
    session creation (constant folding) and the Attention kernel prepacks it as before: the base
    vision graph's outputs were bit-identical, its session memory +3% (343 -> 353 MB).

    Returns:
        ``(packed weights replaced, bytes they no longer store)``.
    """
    from onnx import helper, numpy_helper

    inits = {t.name: i for i, t in enumerate(model.graph.initializer)}
    drop, blocks, concats, saved = [], [], [], 0
    for node in model.graph.node:
        if node.op_type != "Attention" or node.domain != "com.microsoft" or node.input[1] not in inits:
            continue
        w = model.graph.initializer[inits[node.input[1]]]
        if len(w.dims) != 2 or w.dims[1] % 3:
            continue
        parts = [
            numpy_helper.from_array(np.ascontiguousarray(p), f"{w.name}_{x}")
            for p, x in zip(np.split(numpy_helper.to_array(w), 3, axis=1), "qkv")
        ]
        hits = [index.get(external_data.tensor_key(t.data_type, t.dims, t.raw_data)) for t in parts]
        found = [h for h in hits if h is not None]
        if len(found) != len(hits):
            continue
        for t, hit in zip(parts, found):
            external_data.point_at(t, *hit)
            saved += hit[2]
        blocks += parts
        drop.append(inits[node.input[1]])
        concats.append(helper.make_node("Concat", [t.name for t in parts], [w.name], axis=1, name=f"{w.name}_concat"))
    for i in sorted(drop, reverse=True):
        del model.graph.initializer[i]
    model.graph.initializer.extend(blocks)
    for n in reversed(concats):  # inputs are initializers: safe at the top
        model.graph.node.insert(0, n)
    return len(concats), saved


@contextmanager
def _working_dir(d: Path):
    old = os.getcwd()
    os.chdir(d)
    try:
        yield
    finally:
        os.chdir(old)


def _share_with_source(fused, src: Path, dst: Path) -> dict:
    """Point the fused graph's tensors at the portable graph's data where the bytes are the same.

    Tensors the optimizer did not touch still point there (the graph was read without its
    weights); :func:`share_packed_qkv` and :func:`external_data.share_tensors` match the ones it
    made. Only when both graphs sit in one folder (a bundle), since a data file is named relative
    to its graph; written elsewhere, the fused graph gets all its weights in its own file."""
    from onnx.external_data_helper import load_external_data_for_model

    if src.resolve().parent != dst.resolve().parent:
        load_external_data_for_model(fused, str(src.parent))
        return {"shared_with": None}
    if not external_data.data_files(src):
        return {"shared_with": None}
    wanted = {(t.data_type, tuple(t.dims)) for t in fused.graph.initializer if t.HasField("raw_data")}
    wanted |= {(dt, (d, d)) for dt, dims in wanted if len(dims) == 2 for d in [dims[0]]}  # packed QKV blocks
    index = external_data.external_tensor_index(src, shapes=wanted)
    packed, _ = share_packed_qkv(fused, index)
    external_data.share_tensors(fused, index)
    shared = external_data.data_files(src)
    return {"shared_with": shared, "packed_qkv_as_concat": packed, **external_data.storage_facts(fused, shared)}


class FusionTransform:
    """The ``ort-cpu`` variant as an export-time graph transform (export/transforms.py
    :class:`~masc_engine.export.transforms.GraphTransform`): :func:`fuse_graph` on the vision and
    text graphs, written beside the portable ones and validated against PyTorch with the fp32
    budgets by the pipeline.

    Args:
        towers: ``{graph: (num_heads, hidden_size)}`` for ``vision`` and ``text``.
    """

    name = "ort-fusion"
    variant = VARIANT
    gates = "fp32"
    graphs = FUSED_GRAPHS
    #: What the variant is for (engine/bundle.py ``resolve_variant``): the contrib ops run on
    #: ONNX Runtime; measured and validated on its CPU provider only.
    runtime = {"backend": "onnxruntime", "provider": "cpu"}

    def __init__(self, towers: dict[str, tuple[int, int]]):
        self.towers = {g: (int(h), int(w)) for g, (h, w) in towers.items()}

    @classmethod
    def for_model(cls, model) -> "FusionTransform":
        """From a transformers ``Siglip2Model`` (its towers' heads and widths)."""
        v, t = model.vision_model.config, model.text_model.config
        return cls({"vision": (v.num_attention_heads, v.hidden_size), "text": (t.num_attention_heads, t.hidden_size)})

    def settings(self) -> dict:
        return {
            "optimizer": "onnxruntime.transformers.optimizer.optimize_model",
            "model_type": "bert",
            "opt_level": 0,
            "towers": {g: {"num_heads": h, "hidden_size": w} for g, (h, w) in self.towers.items()},
            "runtime": dict(self.runtime),
        }

    def apply(self, graph: str, src: Path, dst: Path) -> dict:
        heads_, width = self.towers[graph]
        return fuse_graph(src, dst, heads_, width)


def variant_runner_for(bundle_dir: str | Path, graphs: dict):
    """``graph -> OrtRunner`` on the fused graphs of a bundle being written (the pooling head is
    the portable one, as at run time), each opened when asked for (lean CPU memory)."""
    from ..engine.backends.onnxruntime import OrtRunner

    d = Path(bundle_dir)

    def runner_for(graph: str):
        entry = graphs[graph]
        return OrtRunner(d / entry.get("variants", {}).get(VARIANT, entry)["file"], graph, ort_memory="lean")

    return runner_for


def check_variant_scores(bundle_dir: str | Path, graphs: dict, refs: dict) -> dict:
    """:func:`check_scores` on the fused graphs of a bundle being written, one session at a time.

    Args:
        graphs: the manifest's ``graphs`` section, with the ``ort-cpu`` variant recorded by the
            transform pipeline.
        refs: the score check's PyTorch references (:func:`check_scores`).

    Raises:
        ExportValidationError: CP or PF past ``tolerances.ORACLE_SCORE_ATOL``.
    """
    return check_scores(refs, variant_runner_for(bundle_dir, graphs))


def validate_variant_scores(bundle_dir: str | Path, graphs: dict, model, processor, image: dict, text: dict) -> dict:
    """:func:`check_variant_scores` with the references computed from ``model`` first."""
    refs = {
        "vision": score_references_vision(model.vision_model, processor, image),
        "text": score_references_text(model.text_model, score_prompt_ids(text, bundle_dir)),
    }
    return check_variant_scores(bundle_dir, graphs, refs)
