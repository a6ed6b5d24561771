"""Fidelity against the oracle: max |dCP| and |dPF| between masc-engine and masc-metric 0.3.0.

Same random weights on both sides (the tiny NaFlex and tiny fixed-size test models), every row of
examples/dreambooth/pairs.csv (shipped) and of ../shared/data/dreambooth/pairs.csv (when present
beside the checkout), plus the NaFlex grid suite of tests/test_preprocess.py. The record holds the
date, the versions and the machine.
The tests assert these stay within tolerances.ORACLE_SCORE_ATOL; this script records the figures.

    python bench/oracle_fidelity.py --out bench/results/oracle_fidelity.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "oracle_fidelity.json"))
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import masc
    import onnxruntime
    import torch
    import transformers

    import masc_engine
    from support import EXAMPLES, SHARED, blob_mask, load_pair, read_rows
    from masc import MaSC as Oracle
    from test_preprocess import GRID_CASES

    from masc_engine.export.exporter import export_bundle
    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Pair, Scorer

    def delta(a_, b_):
        if math.isnan(a_) or math.isnan(b_):
            assert math.isnan(a_) and math.isnan(b_), (a_, b_)
            return 0.0
        return abs(a_ - b_)

    sets = {"examples_pairs": EXAMPLES}
    if (SHARED / "pairs.csv").is_file():
        sets["shared_pairs"] = SHARED
    result = {
        "reference": "masc-metric 0.3.0",
        "script": "bench/oracle_fidelity.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_1_5_15": list(os.getloadavg()),
            "note": "shared machine; the figures are score differences, not timings",
        },
        "versions": {
            "python": platform.python_version(),
            "masc_engine": masc_engine.__version__,
            "masc_metric": getattr(masc, "__version__", "0.3.0"),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        "pairs": {k: len(read_rows(v)) for k, v in sets.items()},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("naflex", "fixed"):
            bundle = export_bundle(f"random:tiny-{kind}", Path(tmp) / kind)
            ckpt = json.loads((bundle / "manifest.json").read_text())["source"]["checkpoint_dir"]
            ref = Oracle(model_id=ckpt, device="cpu")
            entry = {}
            for set_name, root in sets.items():
                rows = read_rows(root)
                ours = Scorer(bundle).score_batch([Pair(*load_pair(root, r)) for r in rows])
                d_cp, d_pf, nan = 0.0, 0.0, 0
                for r, o in zip(rows, ours, strict=True):
                    x = ref.score(*load_pair(root, r))
                    d_cp, d_pf = max(d_cp, delta(o.cp, x.cp)), max(d_pf, delta(o.pf, x.pf))
                    nan += math.isnan(x.cp) or math.isnan(x.pf)
                entry[set_name] = {"max_abs_dcp": d_cp, "max_abs_dpf": d_pf, "undefined_on_both_sides": nan}
            if kind == "naflex":
                g_cp = g_pf = 0.0
                for _grid, budget, size in GRID_CASES:
                    args = (
                        synthetic_image(size[0], size[1], 1),
                        blob_mask(size[0], size[1], 3),
                        synthetic_image(size[1], size[0], 2),
                        blob_mask(size[1], size[0], 4, frac=0.2),
                        "a photo of a toy on a wooden floor",
                        "toy",
                    )
                    o = Scorer(bundle, naflex_max_patches=budget).score(*args)
                    x = Oracle(model_id=ckpt, device="cpu", naflex_max_patches=budget).score(*args)
                    g_cp, g_pf = max(g_cp, delta(o.cp, x.cp)), max(g_pf, delta(o.pf, x.pf))
                entry["grid_suite"] = {
                    "grids": [list(g) for g, _, _ in GRID_CASES],
                    "max_abs_dcp": g_cp,
                    "max_abs_dpf": g_pf,
                }
            result[f"tiny-{kind}"] = entry
            print(kind, json.dumps(entry), flush=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
