"""Segmenter cost: per image beside transformers' CLIPSeg, and whole masc-run jobs with file masks
beside the same jobs with the segmenter's masks, side by side in one run.

Part ``image`` (per image). For each image of the set, the recipe's mask (runtime/segmenter.py) is
computed:

- ``cold``: a prompt the segmenter has not seen (its text embedding goes through the text graph);
- ``cached``: a prompt already embedded (the masc-run case: one subject name, many images), so the
  time is preprocessing + vision + decoder + resize/threshold;
- the same steps timed apart (``stages``: preprocess, vision, text, decoder, postprocess);
- ``reference``: transformers ``CLIPSegProcessor`` + ``CLIPSegForImageSegmentation`` + sigmoid +
  Pillow (export/segmenter_reference.py) on the same images and prompts, batch 1, so the ratio
  ``reference / cached`` is side by side on one machine in one run.

The masks of both sides are compared in the same run (min IoU, pixels that differ, max |dprob|).

Part ``job`` (the whole job). The DreamBench-shaped workload (bench/workloads.py
``dreambench_pairs``: per subject photo ``00`` as the reference of ``--prompts`` x ``--methods``
unique outputs, so each reference is shared by every prompt of its subject) is scored by
``masc-run`` as a user runs it, each run a cold whole process timed from spawn to exit:

- ``file_masks``: the pairs file with its mask columns;
- ``segmenter``: the same pairs without mask columns, ``--segmenter`` (masks from the subject name);

each first with an empty ``--cache-dir`` (``cold``) and then again on the same one (``warm``: the
SigLIP2 encodings and, with the segmenter, the masks come from the store). The sidecars' counters
show each reference segmented once (``masks_segmented`` = distinct images, ``mask_cache_hits`` on
the warm run, no segmenter image encoded then); the ratios ``segmenter / file_masks`` per cache
state are the cost of not supplying masks. Peak RSS is each process's own (``VmHWM`` at exit). Each repetition
(``--job-repeats``) uses fresh cache folders; medians are reported.

Default models: ``random:clipseg-rd64`` (the shapes of CIDAS/clipseg-rd64-refined, random weights)
and, for the job, ``random:base-naflex`` at a 256-patch budget (the bench/cpu_throughput.py job's
scorer); the bundles are exported into ``--work`` unless given. Timings mean something only on an
idle machine: the JSON records the machine, versions, threads and settings.

    python bench/segmenter.py --out bench/results/segmenter_rd64.json
    python bench/segmenter.py --model random:clipseg-tiny --scorer random:tiny-naflex --images 2 --repeats 1 \
        --references 2 --prompts 2 --methods 1 --work /tmp/seg-bench --out /tmp/seg.json       # dry run
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from workloads import dreambench_pairs, write_pairs_csv  # noqa: E402

PHOTO_SETS = [REPO.parent / "shared" / "data" / "dreambooth", REPO / "examples" / "dreambooth"]
PHOTO_DIRS = [d / "images" for d in PHOTO_SETS]


def photos(n: int) -> list[tuple[Image.Image, str]]:
    """``n`` (image, subject name) spread over the shared DreamBooth photos if present, else the
    shipped ones."""
    root = next(d for d in PHOTO_DIRS if d.is_dir())
    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    paths = paths[:: max(1, len(paths) // max(n, 1))][:n]
    return [(Image.open(p).convert("RGB"), p.parent.name.rstrip("0123456789")) for p in paths]


def _median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def time_ours(seg, items, repeats: int) -> dict:
    """Per-image seconds (median over images of the median over repeats), cold and cached prompt."""
    from masc_engine.runtime.preprocess import preprocess_image
    from masc_engine.runtime.segmenter import mask_from_logits

    seg.segment([items[0][0]], [items[0][1]])  # warm-up: sessions and allocators
    cold, cached, stages = [], [], {k: [] for k in ("preprocess", "vision", "text", "decoder", "postprocess")}
    for i, (im, name) in enumerate(items):
        fresh = iter(f"{name} {i} {r}" for r in range(repeats))
        cold.append(_median_s(lambda: seg.segment([im], [next(fresh)]), repeats))
        seg.segment([im], [name])
        cached.append(_median_s(lambda: seg.segment([im], [name]), repeats))
        px = preprocess_image(im, seg.image_settings).pixel_values[None]
        stages["preprocess"].append(_median_s(lambda: preprocess_image(im, seg.image_settings), repeats))
        acts = seg.vision.run({"pixel_values": px})["activations"]
        stages["vision"].append(_median_s(lambda: seg.vision.run({"pixel_values": px}), repeats))
        ids = np.stack([seg.tokenizer.encode([name])[0].input_ids])
        stages["text"].append(_median_s(lambda: seg.text.run({"input_ids": ids}), repeats))
        cond = seg.text.run({"input_ids": ids})["conditional_embeddings"]
        feeds = {"activations": acts, "conditional_embeddings": cond}
        logits = seg.decoder.run(feeds)["logits"][0]
        stages["decoder"].append(_median_s(lambda: seg.decoder.run(feeds), repeats))
        stages["postprocess"].append(_median_s(lambda: mask_from_logits(logits, im.size, seg.recipe), repeats))
    return {
        "cold_s_per_image": statistics.median(cold),
        "cached_s_per_image": statistics.median(cached),
        "stages_s_per_image": {k: statistics.median(v) for k, v in stages.items()},
    }


def time_reference(model, processor, items, recipe, repeats: int) -> dict:
    from masc_engine.export.segmenter_reference import reference_masks

    reference_masks(model, processor, [items[0][0]], [items[0][1]], recipe)  # warm-up
    per = [_median_s(lambda: reference_masks(model, processor, [im], [name], recipe), repeats) for im, name in items]
    return {"s_per_image": statistics.median(per)}


def agreement(seg, model, processor, items, recipe) -> dict:
    """Masks and probabilities of both sides on the same items (export/segmenter_validate.py IoU)."""
    from masc_engine.export.segmenter_reference import reference_probabilities
    from masc_engine.export.segmenter_validate import mask_iou
    from masc_engine.runtime.segmenter import threshold_mask

    images, names = [im for im, _ in items], [n for _, n in items]
    ours = seg.probabilities(images, names)
    ref = reference_probabilities(model, processor, images, names, recipe)
    ious, differ, dprob = [], 0, 0.0
    for a, b in zip(ours, ref):
        ma, mb = threshold_mask(a, recipe.threshold) > 0, threshold_mask(b, recipe.threshold) > 0
        ious.append(mask_iou(ma, mb))
        differ += int(np.count_nonzero(ma != mb))
        dprob = max(dprob, float(np.abs(a - b).max()))
    return {
        "min_iou": min(ious),
        "pixels_differing": differ,
        "pixels": int(sum(a.size for a in ours)),
        "max_abs_dprob": dprob,
    }


# ----------------------------------------------------------------------------- the whole job


def subjects(photo_set: Path) -> list[tuple[str, str]]:
    """``(subject folder, class noun)`` of a photo set: its ``subjects.csv`` (the shared set), else
    the ``subject`` / ``object_name`` columns of its ``pairs.csv`` (the shipped examples)."""
    if (photo_set / "subjects.csv").is_file():
        with open(photo_set / "subjects.csv", newline="") as f:
            return [(r["subject"], r["class"]) for r in csv.DictReader(f)]
    with open(photo_set / "pairs.csv", newline="") as f:
        return list(dict.fromkeys((r["subject"], r["object_name"]) for r in csv.DictReader(f)))


#: masc-run's own entry point in a fresh interpreter, which writes its peak RSS (``VmHWM``: this
#: process's own, where ``wait4``'s ``ru_maxrss`` would report the bench's RSS at fork) at exit.
MASC_RUN = """import atexit, os, sys
def _peak():
    with open(os.environ["MASC_BENCH_PEAK"], "w") as f:
        f.write([ln for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0].split()[1])
