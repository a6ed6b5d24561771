#!/usr/bin/env python
"""The fp16 path command by command: an fp16 bundle of a base-shaped random SigLIP2 checkpoint,
scored by ``masc-run`` on real photos of odd sizes, against masc-metric 0.3.0 (fp32 torch, same
weights).

    masc-export --model <checkpoint dir> --out B --max-num-patches 256 --precision fp16
    python bench/precision_cli_check.py --bundle B [--pairs 20]

Builds the odd-sized pairs from ../shared/data/dreambooth (each photo and mask cropped and resized
to one of six odd sizes), runs ``masc-run PAIRS --bundle B --out F`` as a subprocess, scores the
same files with masc-metric 0.3.0 on the bundle's source checkpoint at the bundle's budget, and
writes ``bench/results/precision_cli_check.json``: the share of fp16 initializer elements in
vision.onnx, per-pair max |dCP| and |dPF| (gate 2e-3, tolerances.FIDELITY_MAX_ABS_DELTA),
Spearman of CP and PF, date, versions, machine and load average.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from workloads import odd_size_pairs  # noqa: E402

SHARED = REPO.parent / "shared" / "data" / "dreambooth"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "precision_cli_check.json"))
    a = ap.parse_args()
    from scipy.stats import spearmanr

    from masc import MaSC

    from masc_engine.export.precision import initializer_dtypes
    from masc_engine.tolerances import FIDELITY_MAX_ABS_DELTA

    bundle = Path(a.bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with open(SHARED / "pairs.csv", newline="", encoding="utf-8-sig") as f:
            shared_rows = list(csv.DictReader(f))[: a.pairs]
        pairs_csv, rows = odd_size_pairs(shared_rows, SHARED, tmp)
        t = time.time()
        subprocess.run(
            ["masc-run", str(pairs_csv), "--bundle", str(bundle), "--out", str(tmp / "scores.csv"), "--no-progress"],
            check=True,
        )
        run_s = time.time() - t
        with open(tmp / "scores.csv", newline="", encoding="utf-8") as f:
            ours = list(csv.DictReader(f))
        ckpt = m["source"].get("checkpoint_dir") or m["source"]["model"]  # random preset, or the local dir
        oracle = MaSC(model_id=ckpt, device="cpu", naflex_max_patches=int(m["image"]["max_num_patches"]))
        t = time.time()
        ref = [
            oracle.score(
                Image.open(tmp / r["ref_image"]),
                np.array(Image.open(tmp / r["ref_mask"])),
                Image.open(tmp / r["out_image"]),
                np.array(Image.open(tmp / r["out_mask"])),
                r["prompt"],
                r["object_name"],
            )
            for r in rows
        ]
        oracle_s = time.time() - t
    cp = np.array([float(o["cp"]) if o["cp"] not in ("", "nan") else np.nan for o in ours])
    pf = np.array([float(o["pf"]) if o["pf"] not in ("", "nan") else np.nan for o in ours])
    cp_r, pf_r = np.array([r.cp for r in ref]), np.array([r.pf for r in ref])
    ok_cp, ok_pf = np.isfinite(cp) & np.isfinite(cp_r), np.isfinite(pf) & np.isfinite(pf_r)
    dt = initializer_dtypes(bundle / "vision.onnx")
    total = sum(c["elements"] for c in dt.values())
    res = {
        "script": "bench/precision_cli_check.py",
        "note": a.note,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "bundle": {
            "model": m["source"]["model"],
            "precision": m["precision"]["mode"],
            "max_num_patches": m["image"]["max_num_patches"],
            "export_seconds": m.get("export_seconds"),
            "vision_fp16_weight_fraction": dt.get("float16", {}).get("elements", 0) / total,
            "export_pair_gates": m["precision"].get("pair_gates"),
        },
        "pairs": len(rows),
        "undefined_cp_both": int((~np.isfinite(cp) & ~np.isfinite(cp_r)).sum()),
        "nan_mismatch": int(
            (np.isfinite(cp) != np.isfinite(cp_r)).sum() + (np.isfinite(pf) != np.isfinite(pf_r)).sum()
        ),
        "max_abs_dcp": float(np.abs(cp - cp_r)[ok_cp].max()),
        "max_abs_dpf": float(np.abs(pf - pf_r)[ok_pf].max()),
        "spearman_cp": float(spearmanr(cp[ok_cp], cp_r[ok_cp]).statistic),
        "spearman_pf": float(spearmanr(pf[ok_pf], pf_r[ok_pf]).statistic),
        "gate": FIDELITY_MAX_ABS_DELTA,
        "masc_run_seconds": round(run_s, 1),
        "oracle_seconds": round(oracle_s, 1),
        "versions": {"python": platform.python_version()},
        "machine": {
            "cores": os.cpu_count(),
            "loadavg_start": load0,
            "loadavg_end": os.getloadavg(),
            "shared": "2-core machine shared with other jobs",
        },
    }
    res["within_gate"] = res["max_abs_dcp"] <= FIDELITY_MAX_ABS_DELTA and res["max_abs_dpf"] <= FIDELITY_MAX_ABS_DELTA
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=1))
    sys.exit(0 if res["within_gate"] and res["nan_mismatch"] == 0 else 1)


if __name__ == "__main__":
    main()
