"""Mask downsampling vs ATen: the figure behind docs/fidelity.md and ``tolerances.MASK_GRID_ATOL``.

Every real mask (examples/dreambooth, and ../shared/data/dreambooth when present) on the 10 patch
grids of tests/test_masks.py, plus 300 random masks (binary uint8 and float, random sizes and
grids), downsampled by runtime/masks.py ``mask_to_patch_grid`` and by
``torch.nn.functional.interpolate(bilinear, align_corners=False)`` (what masc-metric 0.3.0 calls).
Records max |Delta| and the number of patches that flip across the 0.5 threshold.

    python bench/mask_downsampling.py --out bench/results/mask_downsampling.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench/results/mask_downsampling.json"))
    args = ap.parse_args()
    import torch
    from PIL import Image
    from support import EXAMPLES, SHARED
    from test_masks import GRIDS
    from test_masks import _reference as ref  # the reference's downsample, in torch

    import masc_engine
    from masc_engine.runtime.masks import DEFAULT_FG_THRESHOLD as T
    from masc_engine.runtime.masks import mask_to_patch_grid

    def compare(masks) -> dict:
        worst, flips, n = 0.0, 0, 0
        for m, grids in masks:
            for g in grids:
                r, o = ref(m, g), mask_to_patch_grid(m, g)
                worst = max(worst, float(np.abs(r - o).max()))
                flips += int(((r > T) != (o > T)).sum() + ((r >= T) != (o >= T)).sum())
                n += 1
        return {"comparisons": n, "max_abs": worst, "threshold_flips": flips}

    sets = {}
    for name, root in (("examples/dreambooth", EXAMPLES), ("shared/data/dreambooth", SHARED)):
        paths = sorted(root.glob("masks/*/*.png"))
        if paths:
            masks = [(np.array(Image.open(p).convert("L")), GRIDS) for p in paths]
            sets[name] = dict(compare(masks), masks=len(paths), grids=[list(g) for g in GRIDS])
    rng = np.random.default_rng(1)
    rand = []
    for i in range(300):
        h, w = (int(x) for x in rng.integers(1, 300, 2))
        g = tuple(int(x) for x in rng.integers(1, 48, 2))
        m = rng.random((h, w)).astype(np.float32) if i % 2 else (rng.random((h, w)) > 0.5).astype(np.uint8) * 255
        rand.append((m, [g]))
    sets["random (300: uint8 0/255 and float, sizes 1-299, grids 1-47)"] = compare(rand)
    record = {
        "what": "mask downsample, runtime/masks.py vs torch bilinear align_corners=False (masc-metric 0.3.0)",
        "script": "bench/mask_downsampling.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_1_5_15": list(os.getloadavg()),
            "note": "shared machine; figures are not timings",
        },
        "versions": {
            "python": platform.python_version(),
            "masc_engine": masc_engine.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
        },
        "sets": sets,
        "max_abs_overall": max(s["max_abs"] for s in sets.values()),
        "threshold_flips_overall": sum(s["threshold_flips"] for s in sets.values()),
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: (v["max_abs"], v["threshold_flips"]) for k, v in sets.items()}))


if __name__ == "__main__":
    main()
