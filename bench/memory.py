"""Peak memory (RSS) of masc-run vs a loop over masc-metric's ``MaSC.score``: same rows, same run.

Workload (DreamBench-shaped, built from the shipped examples/dreambooth, so it runs in any clone):
each subject's photo 00 is the reference; for each of 6 prompts x 2 methods it is scored against a
*unique* output image (another photo of the subject, mirrored / cropped / colour-shifted
deterministically, its mask alike): 4 references, 48 pairs, 52 distinct images. Model: the
bundle's random-weight checkpoint (``random:base-naflex`` for the base shape) at a NaFlex
budget of ``--budget`` patches (256: base/256; 1024 with ``random:so400m-naflex``: so400m/1024).

Each side runs in its own child process, one after the other; its peak RSS is the kernel's
``ru_maxrss`` for that child (``os.wait4``), which includes loading the weights. masc-run runs in
several configurations (``--variants``) to show where the per-image memory goes.

    flock /tmp/masc-heavy.lock python bench/memory.py --bundle /tmp/masc-export-validation/base-naflex \\
        --budget 256 --out bench/results/memory_base256.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from workloads import dreambench_pairs  # noqa: E402

EXAMPLES = REPO / "examples" / "dreambooth"

#: masc-run configurations: name -> extra command-line options.
VARIANTS = {
    "default": [],
    "ort-arena": ["--ort-memory", "arena"],
    "batch-4": ["--batch-size", "4"],
    "batch-2": ["--batch-size", "2"],
    "batch-1": ["--batch-size", "1"],
    "arena-batch-1": ["--ort-memory", "arena", "--batch-size", "1"],
    "chunk-8": ["--chunk-size", "8"],
}

METRIC_LOOP = r"""
import csv, json, os, sys
import numpy as np
from PIL import Image
from masc import MaSC
pairs, ckpt, budget, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
base = pairs.rsplit("/", 1)[0]
m = MaSC(model_id=ckpt, device="cpu", naflex_max_patches=budget)
res = []
for r in csv.DictReader(open(pairs, encoding="utf-8")):
    im = lambda k: Image.open(os.path.join(base, r[k]))
    mk = lambda k: np.array(Image.open(os.path.join(base, r[k])).convert("L"))
    s = m.score(im("ref_image"), mk("ref_mask"), im("out_image"), mk("out_mask"), r["prompt"], r["object_name"])
    res.append([s.cp, s.pf])
json.dump(res, open(out, "w"))
"""


def peak_rss_mb(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` as a child; return (its peak RSS in MB, wall seconds). Fails loudly."""
    t = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{out[-3000:]}")
    return ru.ru_maxrss / 1024, time.time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--work", default="/tmp/masc-memory-bench")
    ap.add_argument("--no-metric", action="store_true", help="skip the masc-metric side (so400m: a second run)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import onnxruntime

    import masc_engine

    work = Path(args.work)
    subjects = sorted({r["identity"]: r["class"] for r in csv.DictReader(open(EXAMPLES / "gallery.csv"))}.items())
    pairs = dreambench_pairs(work, EXAMPLES, subjects, relative_outputs=True)  # 4 x 6 prompts x 2 methods = 48
    manifest = json.loads((Path(args.bundle) / "manifest.json").read_text())
    ckpt = manifest["source"]["checkpoint_dir"]
    arch = manifest["architecture"]
    from masc_engine.engine.bundle import Bundle

    b = Bundle(args.bundle, verify=False)
    variant = b.resolve_variant("auto", "onnxruntime", "cpu")  # what masc-run loads on CPU
    loaded = [b.graph_file(g, variant) for g in ("vision", "pool", "text", "cp")]
    weights_mb = (
        sum(
            f.stat().st_size + (Path(str(f) + ".data").stat().st_size if Path(str(f) + ".data").is_file() else 0)
            for f in loaded
        )
        / 2**20
    )
    record = {
        "what": "peak RSS (ru_maxrss of each child process) of masc-run vs a masc-metric MaSC.score loop, "
        "same 48 pairs, one run, same machine",
        "script": "bench/memory.py",
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1_5_15_start": list(os.getloadavg()),
            "note": "RSS is per process and not affected by other load; times are (see the load averages)",
        },
        "versions": {"masc_engine": masc_engine.__version__, "onnxruntime": onnxruntime.__version__},
        "model": f"{manifest['source'].get('model')} (width {arch['vision_width']}, {arch['vision_layers']} layers)",
        "budget": args.budget,
        "graph_variant": variant,
        "bundle_graph_mb": round(weights_mb, 1),  # the four graphs (and weights) a CPU run loads
        "workload": {"pairs": 48, "references": 4, "distinct_images": 52, "source": "examples/dreambooth"},
        "masc_run": {},
    }
    if not args.no_metric:
        import masc
        import torch
        import transformers

        record["versions"].update(
            masc_metric=getattr(masc, "__version__", "0.3.0"),
            torch=torch.__version__,
            transformers=transformers.__version__,
        )
        rss, sec = peak_rss_mb(
            [sys.executable, "-c", METRIC_LOOP, str(pairs), ckpt, str(args.budget), str(work / "metric.json")]
        )
        record["masc_metric"] = {"peak_rss_mb": round(rss, 1), "seconds": round(sec, 1)}
        print(f"masc-metric loop: {rss:.0f} MB", file=sys.stderr, flush=True)
        ref = json.loads((work / "metric.json").read_text())
    for name in [v for v in args.variants.split(",") if v]:  # --variants '': the masc-metric side only
        out = work / f"run-{name}.csv"
        for p in work.glob(f"run-{name}.csv*"):
            p.unlink()
        cmd = [
            sys.executable,
            "-m",
            "masc_engine.cli.run_cmd",
            str(pairs),
            "--bundle",
            args.bundle,
            "--max-num-patches",
            str(args.budget),
            "--out",
            str(out),
            "--no-progress",
            *VARIANTS[name],
        ]
        rss, sec = peak_rss_mb(cmd)
        entry = {"options": VARIANTS[name], "peak_rss_mb": round(rss, 1), "seconds": round(sec, 1)}
        if not args.no_metric:
            rows = list(csv.DictReader(open(out, encoding="utf-8")))
            entry["max_abs_dcp"] = max(abs(float(r["cp"]) - c) for r, (c, _) in zip(rows, ref, strict=True))
            entry["max_abs_dpf"] = max(abs(float(r["pf"]) - p) for r, (_, p) in zip(rows, ref, strict=True))
            entry["ratio_to_masc_metric"] = round(rss / record["masc_metric"]["peak_rss_mb"], 3)
        record["masc_run"][name] = entry
        print(f"masc-run {name}: {rss:.0f} MB", file=sys.stderr, flush=True)
    record["machine"]["loadavg_1_5_15_end"] = list(os.getloadavg())
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["masc_run"], indent=1))


if __name__ == "__main__":
    main()
