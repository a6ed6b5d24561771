"""Our pixels vs transformers' torchvision-backed SigLIP / SigLIP2 image processors, and the score
difference that follows.

Our preprocessing (``masc_engine.runtime.preprocess``) is a port of transformers 5.24.0's
*PIL-backed* processors (``Siglip2ImageProcessorPil``, ``SiglipImageProcessorPil``). A default
``masc-metric`` install pulls torchvision, and then ``AutoProcessor`` gives the *torchvision-backed*
``Siglip2ImageProcessor`` / ``SiglipImageProcessor`` (``TorchvisionBackend``: ``tvF.resize`` on a
uint8 tensor with antialias, fused rescale+normalize in float32). This script measures how far
apart the two are, on the 158 DreamBooth photos in ``shared/data/dreambooth`` and on resized
copies of them (the photos are all 512x512, which is exactly the NaFlex budget-1024 and the
fixed-512 target size, so as they are no resize happens at those settings), then scores the 158
pairs of ``pairs.csv`` with masc-metric 0.3.0 on the random-weight tiny models, once with the
processor it loads (torchvision) and once with the PIL one swapped in (what our engine
reproduces).

It needs torch + torchvision, which the project's own test venv does not have (masc-metric is
installed there ``--no-deps`` beside a CPU torch), so it runs in a separate virtualenv::

    python3 -m venv /work/venv-tv
    /work/venv-tv/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers==5.24.0 \\
        onnxruntime tokenizers pillow numpy click tqdm
    /work/venv-tv/bin/pip install --no-deps -e .          # this repo (masc_engine)
    /work/venv-tv/bin/pip install --no-deps masc-metric==0.3.0
    /work/venv-tv/bin/python bench/pixels_vs_torchvision.py \\
        --data /work/shared/data/dreambooth --out bench/results

Writes ``pixels_vs_torchvision.txt`` (what it printed) and ``pixels_vs_torchvision.json`` (every
figure) under ``--out``. CPU only; about 6 minutes on 2 busy cores (most of it scoring 12 x 158 pairs).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np
from PIL import Image

# Sizes the resized copies are made at (width, height), photo i gets SIZES[i % len(SIZES)]:
# generator outputs (SDXL / FLUX 1024^2, SD 768^2, SDXL aspect buckets), camera-like 4:3, an odd
# aspect ratio, and a small image that NaFlex upscales.
SIZES = [(1024, 1024), (768, 768), (1216, 832), (832, 1216), (640, 480), (480, 640), (700, 433), (300, 300)]
LEVEL = 127.5  # one uint8 level in normalized units (mean = std = 0.5): 1 / (255 * 0.5)


def log_factory(lines: list[str]):
    def log(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    return log


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    def v(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "absent"

    return {
        "cpu": cpu,
        "cores_visible": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": {
            k: v(k) for k in ("torch", "torchvision", "transformers", "pillow", "numpy", "masc-metric", "masc-engine")
        },
    }


def naflex_settings(budget: int):
    from masc_engine.runtime.preprocess import ImageSettings

    return ImageSettings(
        mode="naflex",
        patch_size=16,
        max_num_patches=budget,
        image_size=None,
        resample="bilinear",
        rescale_factor=1 / 255,
        image_mean=(0.5,) * 3,
        image_std=(0.5,) * 3,
    )


def fixed_settings(size: int):
    from masc_engine.runtime.preprocess import ImageSettings

    return ImageSettings(
        mode="fixed",
        patch_size=16,
        max_num_patches=(size // 16) ** 2,
        image_size=(size, size),
        resample="bilinear",
        rescale_factor=1 / 255,
        image_mean=(0.5,) * 3,
        image_std=(0.5,) * 3,
    )


def summarize(
    diffs: list[np.ndarray], per_image_flip: list[int], shapes_equal: list[bool], resized: list[bool]
) -> dict:
    """|Δ pixel_values| over every value of every valid patch, pooled over images."""
    d = np.concatenate([x.ravel() for x in diffs]).astype(np.float64)
    flips = d * LEVEL >= 0.5  # a different uint8 value after the resize
    return {
        "images": len(diffs),
        "images_resized": int(sum(resized)),
        "spatial_shapes_equal": f"{sum(shapes_equal)}/{len(shapes_equal)}",
        "values_compared": int(d.size),
        "max_norm": float(d.max()),
        "mean_norm": float(d.mean()),
        "p99_norm": float(np.percentile(d, 99)),
        "p999_norm": float(np.percentile(d, 99.9)),
        "max_levels": float(d.max() * LEVEL),
        "mean_levels": float(d.mean() * LEVEL),
        "p99_levels": float(np.percentile(d, 99) * LEVEL),
        "p999_levels": float(np.percentile(d, 99.9) * LEVEL),
        "frac_values_off_by_ge_1_level": float(flips.mean()),
        "images_with_any_level_diff": int(sum(1 for n in per_image_flip if n > 0)),
        "exactly_equal": bool(d.max() == 0.0),
    }


def by_source_size(diffs: list[np.ndarray], src_sizes: list[tuple[int, int]]) -> dict:
    """The torchvision comparison split by the input image's size (width x height)."""
    out = {}
    for wh in sorted(set(src_sizes), key=lambda t: (-t[0] * t[1], t)):
        ds = [d for d, s in zip(diffs, src_sizes) if s == wh]
        lv = np.concatenate([d.ravel() for d in ds]) * LEVEL
        out[f"{wh[0]}x{wh[1]}"] = {
            "images": len(ds),
            "max_levels": float(lv.max()),
            "frac_values_off_by_ge_1_level": float((lv >= 0.5).mean()),
            "images_with_any_level_diff": int(sum((d * LEVEL >= 0.5).any() for d in ds)),
        }
    return out


