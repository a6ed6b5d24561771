"""Cost of ``masc-run --save-maps``: the same pairs scored with and without it, paired and
alternating (the order flips every repetition), each run a fresh ``masc-run`` process writing to a
fresh folder (no ``--cache-dir``). Reports per-pair milliseconds of each (process wall time, and
the job's own ``seconds`` from the output's metadata, which leaves out start-up and model loading)
and the median of the per-repetition ratios (with maps / without).

Without ``--bundle`` a random-weight tiny bundle is exported into a temporary folder first
(``masc-export --model random:tiny-naflex``), so the figure measures the pipeline, not SigLIP2's
compute: with a larger model the forward passes take a larger share and the ratio is smaller.

    python bench/save_maps_cost.py --reps 5 --out bench/results/save_maps_cost.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAIRS = REPO / "examples" / "dreambooth" / "pairs.csv"
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def machine() -> dict:
    """CPU model, cores and the ISA flags that decide ONNX Runtime's kernels (from /proc/cpuinfo)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def one_run(bundle: Path, pairs: Path, work: Path, maps: bool, extra: list[str]) -> dict:
    """One ``masc-run`` process; returns its wall seconds and the job's own seconds."""
    shutil.rmtree(work, ignore_errors=True)
    out = work / "scores.csv"
    cmd = [
        sys.executable,
        "-m",
        "masc_engine.cli.run_cmd",
        str(pairs),
        "--bundle",
        str(bundle),
        "--out",
        str(out),
        *extra,
        *(["--save-maps", str(work / "maps")] if maps else []),
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=pairs.parent)
    wall = time.perf_counter() - t0
    meta = json.loads(Path(str(out) + ".meta.json").read_text())
    return {"maps": maps, "wall_s": round(wall, 3), "job_s": meta["seconds"]}


def export_tiny(folder: Path) -> Path:
    """A random-weight tiny NaFlex bundle in ``folder/tiny`` (``masc-export``, about a minute)."""
    out = folder / "tiny"
    subprocess.run(
        [sys.executable, "-m", "masc_engine.cli.export_cmd", "--model", "random:tiny-naflex", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def summary(runs: list[dict], n_pairs: int) -> dict:
    """Medians of per-pair ms (wall and job) for each setting and of the paired ratios."""
    plain = [r for r in runs if not r["maps"]]
    maps = [r for r in runs if r["maps"]]
    med = statistics.median
    return {
        "pairs": n_pairs,
        "per_pair_ms_without": {
            k[:-2]: round(1000 * med(r[k] for r in plain) / n_pairs, 1) for k in ("wall_s", "job_s")
        },
        "per_pair_ms_with": {k[:-2]: round(1000 * med(r[k] for r in maps) / n_pairs, 1) for k in ("wall_s", "job_s")},
        "median_ratio_wall": round(med(m["wall_s"] / p["wall_s"] for p, m in zip(plain, maps)), 2),
        "median_ratio_job": round(med(m["job_s"] / p["job_s"] for p, m in zip(plain, maps)), 2),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, default=None, help="bundle folder; default: export random:tiny-naflex")
    ap.add_argument("--pairs", type=Path, default=PAIRS)
    ap.add_argument("--reps", type=int, default=5, help="paired repetitions (each runs both settings)")
    ap.add_argument("--provider", default=None, help="masc-run --provider (default: masc-run's)")
    ap.add_argument("--out", default=None, help="JSON record to write (bench/results/...)")
    args = ap.parse_args(argv)
    extra = ["--provider", args.provider] if args.provider else []
    pairs = args.pairs.resolve()
    with pairs.open(newline="", encoding="utf-8") as f:
        n_pairs = sum(1 for _ in csv.DictReader(f))
    with tempfile.TemporaryDirectory(prefix="save-maps-cost-") as tmp:
        tmp = Path(tmp)
        bundle = (args.bundle or export_tiny(tmp)).resolve()
        runs = []
        for rep in range(args.reps):
            for maps in (False, True) if rep % 2 == 0 else (True, False):
                runs.append({"rep": rep, **one_run(bundle, pairs, tmp / "run", maps, extra)})
                print(runs[-1], flush=True)
        manifest = json.loads((bundle / "manifest.json").read_text())
    res = summary(runs, n_pairs)
    print(json.dumps(res, indent=2))
    if args.out:
        from importlib.metadata import version

        Path(args.out).write_text(
            json.dumps(
                {
                    "script": "bench/save_maps_cost.py",
                    "command": shlex.join([sys.executable, *sys.argv]),
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "machine": machine(),
                    "versions": {p: version(p) for p in ("masc-engine", "onnxruntime", "numpy", "pillow")},
                    "settings": {
                        "pairs_file": str(pairs.relative_to(REPO)) if pairs.is_relative_to(REPO) else str(pairs),
                        "bundle": str(args.bundle or "random:tiny-naflex (exported into a temporary folder)"),
                        "bundle_source": manifest.get("source"),
                        "reps": args.reps,
                        "extra_args": extra,
                        "order": "alternating: even repetitions without maps first, odd with maps first",
                    },
                    "result": res,
                    "runs": runs,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
