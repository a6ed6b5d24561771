"""CPU throughput: masc-run vs a loop over masc-metric's ``MaSC.score``, same rows, same run.

Workload (DreamBench-shaped, built from ../shared/data/dreambooth): each subject's photo 00 is the
reference; for each of P prompts x M methods it is scored against a *unique* output image (another
photo of the subject, flipped / cropped / colour-shifted deterministically per prompt and method,
its mask transformed alike). Model: random-weight SigLIP2 of base shape (``random:base-naflex``:
width 768, 12 layers), NaFlex budget 256 patches. Cold cache for masc-run (no persistent cache).

Each side runs in its own child process (so peak RSS is its own), one after the other on the
same machine. Reports pairs/s, the ratio, peak RSS, and the score differences between the two.
Optionally (``--int8``) the same for an int8 bundle and its gates.

Run (from the repo root, in the test venv made by scripts/setup_env.sh --test):
    python bench/cpu_throughput.py --out bench/results/cpu_throughput.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "dreambooth"
PROMPTS = ["a {} in the jungle", "a {} on the beach", "a {} with a city in the background",
           "a {} floating on top of water", "a red {}", "a {} in the snow"]


def build_workload(work: Path, prompts: int, methods: int) -> Path:
    from PIL import Image, ImageEnhance, ImageOps

    out_dir = work / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    subjects = list(csv.DictReader(open(SHARED / "subjects.csv")))
    rows = []
    for s in subjects:
        name, cls = s["subject"], s["class"]
        photos = sorted((SHARED / "images" / name).glob("*.jpg"))[1:]
        for p in range(prompts):
            for m in range(methods):
                src = photos[(p * methods + m) % len(photos)]
                im = Image.open(src).convert("RGB")
                mask = Image.open(SHARED / "masks" / name / (src.stem + ".png")).convert("L")
                k = p * methods + m
                if k % 2:
                    im, mask = ImageOps.mirror(im), ImageOps.mirror(mask)
                w, h = im.size
                c = 4 + 6 * (k % 5)
                box = (c, c // 2, w - c // 2, h - c)
                im, mask = im.crop(box), mask.crop(box)
                im = ImageEnhance.Color(im).enhance(0.8 + 0.1 * (k % 4))
                stem = f"{name}_p{p}_m{m}"
                im.save(out_dir / f"{stem}.jpg", quality=92)
                mask.save(out_dir / f"{stem}.png")
                rows.append({"key": stem, "subject": name, "method": f"method{m}",
                             "ref_image": str(SHARED / "images" / name / "00.jpg"),
                             "ref_mask": str(SHARED / "masks" / name / "00.png"),
                             "out_image": str(out_dir / f"{stem}.jpg"), "out_mask": str(out_dir / f"{stem}.png"),
                             "prompt": PROMPTS[p % len(PROMPTS)].format(cls), "object_name": cls})
    path = work / "pairs.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def child_masc_run(bundle: str, pairs: str, out: str, batch_size: int) -> dict:
    import resource
    import warnings

    warnings.simplefilter("ignore")
    from masc_engine.jobs.pairs import run_pairs
    from masc_engine.jobs.results import read_output
    from masc_engine.runtime.scorer import Scorer

    t = time.perf_counter()
    s = run_pairs(pairs, Scorer(bundle, batch_size=batch_size), out, progress=False)
    dt = time.perf_counter() - t
    rows = read_output(out)
    return {"seconds": dt, "pairs": s.rows, "images_encoded": s.images_encoded,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cp": [float(r["cp"]) for r in rows], "pf": [float(r["pf"]) for r in rows]}


def child_masc_metric(checkpoint: str, pairs: str, budget: int) -> dict:
    import resource
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    import torch
    from masc import MaSC
    from PIL import Image

    m = MaSC(model_id=checkpoint, device="cpu", naflex_max_patches=budget)
    rows = list(csv.DictReader(open(pairs)))
    cps, pfs = [], []
    t = time.perf_counter()
    for r in rows:
        res = m.score(Image.open(r["ref_image"]), np.array(Image.open(r["ref_mask"]).convert("L")),
                      Image.open(r["out_image"]), np.array(Image.open(r["out_mask"]).convert("L")),
                      r["prompt"], r["object_name"])
        cps.append(res.cp)
        pfs.append(res.pf)
    dt = time.perf_counter() - t
    return {"seconds": dt, "pairs": len(rows), "torch_threads": torch.get_num_threads(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cp": cps, "pf": pfs}


def run_child(fn: str, *args) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {str(REPO / 'bench')!r}); import cpu_throughput as b; "
            f"print('RESULT' + json.dumps(b.{fn}(*{args!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def machine() -> dict:
    cpu = "unknown"
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    import onnxruntime
    import torch
    import transformers

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(REPO / "out" / "bench-cpu"))
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--methods", type=int, default=2)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--int8", action="store_true", help="also quantize and time an int8 bundle")
    ap.add_argument("--int8-only", action="store_true",
                    help="reuse the fp32 figures already in --out and only run the int8 part")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_throughput.json"))
    a = ap.parse_args()
    import numpy as np

    from masc_engine.export.exporter import export_bundle

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    pairs = build_workload(work, a.prompts, a.methods)
    bundle = work / f"base-naflex-{a.budget}"
    if not (bundle / "manifest.json").is_file():
        export_bundle("random:base-naflex", bundle, max_num_patches=a.budget, log=lambda s: print(s, flush=True))
    checkpoint = json.loads((bundle / "manifest.json").read_text())["source"]["checkpoint_dir"]
    if a.int8_only:
        result = json.loads(Path(a.out).read_text())
        ours = {"seconds": result["masc_run"]["seconds"]}
        return _int8(a, result, bundle, pairs, work, ours)
    ours = run_child("child_masc_run", str(bundle), str(pairs), str(work / "scores.csv"), a.batch_size)
    ref = run_child("child_masc_metric", checkpoint, str(pairs), a.budget)
    d_cp = np.abs(np.array(ours["cp"]) - np.array(ref["cp"]))
    d_pf = np.abs(np.array(ours["pf"]) - np.array(ref["pf"]))
    result = {
        "machine": machine(), "model": "random:base-naflex (width 768, 12 layers)", "budget": a.budget,
        "workload": {"pairs": ours["pairs"], "references": 30, "prompts": a.prompts, "methods": a.methods,
                     "distinct_images": ours["images_encoded"]},
        "masc_run": {"seconds": ours["seconds"], "pairs_per_s": ours["pairs"] / ours["seconds"],
                     "peak_rss_mb": ours["peak_rss_mb"], "batch_size": a.batch_size,
                     "onnxruntime_threads": "default (all cores)"},
        "masc_metric": {"seconds": ref["seconds"], "pairs_per_s": ref["pairs"] / ref["seconds"],
                        "peak_rss_mb": ref["peak_rss_mb"], "torch_threads": ref["torch_threads"]},
        "speedup": ref["seconds"] / ours["seconds"],
        "scores": {"max_abs_dcp": float(np.nanmax(d_cp)), "max_abs_dpf": float(np.nanmax(d_pf))},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")  # fp32 figures first, int8 below
    if a.int8:
        return _int8(a, result, bundle, pairs, work, ours)
    print(json.dumps(result, indent=2))


def _int8(a, result, bundle, pairs, work, ours) -> None:
    """Quantize, gate, and time the int8 bundle (timed even when refused, labelled as such)."""
    from masc_engine.jobs.int8_gate import Int8GateError, quantize_bundle

    int8 = work / f"base-naflex-{a.budget}-int8"
    refused = work / f"base-naflex-{a.budget}-int8-refused"
    try:
        gate = quantize_bundle(bundle, int8, SHARED / "pairs.csv", log=lambda s: print(s, flush=True),
                               keep_refused_at=refused)
        entry, timed = {"gates": gate, "accepted": True}, int8
    except Int8GateError as e:
        entry = {"accepted": False, "refused": str(e), "gates": e.report,
                 "note": "refused by its gates on these random weights; timed for reference only"}
        timed = refused
    q = run_child("child_masc_run", str(timed), str(pairs), str(work / "scores-int8.csv"), a.batch_size)
    entry.update(pairs_per_s=q["pairs"] / q["seconds"], seconds=q["seconds"],
                 speedup_vs_fp32=ours["seconds"] / q["seconds"], peak_rss_mb=q["peak_rss_mb"])
    result["int8"] = entry
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
