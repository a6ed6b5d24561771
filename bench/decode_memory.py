"""Peak memory of decoding and reducing one file (runtime/io.py decoding, then the reduction of
jobs/items.py: preprocessing at a 1,024-patch budget, or a mask's coverage and grid weights),
against what ``jobs.items.reservation`` reserves for it: each case runs in a fresh child
process, whose ``VmHWM`` (reset just before decoding) minus ``VmRSS`` is the peak.

    python bench/decode_memory.py --size 6000 --out bench/results/decode_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import io, sys
import numpy as np
from PIL import Image
kind, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
arr = np.zeros((n, n, 3) if mode == "RGB" else (n, n), np.uint16 if mode == "I;16" else np.uint8)
b = io.BytesIO(); Image.fromarray(arr).save(b, "PNG"); data = b.getvalue(); del arr
from masc_engine.runtime.io import open_image, image_from_opened, mask_from_opened
from masc_engine.jobs.items import reservation
from masc_engine.runtime.masks import mask_coverage, mask_to_patch_grid
from masc_engine.runtime.preprocess import ImageSettings, preprocess_image
s = ImageSettings("naflex", 16, 1024, None, "bilinear", 1 / 255, (0.5,) * 3, (0.5,) * 3)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")
base = status("VmRSS")
im = open_image(data, "x", kind)
cost = reservation(im, kind, s)
if kind == "image":
    rgb, notes = image_from_opened(im, "x")
    pre = preprocess_image(rgb, s)
else:
    m = mask_from_opened(im, "x")
    c, w = mask_coverage(m), mask_to_patch_grid(m, (32, 32))
print(status("VmHWM") - base, cost)
"""

CASES = [("image", "RGB"), ("image", "L"), ("mask", "L"), ("mask", "RGB"), ("image", "I;16"), ("mask", "I;16")]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=6000, help="side of the square test files, pixels")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for kind, mode in CASES:
        n = args.size if mode != "I;16" else int(args.size * 2 / 3)
        out = subprocess.run(
            [sys.executable, "-c", CHILD, kind, mode, str(n)],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
        ).stdout
        peak, cost = map(int, out.split())
        rows.append(
            {
                "kind": kind,
                "mode": mode,
                "side": n,
                "peak_mb": round(peak / 2**20, 1),
                "reserved_mb": round(cost / 2**20, 1),
                "peak_bytes_per_pixel": round(peak / n / n, 2),
                "within_bound": peak <= cost,
            }
        )
        print(rows[-1])
    if args.out:
        from importlib.metadata import version

        Path(args.out).write_text(
            json.dumps(
                {
                    "script": "bench/decode_memory.py",
                    "command": shlex.join([sys.executable, *sys.argv]),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "machine": {
                        "cpu": platform.processor() or platform.machine(),
                        "cores": os.cpu_count(),
                        "platform": platform.platform(),
                        "python": platform.python_version(),
                    },
                    "versions": {p: version(p) for p in ("masc-engine", "pillow", "numpy")},
                    "cases": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if all(r["within_bound"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
