#!/usr/bin/env python
"""fp16 / bf16 bundles against fp32 (and masc-metric 0.3.0) at scale, and fp16 vs fp32 speed on
ONNX Runtime CPU.

For one random-weight model (``random:tiny-naflex``, ``random:base-naflex``,
``random:so400m-naflex``) and patch budget, in one run:

1. exports the fp32 bundle (validated against PyTorch as always) and derives the fp16 and bf16
   bundles from it with the export's own precision transform (export/precision.py: ONNX
   Runtime's float16 converter under the fp32-island policy); bf16 graphs run **emulated** on
   ORT CPU (no bf16 kernels there): float32 ops on bf16-rounded values, every bf16 tensor rounded
   where it is produced (export/precision.py ``emulate_bf16``);
2. scores the shared DreamBooth pairs (``../shared/data/dreambooth/pairs.csv``, first ``--pairs``)
   and the NaFlex grid suite (8 patch grids incl. padding slots, 2 pairs each) with each bundle on
   ORT CPU, and with masc-metric 0.3.0 (fp32 torch, same weights) unless ``--no-oracle``;
3. reports, per reduced precision against fp32 (and against the oracle): per-pair max |dCP| and
   |dPF|, Spearman of CP and PF over all pairs, pooled-embedding cosine (the pooling head with
   nothing hidden) per image, patch-token cosine median and 0.1st percentile, NaN/Inf counts, and
   the gates of masc_engine/tolerances.py (pass/fail);
4. times the vision graph (the bulk of the cost) on the same preprocessed images for fp32 and
   fp16, alternating, and reports the fp16/fp32 time ratio.

Results are merged into ``bench/results/precision_fidelity.json`` under ``<model>@<budget>``,
with date, versions, machine and ``os.getloadavg()`` (this 2-core machine is shared).

    python bench/precision_fidelity.py --model random:tiny-naflex
    flock /tmp/masc-heavy.lock python bench/precision_fidelity.py --model random:base-naflex --budget 256
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
RESULTS = REPO / "bench" / "results" / "precision_fidelity.json"


def derive_bundle(fp32_dir: Path, precision: str, out: Path, emulate: bool = False) -> Path:
    """``out``: a copy of the fp32 bundle with its graphs converted by the export's precision
    transform (and, with ``emulate``, bf16 graphs replaced by their CPU emulation)."""
    from masc_engine.engine.manifest import read_manifest, write_manifest
    from masc_engine.export.precision import PrecisionTransform, emulated_bf16_file, policy

    shutil.copytree(fp32_dir, out)
    m = read_manifest(out)
    t = PrecisionTransform(precision)
    facts = {}
    for g in t.graphs:
        f = out / m["graphs"][g]["file"]
        tmp = f.with_name(f.name + ".tmp.onnx")
        facts[g] = t.apply(g, fp32_dir / m["graphs"][g]["file"], tmp)
        if emulate:
            emulated_bf16_file(tmp, f)
            tmp.unlink()
        else:
            tmp.replace(f)
    for p in out.glob("*.data"):  # external fp32 weights of replaced graphs (so400m)
        p.unlink()
    m["precision"] = {
        "mode": precision if not emulate else "fp32",
        "derived_for_bench": precision,
        "emulated": emulate,
        "policy": policy(),
    }
    m["files"] = [f for f in m["files"] if (out / f).exists()]
    write_manifest(out, m)
    return out


def spearman(a, b) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def compare(ref: dict, got: dict) -> dict:
    """Score and embedding agreement of ``got`` against ``ref`` (dicts from :func:`measure`)."""
    from masc_engine import tolerances as tol

    cp_r, cp_g, pf_r, pf_g = (np.asarray(x, np.float64) for x in (ref["cp"], got["cp"], ref["pf"], got["pf"]))
    ok_cp, ok_pf = np.isfinite(cp_r) & np.isfinite(cp_g), np.isfinite(pf_r) & np.isfinite(pf_g)
    d_cp, d_pf = np.abs(cp_g - cp_r)[ok_cp], np.abs(pf_g - pf_r)[ok_pf]
    out = {
        "pairs": int(len(cp_r)),
        "pairs_cp_defined": int(ok_cp.sum()),
        "pairs_pf_defined": int(ok_pf.sum()),
        "max_abs_dcp": float(d_cp.max()),
        "mean_abs_dcp": float(d_cp.mean()),
        "max_abs_dpf": float(d_pf.max()),
        "mean_abs_dpf": float(d_pf.mean()),
        "spearman_cp": spearman(cp_r[ok_cp], cp_g[ok_cp]),
        "spearman_pf": spearman(pf_r[ok_pf], pf_g[ok_pf]),
        "nan_where_ref_finite": int(
            (np.isnan(cp_g) & np.isfinite(cp_r)).sum() + (np.isnan(pf_g) & np.isfinite(pf_r)).sum()
        ),
        "inf": int(np.isinf(cp_g).sum() + np.isinf(pf_g).sum()),
    }
    gates = {
        "max_abs_delta": (max(out["max_abs_dcp"], out["max_abs_dpf"]), tol.FIDELITY_MAX_ABS_DELTA, "<="),
        "spearman": (min(out["spearman_cp"], out["spearman_pf"]), tol.FIDELITY_MIN_SPEARMAN, ">="),
    }
    if "pooled" in ref and "pooled" in got:
        a, b = np.asarray(ref["pooled"], np.float64), np.asarray(got["pooled"], np.float64)
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        out["pooled_cos_min"] = float(cos.min())
        gates["pooled_cosine"] = (out["pooled_cos_min"], tol.FIDELITY_MIN_EMBEDDING_COSINE, ">=")
        tc = np.concatenate(
            [
                (x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)
                for x, y in zip(ref["tokens"], got["tokens"])
            ]
        )
        out["token_cos_median"], out["token_cos_p001"] = float(np.median(tc)), float(np.quantile(tc, 0.001))
        gates["token_cosine_median"] = (out["token_cos_median"], tol.REDUCED_TOKEN_COSINE_MEDIAN, ">=")
        gates["token_cosine_p001"] = (out["token_cos_p001"], tol.REDUCED_TOKEN_COSINE_P001, ">=")
    out["gates"] = {
        k: {"value": v, "threshold": t, "pass": bool(v <= t if op == "<=" else v >= t)}
        for k, (v, t, op) in gates.items()
    }
    out["gates"]["finite"] = {"pass": out["nan_where_ref_finite"] == 0 and out["inf"] == 0}
    out["all_gates_pass"] = all(g["pass"] for g in out["gates"].values())
    return out


def measure(bundle: Path, pairs, images, budget: int) -> dict:
    """CP/PF per pair, and per distinct image its patch tokens and pooled embedding (nothing hidden)."""
    from masc_engine.runtime.scorer import Scorer

    sc = Scorer(bundle, naflex_max_patches=budget, batch_size=4)
    res = sc.score_batch(pairs)
    encs = sc.encode_images(images)
    pooled = [
        sc.pool.run({"hidden": e.tokens[None], "key_padding_mask": np.zeros((1, len(e.tokens)), bool)})["pooled"][0]
        for e in encs
    ]
    return {"cp": [r.cp for r in res], "pf": [r.pf for r in res], "tokens": [e.tokens for e in encs], "pooled": pooled}


def oracle_scores(ckpt: str, pairs, budget: int) -> dict:
    from masc import MaSC

    o = MaSC(model_id=ckpt, device="cpu", naflex_max_patches=budget)
    res = [o.score(p.ref_image, p.ref_mask, p.out_image, p.out_mask, p.prompt, p.object_name) for p in pairs]
    return {"cp": [r.cp for r in res], "pf": [r.pf for r in res]}


def time_vision(bundles: dict, images, budget: int, reps: int) -> dict:
    """Seconds per image of the vision graph, fp32 vs fp16, alternating runs on the same inputs."""
    from masc_engine.runtime.scorer import Scorer

    scs = {k: Scorer(b, naflex_max_patches=budget, batch_size=4) for k, b in bundles.items()}
    pre = [next(iter(scs.values())).preprocess(im) for im in images]
    for sc in scs.values():  # warm-up
        sc.encode_preprocessed(pre[:4])
    times = {k: [] for k in scs}
    for _ in range(reps):
        for k, sc in scs.items():
            t = time.perf_counter()
            sc.encode_preprocessed(pre)
            times[k].append((time.perf_counter() - t) / len(pre))
    out = {k: {"median_s_per_image": float(np.median(v)), "runs": v} for k, v in times.items()}
    if "fp32" in out and "fp16" in out:
        out["fp16_over_fp32_time"] = out["fp16"]["median_s_per_image"] / out["fp32"]["median_s_per_image"]
    return out


def grid_pairs(n_per_grid: int = 2):
    from support import blob_mask
    from test_preprocess import GRID_CASES

    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Pair

    pairs = []
    for gi, (_grid, _, size) in enumerate(GRID_CASES):
        for j in range(n_per_grid):
            s = 10 * gi + j
            pairs.append(
                Pair(
                    synthetic_image(size[0], size[1], s),
                    blob_mask(size[0], size[1], s + 1),
                    synthetic_image(size[1], size[0], s + 2),
                    blob_mask(size[1], size[0], s + 3, frac=0.2),
                    "a photo of a toy on a wooden floor",
                    "toy",
                )
            )
    return pairs


def main() -> None:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="random:tiny-naflex")
    ap.add_argument("--budget", type=int, default=1024, help="NaFlex patch budget")
    ap.add_argument("--pairs", type=int, default=158, help="first N shared pairs")
    ap.add_argument("--no-grid", action="store_true", help="skip the grid suite")
    ap.add_argument("--no-oracle", action="store_true", help="skip masc-metric (fp32 torch)")
    ap.add_argument("--timing-images", type=int, default=8)
    ap.add_argument("--timing-reps", type=int, default=3)
    ap.add_argument("--work-dir", default=None, help="keep bundles here (default: a temporary directory)")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import onnxruntime
    import torch
    import transformers

    from support import SHARED, load_pair, read_rows
    from masc_engine.export.exporter import export_bundle
    from masc_engine.runtime.scorer import Pair

    t_start = time.time()
    load_start = os.getloadavg()
    rows = read_rows(SHARED)[: a.pairs]
    shared = [Pair(*load_pair(SHARED, r)) for r in rows]
    seen, images = set(), []
    for r, p in zip(rows, shared):
        for key, im in ((r["ref_image"], p.ref_image), (r["out_image"], p.out_image)):
            if key not in seen:
                seen.add(key)
                images.append(im)
    suites = {"shared": shared}
    if not a.no_grid:
        suites["grid"] = grid_pairs()
    with tempfile.TemporaryDirectory(dir=a.work_dir) as tmp:
        tmp = Path(tmp)
        t = time.time()
        # Portable graphs only: precision is compared on the graphs TensorRT builds (fp32 vs fp16 on the
        # same ops), not against the fused ONNX Runtime CPU variant (export/fusion.py).
        b32 = export_bundle(a.model, tmp / "fp32", max_num_patches=a.budget, ort_cpu_variant=False)
        export_s = time.time() - t
        ckpt = json.loads((b32 / "manifest.json").read_text())["source"]["checkpoint_dir"]
        bundles = {
            "fp32": b32,
            "fp16": derive_bundle(b32, "fp16", tmp / "fp16"),
            "bf16-emulated": derive_bundle(b32, "bf16", tmp / "bf16emu", emulate=True),
        }
        meas = {}
        for name, b in bundles.items():
            t = time.time()
            meas[name] = {
                s: measure(b, pairs, images if s == "shared" else [], a.budget) for s, pairs in suites.items()
            }
            print(f"{name}: scored in {time.time() - t:.0f}s", flush=True)
        oracle = {}
        if not a.no_oracle:
            t = time.time()
            oracle = {s: oracle_scores(ckpt, pairs, a.budget) for s, pairs in suites.items()}
            print(f"oracle: scored in {time.time() - t:.0f}s", flush=True)
        timing = time_vision({"fp32": b32, "fp16": bundles["fp16"]}, images[: a.timing_images], a.budget, a.timing_reps)
    entry = {
        "model": a.model,
        "budget": a.budget,
        "note": a.note,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {
            "onnxruntime": onnxruntime.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
            "shared": "this machine is shared with other jobs; timings are noisy",
        },
        "inputs": {
            "shared_pairs": len(shared),
            "distinct_images": len(images),
            "grid_pairs": len(suites.get("grid", [])),
        },
        "bf16": "emulated on ORT CPU (no bf16 kernels): float32 ops, every bf16 tensor of the real bf16 graph "
        "rounded to bf16 where produced (export/precision.py emulate_bf16); the CP head stays fp32",
        "export_fp32_seconds": round(export_s, 1),
        "comparisons": {},
    }
    for prec in ("fp16", "bf16-emulated"):
        for s in suites:
            ref, got = meas["fp32"][s], meas[prec][s]
            if s != "shared":
                ref, got = {k: ref[k] for k in ("cp", "pf")}, {k: got[k] for k in ("cp", "pf")}
            entry["comparisons"][f"{prec}_vs_fp32/{s}"] = compare(ref, got)
            if oracle:
                entry["comparisons"][f"{prec}_vs_oracle/{s}"] = compare(oracle[s], {k: got[k] for k in ("cp", "pf")})
    if oracle:
        for s in suites:
            entry["comparisons"][f"fp32_vs_oracle/{s}"] = compare(
                oracle[s], {k: meas["fp32"][s][k] for k in ("cp", "pf")}
            )
    entry["ort_cpu_speed"] = {
        **timing,
        "what": f"vision graph, {a.timing_images} shared images, batch 4, median of {a.timing_reps} alternating runs",
    }
    entry["seconds"] = round(time.time() - t_start, 1)
    out = Path(a.out)
    allr = json.loads(out.read_text()) if out.is_file() else {"script": "bench/precision_fidelity.py", "runs": {}}
    allr["runs"][f"{a.model}@{a.budget}"] = entry
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(allr, indent=2, default=float) + "\n")
    summary = {
        k: {
            m: v.get(m)
            for m in ("max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf", "pooled_cos_min", "all_gates_pass")
        }
        for k, v in entry["comparisons"].items()
    }
    print(
        json.dumps(
            {"summary": summary, "speed": {k: v for k, v in timing.items() if not isinstance(v, dict)}},
            indent=1,
            default=float,
        )
    )


if __name__ == "__main__":
    main()
