"""FP8 (E4M3) vision tower with explicit Q/DQ, certified on the CPU against fp32.

TensorRT 11 takes FP8 only as explicit quantization in a strongly typed graph: ONNX
``QuantizeLinear`` / ``DequantizeLinear`` pairs with FLOAT8E4M3FN zero points (opset >= 19; 21
here) around the matrix multiplications that are to run in FP8. ONNX Runtime's CPU provider runs
those Q/DQ nodes (rounding to E4M3 and back, then the MatMul in fp32), so the numerics TensorRT's
FP8 GEMMs would see (inputs rounded to E4M3, fp32 accumulation) are scored here before a GPU runs
them. What it cannot show: FP8 speed, and TensorRT's own kernels' accumulation order.

The graph (:func:`qdq_model`), for each linear layer of the vision tower (a ``MatMul`` whose
second input is a 2-D weight initializer ``[K, N]``, :func:`linear_sites`):

- **activation**: ``x -> QuantizeLinear(scale_x, zp=E4M3 0) -> DequantizeLinear -> MatMul``, one
  scale per tensor, ``amax / 448`` with ``amax`` the largest |x| seen on the calibration pairs
  (:func:`calibrate`); E4M3's largest finite value is 448 (``tolerances.FP8_E4M3_MAX``);
- **weight**: stored as a FLOAT8E4M3FN initializer ``round(W / scale_w)`` with one scale per output
  channel (axis 1, ``max_k |W[k, n]| / 448``), read through ``DequantizeLinear(axis=1)``;
- **fp32 islands**: everything else (attention's activation-by-activation products, softmax,
  LayerNorm, GELU, the position-embedding interpolation) and every linear layer of a unit kept in
  fp32 by the certification search.

Certification is bf16-cpu's (export/cpu_precision.py): the same pair sets, gates
(``FIDELITY_MAX_ABS_DELTA``, ``FIDELITY_MIN_SPEARMAN``, ``FIDELITY_MIN_PAIRS`` held-out pairs) and
greedy search over units (``vision.embeddings``, ``vision.layers.<i>``); scored by ONNX Runtime CPU
with the candidate vision graph against fp32 ONNX Runtime on the same bundle.
"""

from __future__ import annotations

import ast
import copy
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..tolerances import FIDELITY_MAX_ABS_DELTA, FIDELITY_MIN_PAIRS, FIDELITY_MIN_SPEARMAN, FP8_E4M3_MAX, FP8_OPSET
from .cpu_precision import (
    CandidateScoring,
    CertificationError,
    _fmt,
    _pair_set,
    default_calibration,
    default_heldout,
    scores,
)

logger = logging.getLogger(__name__)

FP8 = "fp8"
#: The graph run in FP8 (most of a pair's FLOPs); the others stay fp32.
FP8_GRAPHS = ("vision",)
FP8_FILE = "vision.fp8.onnx"


def _unit(node, graph: str) -> str:
    meta = {p.key: p.value for p in node.metadata_props}
    scopes = ast.literal_eval(meta.get("pkg.torch.onnx.name_scopes", "[]"))
    for s in reversed(scopes):
        parts = s.split(".")
        if "layers" in parts and parts.index("layers") + 1 < len(parts):
            return f"{graph}.layers.{parts[parts.index('layers') + 1]}"
    return f"{graph}.embeddings" if any("embeddings" in s for s in scopes) else f"{graph}.head"


def linear_sites(model, graph: str = "vision") -> list[dict]:
    """The linear layers of a graph: ``[{"node", "act", "weight", "unit"}]`` for each ``MatMul``
    whose second input is a 2-D float32 initializer and whose scope is a ``linear`` module (the
    position-embedding interpolation, a MatMul by a graph input, is not one)."""
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for n in model.graph.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.data_type != 1:
            continue
        meta = {p.key: p.value for p in n.metadata_props}
        if "linear" not in meta.get("pkg.torch.onnx.name_scopes", "linear"):
            continue
        out.append({"node": n.name, "act": n.input[0], "weight": n.input[1], "unit": _unit(n, graph)})
    return out


def unit_names(sites: Sequence[dict]) -> list[str]:
    """Units in graph order, each once."""
    return list(dict.fromkeys(s["unit"] for s in sites))


