"""The run-time gates over many random initialisations of a real shape: bf16-cpu and int8.

The bf16-cpu certification (export/cpu_precision.py ``certify_bundle``) and the int8 gates
(jobs/int8_gate.py ``quantize_bundle``) hold a user's checkpoint to fixed score gates
(tolerances.py: bf16-cpu max |dCP|, |dPF| <= ``FIDELITY_MAX_ABS_DELTA`` and Spearman >=
``FIDELITY_MIN_SPEARMAN`` on calibration and >= ``FIDELITY_MIN_PAIRS`` held-out pairs; int8
``INT8_MAX_ABS_DCP`` and ``INT8_MIN_SPEARMAN``). Whether a checkpoint passes depends on its
weights; one random initialisation says little. For each of ``--seeds`` initialisations of
``--shape`` (bench/tolerance_distributions.py ``build``: seeds from ``FIRST_SEED``, the families
``default`` and ``trained-like`` alternating), this script exports the fp32 bundle at the patch
budget ``--budget`` (masc-export's code, fp32 validation accepted whatever its figure: the gates
are measured here, not the export), then:

- certifies a copy for bf16-cpu with the default calibration and held-out sets and records the
  figures: the whole graph in bf16 on calibration, the units kept in fp32, the chosen plan's
  held-out figures and each gate's margin, or the refusal with its figures;
- quantizes a copy to int8 and scores ``--int8-pairs`` (default the shared DreamBooth pairs when
  present, else the shipped ones) with both bundles, recording the gate report (kept or refused);
- with ``--gates fp16``: exports the checkpoint with ``precision="fp16"`` (the GPU graphs) and
  records its export-time pair gates (export/validate.py ``validate_pairs``: max |dCP|, |dPF| <=
  ``FIDELITY_MAX_ABS_DELTA`` against the same export's fp32 graphs), kept or refused.

An embedder shape (export/random_models.py ``EMBEDDER_PRESETS``: CLIP, DINO, DINOv2) is
exported with export/embedders.py and certified the same way, on its image-image cosine (the CP
slot) and, for CLIP, its image-text cosine (the PF slot; export/cpu_precision.py
``EmbedderEvaluator``); int8 and fp16 do not apply to it.

A segmenter shape (``clipseg-tiny``, ``clipseg-tiny-3``, ``clipseg-rd64``) has one reduced-precision
gate, fp16's (``--gates fp16``): the checkpoint is exported with fp16 graphs by masc-export's code
(export/segmenter.py, the graphs' own validation accepted whatever its figure) and the mask IoU
gate of export/segmenter_validate.py ``validate_reduced_masks`` recorded, kept or refused: per
(image, prompt) case the IoU of the fp16 runtime's mask and transformers' fp32 mask at the
recipe's threshold, against ``tolerances.SEGMENTER_REDUCED_MIN_MASK_IOU``.

Per family (and ``all``): n, how many passed, and median / max of each figure. The results file
is rewritten after every initialisation (``--resume`` measures only the seeds it lacks).

    python bench/gate_distributions.py --shape base-naflex --budget 256 --seeds 10 \\
        --out bench/results/gate_distributions_base256.json
    python bench/gate_distributions.py --shape base-naflex --budget 256 --seeds 10 --gates fp16 \
        --out bench/results/gate_distributions_base256_fp16.json
    python bench/gate_distributions.py --shape tiny-naflex --seeds 2 --out /tmp/gates_tiny.json  # a check
    python bench/gate_distributions.py --shape clip-tiny --seeds 10 --gates bf16-cpu \
        --out bench/results/gate_distributions_embedders_tiny.json
    python bench/gate_distributions.py --shape clipseg-rd64 --seeds 10 --gates fp16 \
        --out bench/results/gate_distributions_clipseg_rd64_fp16.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
SHARED_PAIRS = REPO.parent / "shared" / "data" / "dreambooth" / "pairs.csv"
EXAMPLE_PAIRS = REPO / "examples" / "dreambooth" / "pairs.csv"
FIGURES = ("max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf")


def _gates(report: dict) -> dict:
    """A gate report's figures and margins (metrics/certification.py layout)."""
    return {k: report[k] for k in (*FIGURES, "pairs", "pass", "load") if k in report} | {
        "margins": report.get("margins", {})
    }