def compare_naflex(images: list[Image.Image], budget: int, tv_proc, pil_proc) -> dict:
    from masc_engine.runtime.preprocess import preprocess_image

    s = naflex_settings(budget)
    acc = {"torchvision": ([], [], [], []), "pil": ([], [], [], [])}
    for im in images:
        ours = preprocess_image(im, s)
        n = ours.spatial_shape[0] * ours.spatial_shape[1]
        was_resized = (ours.spatial_shape[0] * 16, ours.spatial_shape[1] * 16) != (im.height, im.width)
        for name, proc in (("torchvision", tv_proc), ("pil", pil_proc)):
            r = proc(images=[im], max_num_patches=budget, return_tensors="np")
            shape = tuple(int(x) for x in r["spatial_shapes"][0])
            same = shape == ours.spatial_shape and np.array_equal(
                np.asarray(r["pixel_attention_mask"][0]).astype(np.int32), ours.pixel_attention_mask
            )
            diffs, flips, shapes, res = acc[name]
            shapes.append(same)
            res.append(was_resized)
            if not same:  # a grid mismatch: compare nothing, report it in spatial_shapes_equal
                continue
            d = np.abs(np.asarray(r["pixel_values"][0][:n], dtype=np.float32) - ours.pixel_values[:n])
            diffs.append(d)
            flips.append(int((d * LEVEL >= 0.5).sum()))
    out = {k: summarize(*v) for k, v in acc.items()}
    if all(acc["torchvision"][2]):
        out["torchvision"]["by_input_size"] = by_source_size(acc["torchvision"][0], [im.size for im in images])
    return out


def compare_fixed(images: list[Image.Image], size: int, tv_proc, pil_proc) -> dict:
    from masc_engine.runtime.preprocess import preprocess_image

    s = fixed_settings(size)
    acc = {"torchvision": ([], [], [], []), "pil": ([], [], [], [])}
    for im in images:
        ours = preprocess_image(im, s)
        for name, proc in (("torchvision", tv_proc), ("pil", pil_proc)):
            r = proc(images=[im], return_tensors="np")
            pv = np.asarray(r["pixel_values"][0], dtype=np.float32)
            diffs, flips, shapes, res = acc[name]
            same = pv.shape == ours.pixel_values.shape
            shapes.append(same)
            res.append(im.size != (size, size))
            if not same:
                continue
            d = np.abs(pv - ours.pixel_values)
            diffs.append(d)
            flips.append(int((d * LEVEL >= 0.5).sum()))
    out = {k: summarize(*v) for k, v in acc.items()}
    if all(acc["torchvision"][2]):
        out["torchvision"]["by_input_size"] = by_source_size(acc["torchvision"][0], [im.size for im in images])
    return out


def fmt_row(label: str, r: dict) -> str:
    return (
        f"  {label:<34} grids {r['spatial_shapes_equal']:>7}  "
        f"max {r['max_levels']:.3g} lv ({r['max_norm']:.2e})  "
        f"mean {r['mean_levels']:.2e} lv ({r['mean_norm']:.2e})  "
        f"p99 {r['p99_levels']:.2e} lv ({r['p99_norm']:.2e})  "
        f"values >=1 lv off {100 * r['frac_values_off_by_ge_1_level']:.4f}%  "
        f"images with any {r['images_with_any_level_diff']}/{r['images']}"
    )


def fmt_sizes(by_size: dict) -> str:
    return "    vs torchvision by input size (max lv, % values >=1 lv off): " + "; ".join(
        f"{k} {v['max_levels']:.0f}, {100 * v['frac_values_off_by_ge_1_level']:.2f}%" for k, v in by_size.items()
    )


# ------------------------------------------------------------------ scores