def e4m3(x: np.ndarray) -> np.ndarray:
    """``x`` (already scaled) rounded to FLOAT8E4M3FN, saturated at +-448, as raw uint8 bytes."""
    import ml_dtypes

    return np.clip(x, -FP8_E4M3_MAX, FP8_E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _fp8_tensor(name: str, data: np.ndarray):
    from onnx import TensorProto, helper

    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(data.shape), e4m3(data).tobytes(), raw=True)


def qdq_model(model, amax: dict[str, float], keep_units: Sequence[str] = (), graph: str = "vision"):
    """A copy of ``model`` (weights loaded) with E4M3 Q/DQ around its linear layers (module
    docstring); units in ``keep_units`` stay fp32. The opset is raised to ``FP8_OPSET``.

    Raises:
        CertificationError: a linear layer's activation has no calibration figure.
    """
    from onnx import TensorProto, helper, numpy_helper

    m = copy.deepcopy(model)
    inits = {t.name: t for t in m.graph.initializer}
    nodes = {n.name: n for n in m.graph.node}
    new_nodes, zp = [], f"{graph}.fp8.zero"
    m.graph.initializer.append(helper.make_tensor(zp, TensorProto.FLOAT8E4M3FN, [], [0]))
    for s in linear_sites(model, graph):
        if s["unit"] in keep_units:
            continue
        if s["act"] not in amax:
            raise CertificationError(f"fp8: no calibration figure for {s['act']!r} (input of {s['node']})")
        n, tag = nodes[s["node"]], s["node"]
        w = numpy_helper.to_array(inits[s["weight"]]).astype(np.float32)
        ws = np.maximum(np.abs(w).max(axis=0), 1e-12).astype(np.float32) / np.float32(FP8_E4M3_MAX)
        xs = np.float32(max(float(amax[s["act"]]), 1e-12) / FP8_E4M3_MAX)
        m.graph.initializer.extend(
            [
                _fp8_tensor(f"{tag}.w_fp8", w / ws),
                numpy_helper.from_array(ws, f"{tag}.w_scale"),
                helper.make_tensor(f"{tag}.w_zero", TensorProto.FLOAT8E4M3FN, [int(ws.size)], [0] * int(ws.size)),
                numpy_helper.from_array(np.array(xs, np.float32), f"{tag}.x_scale"),
            ]
        )
        new_nodes.append(
            (
                n,
                [
                    helper.make_node(
                        "QuantizeLinear", [s["act"], f"{tag}.x_scale", zp], [f"{tag}.x_q"], name=f"{tag}.x_quant"
                    ),
                    helper.make_node(
                        "DequantizeLinear",
                        [f"{tag}.x_q", f"{tag}.x_scale", zp],
                        [f"{tag}.x_dq"],
                        name=f"{tag}.x_dequant",
                    ),
                    helper.make_node(
                        "DequantizeLinear",
                        [f"{tag}.w_fp8", f"{tag}.w_scale", f"{tag}.w_zero"],
                        [f"{tag}.w_dq"],
                        name=f"{tag}.w_dequant",
                        axis=1,
                    ),
                ],
            )
        )
        n.input[0], n.input[1] = f"{tag}.x_dq", f"{tag}.w_dq"
    _insert_before(m.graph, new_nodes)
    used = {i for n in m.graph.node for i in n.input}
    keep = [t for t in m.graph.initializer if t.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    for op in m.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, FP8_OPSET)
    m.ir_version = max(m.ir_version, 10)
    return m


def _insert_before(graph, pairs) -> None:
    """Put each list of new nodes right before its MatMul (the graph stays topologically sorted)."""
    before = {id(n): new for n, new in pairs}
    ordered = []
    for n in graph.node:
        ordered.extend(before.get(id(n), []))
        ordered.append(n)
    del graph.node[:]
    graph.node.extend(ordered)


# --------------------------------------------------------------------------- calibration