def bf16_cpu(bundle: Path, work: Path) -> dict:
    """Certify a copy of ``bundle`` for bf16-cpu (bench/workloads.py ``certified_copy``, nothing
    kept from an earlier initialisation); the figures, or the refusal's."""
    import workloads

    cert, info_path = work / "bf16cpu", work / "bf16cpu.json"
    info_path.unlink(missing_ok=True)
    full = workloads.certified_copy(bundle, cert, info_path)
    if full["certified"]:
        rec = full["record"]
        out = {
            "certified": True,
            "keep_fp32": rec["keep_fp32"],
            "whole_graph": _gates(rec["search"]["whole_graph"]),
            "calibration": _gates(rec["gates"]["calibration"]),
            "heldout": _gates(rec["gates"]["heldout"]),
        }
    else:
        out = {
            "certified": False,
            "refusal": full["refused"],
            "whole_graph": _gates(full["report"].get("whole_graph", {})),
        }
    out["seconds"] = round(full["certify_seconds"], 1)
    shutil.rmtree(cert, ignore_errors=True)
    info_path.unlink(missing_ok=True)
    return out


def int8(bundle: Path, work: Path, pairs: Path) -> dict:
    """Quantize a copy of ``bundle`` to int8 and gate it on ``pairs``; the gate report."""
    from masc_engine.jobs.int8_gate import Int8GateError, quantize_bundle

    out_dir = work / "int8"
    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.time()
    try:
        rep = quantize_bundle(bundle, out_dir, pairs)
        kept = True
    except Int8GateError as e:
        rep, kept = e.report, False
    shutil.rmtree(out_dir, ignore_errors=True)
    figs = {k: v for k, v in rep.items() if isinstance(v, (int, float, bool))}
    return {"kept": kept, **figs, "margins": rep.get("margins", {}), "seconds": round(time.time() - t0, 1)}


def fp16(ckpt: Path, work: Path, budget: int | None) -> dict:
    """Export ``ckpt`` with fp16 graphs; its pair gates' figures (kept) or the refusal's."""
    from masc_engine.errors import ExportValidationError
    from masc_engine.export.exporter import export_bundle
    from masc_engine.export.validate import accept_validation_error
    from tolerance_distributions import ACCEPT_ALL

    out = work / "fp16"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.time()
    try:
        # the graphs' own validation accepted whatever its figure: the pair gates are measured here
        with accept_validation_error(ACCEPT_ALL), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_bundle(str(ckpt), out, max_num_patches=budget, precision="fp16")
        rep, kept, why = json.loads((out / "manifest.json").read_text())["precision"]["pair_gates"], True, {}
    except ExportValidationError as e:
        # a refusal before the pair gates (a graph's own fp16 check) has no pair figures: its
        # message names the check, the figure and the budget
        rep, kept, why = e.report, False, {"refusal": str(e)}
    shutil.rmtree(out, ignore_errors=True)
    figs = {k: rep[k] for k in ("max_abs_dcp", "max_abs_dpf", "pairs", "finite_where_fp32_finite") if k in rep}
    return {"kept": kept, **figs, **why, "seconds": round(time.time() - t0, 1)}