atexit.register(_peak)
from masc_engine.cli.run_cmd import main
sys.argv[0] = "masc-run"
sys.exit(main())
"""


def masc_run(pairs: Path, out: Path, args: list[str]) -> dict:
    """``masc-run pairs --out out *args`` in a fresh process: its wall seconds (spawn to exit), peak
    RSS and its sidecar's seconds and counters."""
    for p in (out, Path(f"{out}.meta.json")):
        p.unlink(missing_ok=True)
    log, peak = out.with_suffix(".log"), out.with_suffix(".peak")
    with open(log, "w") as f:
        t = time.perf_counter()
        res = subprocess.run(
            [sys.executable, "-c", MASC_RUN, str(pairs), "--out", str(out), "--no-progress", *args],
            stdout=f,
            stderr=f,
            env={**os.environ, "MASC_BENCH_PEAK": str(peak)},
        )
        wall = time.perf_counter() - t
    if res.returncode:
        raise RuntimeError(f"masc-run failed:\n{log.read_text()[-4000:]}")
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    return {
        "whole_process_s": wall,
        "in_run_s": meta["seconds"],
        "peak_rss_mb": int(peak.read_text()) / 1024,
        "counts": {k: v for k, v in meta["counts"].items() if k in _COUNTS},
    }


_COUNTS = (
    "rows",
    "ok",
    "images_encoded",
    "cache_hits",
    "masks_segmented",
    "mask_cache_hits",
    "segmenter_images_encoded",
)