class _AmaxSpy:
    """Stands in for the scorer's vision runner: runs the graph with the linear layers' inputs as
    extra outputs and keeps each one's largest |x|."""

    def __init__(self, runner, session, acts: list[str]):
        self._runner, self._session, self._acts = runner, session, acts
        self.amax: dict[str, float] = {}

    def __getattr__(self, k):
        return getattr(self._runner, k)

    def run(self, feeds):
        names = list(self._runner.output_names) + self._acts
        outs = self._session.run(names, {k: feeds[k] for k in self._runner.input_names})
        for a, x in zip(self._acts, outs[len(self._runner.output_names) :]):
            self.amax[a] = max(self.amax.get(a, 0.0), float(np.abs(x).max()))
        return dict(zip(self._runner.output_names, outs))


def calibrate(bundle, pairs: Sequence, threads: int | None = None) -> dict[str, float]:
    """``{activation tensor: amax}`` of the vision tower's linear-layer inputs over ``pairs`` as the
    scorer runs them (portable graph, ONNX Runtime CPU, batch as masc-run batches)."""
    import onnx
    import onnxruntime as ort

    from ..runtime.scorer import Scorer

    path = bundle.graph_file("vision")
    model = onnx.load(str(path))
    acts = list(dict.fromkeys(s["act"] for s in linear_sites(model)))
    for a in acts:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(a))
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    scorer = Scorer(bundle, intra_op_threads=threads, graph_variant="portable")
    spy = scorer.vision = _AmaxSpy(scorer.vision, session, acts)
    scores(scorer, pairs)
    return spy.amax


# --------------------------------------------------------------------------- certification


def _portable(manifest: dict, vision_file: str, files: dict | None = None) -> dict:
    """A manifest whose vision graph is ``vision_file`` and which holds no fused variants."""
    graphs = {g: {k: v for k, v in e.items() if k != "variants"} for g, e in manifest["graphs"].items()}
    graphs["vision"] = {**graphs["vision"], "file": vision_file}
    graphs["vision"].pop("external_data", None)
    out = {k: v for k, v in manifest.items() if k != "variants"}
    return {**out, "graphs": graphs, "files": {**manifest["files"], **(files or {})}}


class Fp8Evaluator(CandidateScoring):
    """Scores pair sets with candidate FP8 vision graphs of one fp32 bundle, against fp32 ONNX
    Runtime on that bundle (the interface cpu_precision.search_keep_list drives)."""

    def __init__(self, bundle_dir: str | Path, amax: dict, workdir: Path, threads: int | None = None):
        import onnx

        from ..engine.bundle import Bundle

        self.bundle = Bundle(bundle_dir)
        self.model = onnx.load(str(self.bundle.graph_file("vision")))
        self.sites = linear_sites(self.model)
        self.unit_names = unit_names(self.sites)
        self.amax, self.workdir, self.threads = amax, Path(workdir), threads
        self.configurations, self._ref = 0, {}

    def candidate_scores(self, keep_fp32: Sequence[str], pairs: Sequence) -> dict:
        """Scores with the vision graph in FP8 except the units ``keep_fp32``."""
        import onnx

        from ..runtime.scorer import Scorer

        f = self.workdir / FP8_FILE
        onnx.save(qdq_model(self.model, self.amax, keep_fp32), str(f))
        b = copy.copy(self.bundle)
        b.path, b.verify = self.workdir, False
        b.manifest = _portable(self.bundle.manifest, FP8_FILE)
        return self.score_candidate(Scorer(b, intra_op_threads=self.threads, graph_variant="portable"), pairs)


