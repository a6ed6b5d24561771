"""Segmenter time per image: masc-engine's torch-free Segmenter beside transformers' CLIPSeg, one run.

For each image of the set, the recipe's mask (runtime/segmenter.py) is computed:

- ``cold``: a prompt the segmenter has not seen (its text embedding goes through the text graph);
- ``cached``: a prompt already embedded (the masc-run case: one subject name, many images), so the
  time is preprocessing + vision + decoder + resize/threshold;
- the same steps timed apart (``stages``: preprocess, vision, text, decoder, postprocess);
- ``reference``: transformers ``CLIPSegProcessor`` + ``CLIPSegForImageSegmentation`` + sigmoid +
  Pillow (export/segmenter_reference.py) on the same images and prompts, batch 1, so the ratio
  ``reference / cached`` is side by side on one machine in one run.

The masks of both sides are compared in the same run (min IoU, pixels that differ, max |dprob|).
Default model: ``random:clipseg-rd64`` (the shapes of CIDAS/clipseg-rd64-refined, random weights);
the bundle is exported into ``--work`` unless ``--bundle`` is given. Timings mean something only on
an idle machine: the JSON records the machine, threads and settings.

    python bench/segmenter.py --out bench/results/segmenter_rd64.json
    python bench/segmenter.py --model random:clipseg-tiny --images 2 --repeats 1 --out /tmp/seg.json  # dry run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
PHOTO_DIRS = [REPO.parent / "shared" / "data" / "dreambooth" / "images", REPO / "examples" / "dreambooth" / "images"]


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
    return {"cold_s_per_image": statistics.median(cold), "cached_s_per_image": statistics.median(cached),
            "stages_s_per_image": {k: statistics.median(v) for k, v in stages.items()}}


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
    return {"min_iou": min(ious), "pixels_differing": differ, "pixels": int(sum(a.size for a in ours)),
            "max_abs_dprob": dprob}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random:clipseg-rd64")
    ap.add_argument("--bundle", default=None, help="an exported segmenter bundle (default: export --model into --work)")
    ap.add_argument("--work", default="/tmp/masc-bench-segmenter")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16"])
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (and torch's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    from masc_engine.export.segmenter import export_segmenter_bundle, load_segmenter
    from masc_engine.runtime.segmenter import Segmenter

    if args.threads:
        torch.set_num_threads(args.threads)
    bundle = Path(args.bundle) if args.bundle else Path(args.work) / f"{args.model.replace(':', '_')}-{args.precision}"
    if not (bundle / "manifest.json").is_file():
        export_segmenter_bundle(args.model, bundle, precision=args.precision, log=lambda s: print(s, file=sys.stderr))
    manifest = json.loads((bundle / "manifest.json").read_text())
    seg = Segmenter(bundle, intra_op_threads=args.threads)
    model, processor, _ = load_segmenter(manifest["source"]["model"])
    items = photos(args.images)
    res = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {"model": manifest["source"]["model"], "precision": seg.bundle.precision, "images": len(items),
                     "repeats": args.repeats, "threads": args.threads, "batch": 1,
                     "image_sizes": sorted({im.size for im, _ in items}), "recipe": seg.recipe.describe()},
        "ours": time_ours(seg, items, args.repeats),
        "reference": time_reference(model, processor, items, seg.recipe, args.repeats),
        "agreement": agreement(seg, model, processor, items, seg.recipe),
        "export_validation": {k: v.get("max_rel") for k, v in manifest.get("validation", {}).items() if "max_rel" in v},
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    res["ratio_reference_over_cached"] = res["reference"]["s_per_image"] / res["ours"]["cached_s_per_image"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("ours", "reference", "agreement", "ratio_reference_over_cached")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