def _scores(path: Path) -> list[tuple]:
    from masc_engine.jobs.results import read_output

    return [(r["status"], r["cp"], r["pf"]) for r in read_output(path)]


def job_once(work: Path, scorer: Path, segmenter: Path, pairs: Path, no_masks: Path, common: list[str]) -> dict:
    """One repetition: file masks and the segmenter, each cold then warm, fresh cache folders."""
    runs, same = {}, {}
    for side, csv_path, extra in (("file_masks", pairs, []), ("segmenter", no_masks, ["--segmenter", str(segmenter)])):
        cache = work / f"cache-{side}"
        shutil.rmtree(cache, ignore_errors=True)
        for state in ("cold", "warm"):
            runs[f"{side}_{state}"] = masc_run(
                csv_path,
                work / f"{side}-{state}.csv",
                ["--bundle", str(scorer), "--cache-dir", str(cache), *common, *extra],
            )
        same[side] = _scores(work / f"{side}-cold.csv") == _scores(work / f"{side}-warm.csv")
        shutil.rmtree(cache, ignore_errors=True)
    return {"runs": runs, "warm_scores_identical_to_cold": same}


def part_job(a, work: Path, segmenter: Path) -> dict:
    """The whole job, file masks beside the segmenter (module docstring, part ``job``)."""
    import numpy as np

    from masc_engine.export.exporter import export_bundle

    photo_set = next(d for d in PHOTO_SETS if (d / "pairs.csv").is_file())
    work.mkdir(parents=True, exist_ok=True)
    pairs = dreambench_pairs(work, photo_set, subjects(photo_set)[: a.references], a.prompts, a.methods)
    with open(pairs, newline="") as f:
        rows = list(csv.DictReader(f))
    no_masks = write_pairs_csv(
        work / "pairs_no_masks.csv", [{k: v for k, v in r.items() if k not in ("ref_mask", "out_mask")} for r in rows]
    )
    scorer = Path(a.scorer_bundle) if a.scorer_bundle else work / f"{a.scorer.replace(':', '_')}-{a.budget}"
    if not (scorer / "manifest.json").is_file():
        export_bundle(a.scorer, scorer, max_num_patches=a.budget)
    common = ["--batch-size", str(a.batch_size)] + (["--threads", str(a.threads)] if a.threads else [])
    reps = [job_once(work, scorer, segmenter, pairs, no_masks, common) for _ in range(a.job_repeats)]
    med = {
        k: {
            m: float(np.median([r["runs"][k][m] for r in reps])) for m in ("whole_process_s", "in_run_s", "peak_rss_mb")
        }
        for k in reps[0]["runs"]
    }
    for k in med:
        med[k]["counts"] = reps[-1]["runs"][k]["counts"]
        med[k]["pairs_per_s_whole_process"] = len(rows) / med[k]["whole_process_s"]
    images = {r["ref_image"] for r in rows} | {r["out_image"] for r in rows}
    return {
        "scorer": {"model": json.loads((scorer / "manifest.json").read_text())["source"]["model"], "budget": a.budget},
        "workload": {
            "photos": os.path.relpath(photo_set, REPO),
            "pairs": len(rows),
            "references": len({r["ref_image"] for r in rows}),
            "prompts": a.prompts,
            "methods": a.methods,
            "distinct_images": len(images),
            "masks_a_pairwise_run_would_segment": 2 * len(rows),
        },
        "settings": {"masc_run": common, "repeats": a.job_repeats, "statistic": "median over repeats"},
        "runs": med,
        "ratio_segmenter_over_file_masks": {
            s: {m: med[f"segmenter_{s}"][m] / med[f"file_masks_{s}"][m] for m in ("whole_process_s", "in_run_s")}
            for s in ("cold", "warm")
        },
        "warm_scores_identical_to_cold": {
            k: all(r["warm_scores_identical_to_cold"][k] for r in reps) for k in ("file_masks", "segmenter")
        },
    }