def measure(
    shape: str, seed: int, family: str, budget: int | None, work: Path, pairs: Path, gates: tuple[str, ...]
) -> dict:
    """One initialisation: the gates asked for (bf16-cpu and int8 share one fp32 export)."""
    from masc_engine.export.exporter import export_bundle
    from masc_engine.export.validate import accept_validation_error
    from tolerance_distributions import ACCEPT_ALL, build

    from masc_engine.export.random_models import EMBEDDER_PRESETS

    ckpt = build(shape, seed, family, work)
    row: dict = {"shape": shape, "seed": seed, "family": family}
    if shape in EMBEDDER_PRESETS:
        return _embedder_row(ckpt, work, row, gates)
    if shape.startswith("clipseg"):
        return _segmenter_row(ckpt, work, row, gates)
    if "fp16" in gates:
        row["fp16"] = fp16(ckpt, work, budget)
    if {"bf16-cpu", "int8"} & set(gates):
        bundle = work / (ckpt.name + ".bundle")
        t0 = time.time()
        with accept_validation_error(ACCEPT_ALL), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_bundle(str(ckpt), bundle, max_num_patches=budget)
        row["export_seconds"] = round(time.time() - t0, 1)
        if "bf16-cpu" in gates:
            row["bf16_cpu"] = bf16_cpu(bundle, work)
        if "int8" in gates:
            row["int8"] = int8(bundle, work, pairs)
        shutil.rmtree(bundle, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return row


def _embedder_row(ckpt: Path, work: Path, row: dict, gates: tuple[str, ...]) -> dict:
    """An embedder initialisation: its fp32 bundle (export/embedders.py, validation accepted
    whatever its figure) certified for bf16-cpu; int8 and fp16 are not embedder paths."""
    from masc_engine.export.embedders import export_embedder_bundle
    from masc_engine.export.validate import accept_validation_error
    from tolerance_distributions import ACCEPT_ALL

    if set(gates) - {"bf16-cpu"}:
        raise SystemExit(f"an embedder shape has the bf16-cpu gates only, not {sorted(set(gates) - {'bf16-cpu'})}")
    bundle = work / (ckpt.name + ".bundle")
    shutil.rmtree(bundle, ignore_errors=True)
    t0 = time.time()
    with accept_validation_error(ACCEPT_ALL), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_embedder_bundle(str(ckpt), bundle)
    row["export_seconds"] = round(time.time() - t0, 1)
    row["bf16_cpu"] = bf16_cpu(bundle, work)
    shutil.rmtree(bundle, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return row


def _segmenter_row(ckpt: Path, work: Path, row: dict, gates: tuple[str, ...]) -> dict:
    """A segmenter initialisation: its fp16 export's gates, kept or refused, with the figures;
    fp16 is the segmenter's only reduced-precision path. A graph refused by its per-graph fp16
    gate is recorded and the export goes on (here only), so that the masks' IoU of every
    initialisation is measured: ``kept`` is what masc-export decides (every gate passed)."""
    from masc_engine.errors import ExportValidationError
    from masc_engine.export import segmenter_validate as sv
    from masc_engine.export.segmenter import export_segmenter_bundle
    from masc_engine.export.validate import accept_validation_error
    from tolerance_distributions import ACCEPT_ALL

    if set(gates) != {"fp16"}:
        raise SystemExit(f"a segmenter shape has the fp16 gate only (--gates fp16), not {sorted(gates)}")
    out = work / (ckpt.name + ".fp16")
    shutil.rmtree(out, ignore_errors=True)
    graph_refusals: list[dict] = []
    validate_graph = sv.validate_graph

    def recording(graph, *args, **kwargs):  # the fp32 checks run under ACCEPT_ALL: never raise
        try:
            return validate_graph(graph, *args, **kwargs)
        except ExportValidationError as e:
            rep = e.report or {}
            graph_refusals.append({"graph": graph, **{k: rep[k] for k in ("rule", "cos_min") if k in rep}})
            return rep

    t0 = time.time()
    sv.validate_graph = recording
    try:
        with accept_validation_error(ACCEPT_ALL), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            export_segmenter_bundle(str(ckpt), out, precision="fp16")
        rep, masks_pass = json.loads((out / "manifest.json").read_text())["precision"]["masks"], True
    except ExportValidationError as e:
        rep, masks_pass = e.report, False
    finally:
        sv.validate_graph = validate_graph
    ious = [float(x) for x in rep["ious"]]
    row["fp16"] = {
        "kept": masks_pass and not graph_refusals,
        "graph_gates_refused": graph_refusals,
        "masks_pass": masks_pass,
        "min_iou": min(ious),
        "median_iou": statistics.median(ious),
        "cases": len(ious),
        "min_iou_gate": rep["min_iou_gate"],
        "margin": min(ious) - rep["min_iou_gate"],
        "seconds": round(time.time() - t0, 1),
    }
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return row


def _stats(vals: list[float]) -> dict:
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else {}


def summarise(rows: list[dict]) -> dict:
    """Per family and ``all``: counts passed and the spread of every figure."""
    out: dict = {}
    for family in ["all", *dict.fromkeys(r["family"] for r in rows)]:
        fam = [r for r in rows if family in ("all", r["family"])]
        s: dict = {"n": len(fam)}
        b = [r["bf16_cpu"] for r in fam if "bf16_cpu" in r]
        if b:
            s["bf16_cpu_certified"] = sum(x["certified"] for x in b)
            s["bf16_cpu_units_kept"] = _stats([len(x["keep_fp32"]) for x in b if x["certified"]])
            for part in ("whole_graph", "heldout"):
                for f in FIGURES:
                    s[f"bf16_cpu_{part}_{f}"] = _stats([x[part][f] for x in b if f in x.get(part, {})])
        for gate, figs in (
            ("int8", ("max_abs_dcp", "spearman_cp", "spearman_pf")),
            ("fp16", ("max_abs_dcp", "max_abs_dpf", "min_iou", "median_iou")),
        ):
            g = [r[gate] for r in fam if gate in r]
            if g:
                s[f"{gate}_kept"] = sum(x["kept"] for x in g)
                for f in figs:
                    if any(f in x for x in g):
                        s[f"{gate}_{f}"] = _stats([x[f] for x in g if f in x])
        out[family] = s
    return out


def _cpu() -> dict:
    """The CPU a row was measured on: its model and the bf16 ISA OpenVINO can use."""
    import workloads

    m = workloads.machine(())
    flags = m.get("isa_flags", {})
    return {"cpu": m.get("cpu"), "amx_bf16": bool(flags.get("amx_bf16")), "avx512_bf16": bool(flags.get("avx512_bf16"))}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO / "bench"))
    import workloads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny-naflex")
    ap.add_argument("--budget", type=int, default=None, help="NaFlex patch budget (default: the export's, 1024)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--families", default="default,trained-like")
    ap.add_argument("--gates", default="bf16-cpu,int8", help="comma-separated: bf16-cpu, int8, fp16")
    ap.add_argument("--int8-pairs", type=Path, default=SHARED_PAIRS if SHARED_PAIRS.is_file() else EXAMPLE_PAIRS)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gate-distributions"))
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    from tolerance_distributions import FIRST_SEED

    families = a.families.split(",")
    rows = json.loads(a.out.read_text())["runs"] if a.resume and a.out.is_file() else []
    done = {(r["seed"], r["family"]) for r in rows}
    a.work.mkdir(parents=True, exist_ok=True)
    for i in range(a.seeds):
        seed, family = FIRST_SEED + i, families[i % len(families)]
        if (seed, family) in done:
            continue
        rows.append(measure(a.shape, seed, family, a.budget, a.work, a.int8_pairs, tuple(a.gates.split(","))))
        # --resume may continue on another machine kind: bf16 kernels differ (AMX or AVX512_BF16),
        # so each row names the CPU its figures came from.
        rows[-1]["machine"] = _cpu()
        print(json.dumps(rows[-1])[:400], flush=True)
        result = {
            "script": "bench/gate_distributions.py",
            "command": " ".join([sys.executable, *sys.argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": workloads.machine(("onnxruntime", "openvino", "torch", "transformers")),
            "note": a.note or "not stated",
            "shape": a.shape,
            "budget": a.budget,
            "gates": a.gates,
            "int8_pairs": str(a.int8_pairs),
            "summary": summarise(rows),
            "runs": rows,
        }
        a.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