def load_rows(data: Path) -> list[dict]:
    with open(data / "pairs.csv", newline="", encoding="utf-8-sig") as f:
        return list(csv.DictReader(f))


def load_pair(data: Path, row: dict, sizes: dict | None):
    """The pair as the reference reads it; with `sizes`, each image (and its mask, NEAREST) resized
    to the size assigned to that file."""
    out = []
    for img_key, mask_key in (("ref_image", "ref_mask"), ("out_image", "out_mask")):
        im = Image.open(data / row[img_key])
        m = Image.open(data / row[mask_key]).convert("L")
        if sizes is not None:
            wh = sizes[row[img_key]]
            im = im.convert("RGB").resize(wh, Image.Resampling.LANCZOS)
            m = m.resize(wh, Image.Resampling.NEAREST)
        out += [im, np.array(m)]
    return (*out, row["prompt"], row["object_name"])


def score_all(masc_obj, pairs) -> tuple[np.ndarray, np.ndarray]:
    cp, pf = [], []
    for p in pairs:
        r = masc_obj.score(*p)
        cp.append(r.cp)
        pf.append(r.pf)
    return np.asarray(cp, dtype=np.float64), np.asarray(pf, dtype=np.float64)


def score_diff(cp_a, pf_a, cp_b, pf_b) -> dict:
    def stats(a, b):
        nan_same = bool(np.array_equal(np.isnan(a), np.isnan(b)))
        ok = ~(np.isnan(a) | np.isnan(b))
        d = np.abs(a[ok] - b[ok])
        return {
            "n": int(ok.sum()),
            "nan_pattern_equal": nan_same,
            "max": float(d.max()) if d.size else 0.0,
            "mean": float(d.mean()) if d.size else 0.0,
            "spread_of_scores": float(np.std(b[ok])),
        }

    return {"cp": stats(cp_a, cp_b), "pf": stats(pf_a, pf_b)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/work/shared/data/dreambooth"))
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1 is fastest for the tiny models: ~0.15 s a pair)",
    )
    args = ap.parse_args()

    import torch  # (fails early outside the torchvision venv)
    import torchvision  # noqa: F401
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil
    from transformers.models.siglip.image_processing_siglip import SiglipImageProcessor
    from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil
    from transformers.models.siglip2.image_processing_siglip2 import Siglip2ImageProcessor

    torch.set_num_threads(args.threads)
    lines: list[str] = []
    log = log_factory(lines)
    t0 = time.time()
    info = machine_info()
    result: dict = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "script": "bench/pixels_vs_torchvision.py",
        "machine": dict(info, loadavg_1_5_15=list(os.getloadavg())),
    }
    log("# Our pixels vs transformers' torchvision-backed SigLIP2 image processor")
    log(
        f"machine: {info['cpu']}, {info['cores_usable']} usable cores ({info['cores_visible']} visible), "
        f"torch threads {info['torch_threads']}, {info['platform']}, Python {info['python']}"
    )
    log("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))
    log()

    files = sorted(args.data.glob("images/*/*.jpg"))
    rel = [str(f.relative_to(args.data)) for f in files]
    photos = [Image.open(f).convert("RGB") for f in files]
    sizes = {r: SIZES[i % len(SIZES)] for i, r in enumerate(rel)}
    resized = [im.resize(sizes[r], Image.Resampling.LANCZOS) for im, r in zip(photos, rel)]
    native = sorted({im.size for im in photos})
    log(
        f"images: {len(photos)} DreamBooth photos, sizes {native}; and the same photos resized "
        f"(Pillow LANCZOS) to {', '.join(f'{w}x{h}' for w, h in SIZES)} in turn"
    )
    log(
        "|Δ| over every value of every valid (non-padding) patch, pooled over images; "
        "'lv' = uint8 levels = |Δ| * 127.5, normalized units in parentheses"
    )
    result["image_sets"] = {
        "photos": {"n": len(photos), "sizes": [list(s) for s in native]},
        "resized": {"sizes": [list(s) for s in SIZES], "resample": "LANCZOS"},
    }

    # ---------------------------------------------------------------- pixels: NaFlex
    result["pixels"] = {}
    for budget in (1024, 256):
        tv = Siglip2ImageProcessor(patch_size=16, max_num_patches=budget)
        pil = Siglip2ImageProcessorPil(patch_size=16, max_num_patches=budget)
        log()
        log(
            f"NaFlex, patch 16, budget {budget} (ours vs Siglip2ImageProcessor [{type(tv).__mro__[1].__name__}] "
            f"and vs Siglip2ImageProcessorPil [control])"
        )
        for set_name, ims in (("photos", photos), ("resized", resized)):
            r = compare_naflex(ims, budget, tv, pil)
            result["pixels"][f"naflex{budget}/{set_name}"] = r
            n_res = r["torchvision"]["images_resized"]
            log(fmt_row(f"{set_name} ({n_res} resized) vs torchvision", r["torchvision"]))
            log(fmt_row(f"{set_name} vs PIL", r["pil"]))
        if set_name == "resized":
            log(fmt_sizes(r["torchvision"]["by_input_size"]))

    # ---------------------------------------------------------------- pixels: fixed 512
    kw = dict(size={"height": 512, "width": 512}, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    tv, pil = SiglipImageProcessor(**kw), SiglipImageProcessorPil(**kw)
    log()
    log(
        "fixed 512x512, bilinear, mean/std 0.5 (ours vs SiglipImageProcessor [torchvision] and "
        "vs SiglipImageProcessorPil [control])"
    )
    for set_name, ims in (("photos", photos), ("resized", resized)):
        r = compare_fixed(ims, 512, tv, pil)
        result["pixels"][f"fixed512/{set_name}"] = r
        n_res = r["torchvision"]["images_resized"]
        log(fmt_row(f"{set_name} ({n_res} resized) vs torchvision", r["torchvision"]))
        log(fmt_row(f"{set_name} vs PIL", r["pil"]))
        if set_name == "resized":
            log(fmt_sizes(r["torchvision"]["by_input_size"]))

    # ---------------------------------------------------------------- scores
    import masc
    from masc_engine.export.random_models import build_random_checkpoint

    rows = load_rows(args.data)
    log()
    log(
        f"# Scores: masc-metric {info['versions']['masc-metric']} on {len(rows)} pairs of pairs.csv, "
        "random-weight tiny models (CPU)"
    )
    log(
        "Each setting is scored twice: the processor masc loads (torchvision-backed here) vs the "
        "PIL-backed one swapped into m.processor.image_processor (what our engine reproduces; "
        "tests/test_oracle.py holds our engine to that run)."
    )
    result["scores"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpts = {k: str(build_random_checkpoint(k, Path(tmp) / k)) for k in ("tiny-naflex", "tiny-fixed")}
        settings = [  # (label, checkpoint, budget, resized?)
            ("tiny NaFlex, budget 1024, photos as they are", "tiny-naflex", 1024, False),
            ("tiny NaFlex, budget 256, photos as they are", "tiny-naflex", 256, False),
            ("tiny NaFlex, budget 1024, resized pairs", "tiny-naflex", 1024, True),
            ("tiny NaFlex, budget 256, resized pairs", "tiny-naflex", 256, True),
            ("tiny fixed 128px, photos as they are", "tiny-fixed", None, False),
            ("tiny fixed 128px, resized pairs", "tiny-fixed", None, True),
        ]
        loaded: dict = {}
        for label, key, budget, use_resized in settings:
            kwargs = {"naflex_max_patches": budget} if budget else {}
            m = masc.MaSC(model_id=ckpts[key], device="cpu", **kwargs)
            cls = type(m.processor.image_processor)
            loaded_name = f"{cls.__module__}.{cls.__qualname__} ({cls.__mro__[1].__name__})"
            if key not in loaded:
                loaded[key] = loaded_name
                log(f"masc.MaSC({key}) loads image processor: {loaded_name}")
            pairs = [load_pair(args.data, r, sizes if use_resized else None) for r in rows]
            cp_tv, pf_tv = score_all(m, pairs)
            if budget:
                m.processor.image_processor = Siglip2ImageProcessorPil(patch_size=16, max_num_patches=1024)
            else:
                m.processor.image_processor = SiglipImageProcessorPil(
                    size={"height": 128, "width": 128}, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
                )
            cp_pil, pf_pil = score_all(m, pairs)
            d = score_diff(cp_tv, pf_tv, cp_pil, pf_pil)
            d["processor_loaded"] = loaded_name
            result["scores"][label] = d
            log(
                f"  {label:<46} max |ΔCP| {d['cp']['max']:.2e}  mean |ΔCP| {d['cp']['mean']:.2e}  "
                f"max |ΔPF| {d['pf']['max']:.2e}  mean |ΔPF| {d['pf']['mean']:.2e}  "
                f"(CP n={d['cp']['n']}, NaN pattern equal: {d['cp']['nan_pattern_equal'] and d['pf']['nan_pattern_equal']}; "
                f"std of CP {d['cp']['spread_of_scores']:.3f}, PF {d['pf']['spread_of_scores']:.3f})"
            )
    log(
        "Random weights: these score differences are a rough indication only; a trained model's "
        "sensitivity to a 1-level pixel change differs."
    )
    result["elapsed_s"] = round(time.time() - t0, 1)
    log(f"elapsed {result['elapsed_s']} s")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pixels_vs_torchvision.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (args.out / "pixels_vs_torchvision.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