def machine() -> dict:
    """Where it ran (timings are affected by other load: the load averages are recorded)."""
    from importlib.metadata import version

    cpu = platform.processor() or platform.machine()
    try:
        cpu = [ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "versions": {
            p: version(p)
            for p in ("masc-engine", "onnxruntime", "numpy", "pillow", "tokenizers", "torch", "transformers")
        },
    }


def part_image(args, bundle: Path) -> dict:
    """Per image, ours beside the transformers reference (module docstring, part ``image``)."""
    import torch

    from masc_engine.export.segmenter import load_segmenter
    from masc_engine.runtime.segmenter import Segmenter

    if args.threads:
        torch.set_num_threads(args.threads)
    manifest = json.loads((bundle / "manifest.json").read_text())
    seg = Segmenter(bundle, intra_op_threads=args.threads)
    model, processor, _ = load_segmenter(manifest["source"]["model"])
    items = photos(args.images)
    res = {
        "settings": {
            "precision": seg.bundle.precision,
            "images": len(items),
            "repeats": args.repeats,
            "threads": args.threads,
            "batch": 1,
            "image_sizes": sorted({im.size for im, _ in items}),
            "recipe": seg.recipe.describe(),
        },
        "ours": time_ours(seg, items, args.repeats),
        "reference": time_reference(model, processor, items, seg.recipe, args.repeats),
        "agreement": agreement(seg, model, processor, items, seg.recipe),
        "export_validation": {k: v.get("max_rel") for k, v in manifest.get("validation", {}).items() if "max_rel" in v},
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    res["ratio_reference_over_cached"] = res["reference"]["s_per_image"] / res["ours"]["cached_s_per_image"]
    return res


def main(argv: list[str] | None = None) -> int:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="image,job", help="comma list of: image, job")
    ap.add_argument("--model", default="random:clipseg-rd64")
    ap.add_argument("--bundle", default=None, help="an exported segmenter bundle (default: export --model into --work)")
    ap.add_argument("--work", default="/tmp/masc-bench-segmenter")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    ap.add_argument("--images", type=int, default=16, help="image part: photos")
    ap.add_argument("--repeats", type=int, default=3, help="image part: timed repetitions per image")
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (and torch's)")
    ap.add_argument("--scorer", default="random:base-naflex", help="job part: the SigLIP2 model of the scorer bundle")
    ap.add_argument("--scorer-bundle", default=None, help="job part: a scorer bundle (default: export --scorer)")
    ap.add_argument("--budget", type=int, default=256, help="job part: the scorer's NaFlex patch budget")
    ap.add_argument("--references", type=int, default=8, help="job part: subjects (one reference each)")
    ap.add_argument("--prompts", type=int, default=3, help="job part: prompts per subject")
    ap.add_argument("--methods", type=int, default=2, help="job part: methods per prompt")
    ap.add_argument("--batch-size", type=int, default=8, help="job part: masc-run --batch-size")
    ap.add_argument("--job-repeats", type=int, default=1, help="job part: repetitions (fresh caches each)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts or parts - {"image", "job"}:
        ap.error(f"--parts: image and/or job, got {args.parts!r}")
    warnings.filterwarnings("ignore")
    from masc_engine.export.segmenter import export_segmenter_bundle

    work = Path(args.work)
    bundle = Path(args.bundle) if args.bundle else work / f"{args.model.replace(':', '_')}-{args.precision}"
    if not (bundle / "manifest.json").is_file():
        export_segmenter_bundle(args.model, bundle, precision=args.precision)
    res = {
        "script": "bench/segmenter.py",
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "settings": {
            "model": json.loads((bundle / "manifest.json").read_text())["source"]["model"],
            "precision": args.precision,
            "threads": args.threads,
        },
    }
    res["versions"] = res["machine"].pop("versions")
    if "image" in parts:
        res["image"] = part_image(args, bundle)
    if "job" in parts:
        res["job"] = part_job(args, work / "job", bundle)
    res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    shown = (
        {k: res["image"][k] for k in ("ours", "reference", "agreement", "ratio_reference_over_cached")}
        if "image" in res
        else {}
    )
    if "job" in res:
        shown["job"] = {
            k: res["job"][k]
            for k in ("workload", "runs", "ratio_segmenter_over_file_masks", "warm_scores_identical_to_cold")
        }
    print(json.dumps(shown, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