def certify_fp8(
    bundle_dir: str | Path,
    out_dir: str | Path,
    *,
    calibration: str | Path | Sequence | None = None,
    heldout: str | Path | Sequence | None = None,
    threads: int | None = None,
    max_keep: int | None = None,
) -> dict:
    """Write an FP8 bundle ``out_dir`` from the fp32 bundle ``bundle_dir`` if its scores pass the
    gates against fp32 (module docstring), else refuse with the figures (nothing written).

    Args:
        bundle_dir: an fp32 bundle (masc-export).
        out_dir: the FP8 bundle to write (must not exist).
        calibration, heldout: pairs CSVs or Pair lists replacing cpu_precision's default sets;
            held-out needs ``FIDELITY_MIN_PAIRS`` pairs.
        max_keep: most units kept in fp32 (default half).

    Returns:
        The ``manifest["precision"]`` record written (mode ``fp8``).

    Raises:
        CertificationError: too few held-out pairs, or no plan passes (figures in the message).
        BundleError: not an fp32 bundle, or ``out_dir`` exists.
    """
    from ..engine.bundle import Bundle
    from ..engine.manifest import write_manifest
    from ..errors import BundleError
    from .cpu_precision import search_keep_list

    t0, out = time.time(), Path(out_dir)
    src = Bundle(bundle_dir)
    if src.precision != "fp32":
        raise BundleError(f"bundle {bundle_dir} holds {src.precision} graphs; fp8 is made from an fp32 bundle")
    if out.exists():
        raise BundleError(f"{out} exists; fp8 writes a new bundle")
    cal, cal_info = _pair_set(calibration, default_calibration)
    held, held_info = _pair_set(heldout, default_heldout)
    if len(held) < FIDELITY_MIN_PAIRS:
        raise CertificationError(
            f"fp8 needs at least {FIDELITY_MIN_PAIRS} held-out pairs for its gates to count; "
            f"{held_info['source']} has {len(held)}",
            {},
        )
    logger.info(f"fp8 calibration: {len(cal)} pairs ({cal_info['source']})")
    amax = calibrate(src, cal, threads)
    # a staging folder of its own (a fresh name beside out): a folder the user keeps under some
    # fixed name is never removed
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".fp8-stage", dir=out.parent))
    shutil.copytree(src.path, stage, dirs_exist_ok=True)
    try:
        ev = Fp8Evaluator(src.path, amax, stage, threads)
        found = search_keep_list(ev, cal, held, max_keep, mode="fp8")
        record = _write_fp8_bundle(stage, src.manifest, ev, found, amax)
        record.update(
            pairs={"calibration": {**cal_info, "pairs": len(cal)}, "heldout": {**held_info, "pairs": len(held)}},
            seconds=round(time.time() - t0, 1),
            configurations_scored=ev.configurations,
        )
        manifest = _read(stage)
        manifest["precision"] = record
        write_manifest(stage, manifest)
        stage.rename(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    logger.info(
        f"fp8 certified: {len(found['keep_fp32'])} units kept in fp32 {found['keep_fp32']}; held-out {_fmt(found['heldout'])}"
    )
    return record


def _read(path: Path) -> dict:
    from ..engine.manifest import read_manifest

    return read_manifest(path)


def _write_fp8_bundle(stage: Path, manifest: dict, ev: Fp8Evaluator, found: dict, amax: dict) -> dict:
    """The certified graph written (checked by onnx.checker), fused variants dropped, manifest files
    listed; returns the precision record."""
    import onnx

    from .cpu_precision import _summary
    from .exporter import _bundle_files, _drop_unreferenced_data

    model = qdq_model(ev.model, amax, found["keep_fp32"])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(stage / FP8_FILE))
    new = _portable(manifest, FP8_FILE)
    for f in stage.iterdir():
        if f.name.endswith(".ort-cpu.onnx") or f.name in (manifest["graphs"]["vision"]["file"],):
            f.unlink()
    _drop_unreferenced_data(stage, new["graphs"])
    new["files"] = _bundle_files(stage, new["graphs"])
    from ..engine.manifest import write_manifest

    write_manifest(stage, new)
    sites = [s for s in ev.sites if s["unit"] not in found["keep_fp32"]]
    return {
        "mode": FP8,
        "format": "FLOAT8E4M3FN explicit Q/DQ (opset %d)" % FP8_OPSET,
        "graphs": list(FP8_GRAPHS),
        "units": ev.unit_names,
        "keep_fp32": list(found["keep_fp32"]),
        "quantized_matmuls": len(sites),
        "activation_scales": {s["act"]: amax[s["act"]] / FP8_E4M3_MAX for s in sites},
        "weights": "per output channel (axis 1), amax / 448",
        "gates": {
            "calibration": _summary(found["calibration"]),
            "heldout": _summary(found["heldout"]),
            "thresholds": {
                "max_abs_delta": FIDELITY_MAX_ABS_DELTA,
                "min_spearman": FIDELITY_MIN_SPEARMAN,
                "min_pairs_heldout": FIDELITY_MIN_PAIRS,
            },
        },
        "reference": "fp32 ONNX Runtime CPU on the source bundle",
        "scored_on": "ONNX Runtime CPU (Q/DQ emulated)",
        "claim": "scores are certified to the gates against fp32; FP8 speed on a GPU is not measured",
    }
