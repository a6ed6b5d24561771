#!/usr/bin/env python
"""GPU throughput of the scoring pipeline, beside masc-metric in the same run.

For each model shape (random weights: ``random:base-naflex``, ``random:so400m-naflex``) at the
NaFlex budget (default 1,024 patches: 512x512 images give a 32x32 patch grid), through
``Scorer(device_resident=True)`` on the chosen backend (ONNX Runtime CUDA EP, or TensorRT engines
built by ``masc-export --backend tensorrt``):

- ``fresh``: pairs/s at each batch size, two fresh images per pair (reference and output both
  through the vision graph), pooling head and CP graph on the device; the best batch is reported.
- ``cached``: the same with the references' tokens already cached on the device (one reference
  against many outputs, a benchmark's shape): only outputs are encoded.
- ``batch1``: ms per pair, one fresh pair per call.
- ``masc_metric``: masc-metric 0.3.0 ``MaSC.score`` on the same checkpoint, device and pairs (one
  pair per call, its API), in the same process; the speed-up is ours / theirs.
- ``mfu``: achieved FLOP/s over the GPU's peak at the engine's precision. FLOPs per pair are
  counted from the architecture (vision tower per encoded image, pooling head, CP's cosine GEMM;
  the text tower is excluded: prompts are cached) by :func:`flops_per_image`.

Images are preprocessed on the host *before* timing (reported separately as host images/s on one
thread): the figures are the device pipeline's, which masc-run feeds from its loader threads.
``pipeline`` then times decode + preprocess + encode of the outputs both ways at the best fresh
batch: serial (:meth:`Scorer.encode_images`) and overlapped (runtime/pipeline.py
``encode_images_overlapped``: preprocessing of batch n+1 while batch n runs, copies from pinned
memory on the engine's stream), with the tokens checked equal.

Memory: every Scorer is closed when its measurement ends (``with Scorer(...)``), so one batch
size's engines and context memory are gone before the next loads; TensorRT engines are built with
profile maxima chosen from ``--gpu-memory-budget`` (default: the free memory), so a 24 GB GPU gets
smaller maxima instead of an out-of-memory error.

Targets on one H200 (acceptance targets, not measurements): >= 300 pairs/s fresh (so400m, 1,024 patches), >= 550 cached,
<= 10 ms/pair at batch 1, >= 20x masc-metric. The script reports each as met or not.

Usage (repo root; on a GPU with onnxruntime-gpu and CuPy, or TensorRT and CuPy)::

    python bench/gpu_throughput.py                                   # ORT CUDA EP
    python bench/gpu_throughput.py --backend tensorrt --precision fp16
    python bench/gpu_throughput.py --dry-run                         # tiny model on CPU: checks it runs

unverified: it has only run as ``--dry-run`` on CPU (bench/results/gpu_throughput.dryrun.json),
never on a GPU with onnxruntime-gpu or TensorRT, so no GPU figure exists yet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

#: Dense peak TFLOP/s by GPU name fragment and precision (vendor datasheets, SXM parts, no
#: sparsity). fp32 means TF32 tensor cores off: ORT and TensorRT fp32 engines run plain FP32.
PEAK_TFLOPS = {
    "H200": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "H100": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
}

TARGETS = {
    "fresh_pairs_per_s": 300.0,
    "cached_pairs_per_s": 550.0,
    "batch1_ms_per_pair": 10.0,
    "speedup_vs_masc_metric": 20.0,
}

PROMPTS = [
    "a {} in the jungle",
    "a {} on the beach",
    "a {} with a city in the background",
    "a {} floating on top of water",
    "a red {}",
    "a {} in the snow",
]


def flops_per_image(width: int, layers: int, mlp: int, patches: int, patch: int = 16) -> float:
    """Forward FLOPs of a SigLIP2 vision tower on one image of ``patches`` tokens (2 per MAC):
    patch embedding, per layer the q/k/v/o projections, attention scores and weighted sum, and
    the MLP. LayerNorms, softmax and GELU are left out (under 1%)."""
    n, d = patches, width
    embed = 2 * n * (3 * patch * patch) * d
    per_layer = 2 * n * 4 * d * d + 2 * 2 * n * n * d + 2 * 2 * n * d * mlp
    return float(embed + layers * per_layer)


def flops_per_pair(width: int, layers: int, mlp: int, patches: int, images_per_pair: float) -> float:
    """Vision FLOPs for the images encoded per pair, the pooling head on the output (key/value
    projections over all patches, the probe's MLP), and CP's cosine GEMM (N x M x D)."""
    n, d = patches, width
    pool = 2 * n * 2 * d * d + 2 * 2 * n * d + 2 * 2 * d * mlp
    cp = 2 * n * n * d
    return images_per_pair * flops_per_image(width, layers, mlp, patches) + pool + cp


def gpu_name() -> str:
    for probe in (_gpu_name_cupy, _gpu_name_torch):
        try:
            name = probe()
            if name:
                return name
        except Exception:  # noqa: BLE001
            pass
    return "no GPU"


def _gpu_name_cupy():
    import cupy

    n = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return n.decode() if isinstance(n, bytes) else n


def _gpu_name_torch():
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def peak_tflops(name: str, precision: str, override: float | None) -> float | None:
    if override:
        return override
    for frag, table in PEAK_TFLOPS.items():
        if frag in name:
            return table[precision]
    return None


def workload(n_refs: int, outs_per_ref: int, side: int, seed: int = 0):
    """``n_refs`` references x ``outs_per_ref`` outputs, all distinct ``side x side`` images with
    elliptical masks; prompts cycle through six (the text tower is cached after the first)."""
    from PIL import Image

    rng = np.random.default_rng(seed)

    def image():
        base = rng.integers(0, 255, (side // 16, side // 16, 3), dtype=np.uint8)
        im = Image.fromarray(base).resize((side, side), Image.BILINEAR)
        noise = rng.integers(-12, 12, (side, side, 3))
        return Image.fromarray(np.clip(np.asarray(im, np.int16) + noise, 0, 255).astype(np.uint8))

    def mask():
        yy, xx = np.mgrid[0:side, 0:side]
        cy, cx, r = rng.uniform(0.35, 0.65) * side, rng.uniform(0.35, 0.65) * side, rng.uniform(0.2, 0.35) * side
        return (((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r).astype(np.uint8) * 255

    refs = [(image(), mask()) for _ in range(n_refs)]
    pairs = []
    for r in range(n_refs):
        for k in range(outs_per_ref):
            pairs.append((r, image(), mask(), PROMPTS[k % len(PROMPTS)].format("dog"), "dog"))
    return refs, pairs


def _sync(scorer):
    if scorer.device is not None:
        scorer.device.synchronize()


def time_ours(scorer, refs, pairs, batch: int, cached: bool, repeats: int) -> dict:
    """Seconds per pair through the device pipeline, preprocessing done beforehand."""
    from masc_engine.runtime.scorer import EncodedPair

    ref_pre = [scorer.preprocess(im) for im, _ in refs]
    out_pre = [scorer.preprocess(im) for _, im, _, _, _ in pairs]
    ref_cache = scorer.encode_preprocessed(ref_pre) if cached else None

    def one_pass(lo, hi):
        chunk = pairs[lo:hi]
        idx = sorted({p[0] for p in chunk})
        ref_enc = (
            dict(zip(idx, [ref_cache[i] for i in idx]))
            if cached
            else dict(zip(idx, scorer.encode_preprocessed([ref_pre[i] for i in idx])))
        )
        out_enc = scorer.encode_preprocessed(out_pre[lo:hi])
        items = []
        for (r, out_im, out_mask, prompt, name), oe in zip(chunk, out_enc):
            re = ref_enc[r]
            items.append(
                EncodedPair(
                    re,
                    scorer.mask_weights(refs[r][0], refs[r][1], re.grid, "reference"),
                    oe,
                    scorer.mask_weights(out_im, out_mask, oe.grid, "output"),
                    prompt,
                    name,
                )
            )
        return scorer.score_encoded(items)

    one_pass(0, min(batch, len(pairs)))  # warm-up: allocations, text embeddings, engine tactics
    _sync(scorer)
    t = time.perf_counter()
    n = 0
    for _ in range(repeats):
        for lo in range(0, len(pairs), batch):
            res = one_pass(lo, lo + batch)
            n += len(res)
    _sync(scorer)
    dt = time.perf_counter() - t
    return {"pairs": n, "seconds": dt, "pairs_per_s": n / dt, "ms_per_pair": 1e3 * dt / n}


def time_pipeline(scorer, images) -> dict:
    """Images/s of decode + preprocess + vision, serial and overlapped, and whether the tokens agree."""
    from masc_engine.runtime.pipeline import encode_images_overlapped

    scorer.encode_images(images[: scorer.batch_size])  # warm-up
    _sync(scorer)
    t = time.perf_counter()
    serial = scorer.encode_images(images)
    _sync(scorer)
    t_serial = time.perf_counter() - t
    t = time.perf_counter()
    over = encode_images_overlapped(scorer, images)
    _sync(scorer)
    t_over = time.perf_counter() - t
    host = scorer.device.to_host if scorer.device is not None else np.asarray
    same = all(np.array_equal(host(x.tokens), host(y.tokens)) for x, y in zip(serial, over))
    return {
        "images": len(images),
        "batch": scorer.batch_size,
        "serial_images_per_s": len(images) / t_serial,
        "overlapped_images_per_s": len(images) / t_over,
        "overlapped_over_serial_time": t_over / t_serial,
        "tokens_equal": same,
    }


def time_masc_metric(checkpoint: str, device: str, budget: int, refs, pairs, n: int) -> dict:
    import torch
    from masc import MaSC

    m = MaSC(model_id=checkpoint, device=device, naflex_max_patches=budget)
    sel = pairs[:n]

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    r0 = sel[0]
    m.score(refs[r0[0]][0], refs[r0[0]][1], r0[1], r0[2], r0[3], r0[4])
    sync()
    t = time.perf_counter()
    scores = []
    for r, out_im, out_mask, prompt, name in sel:
        res = m.score(refs[r][0], refs[r][1], out_im, out_mask, prompt, name)
        scores.append((res.cp, res.pf))
    sync()
    dt = time.perf_counter() - t
    return {
        "pairs": len(sel),
        "seconds": dt,
        "pairs_per_s": len(sel) / dt,
        "ms_per_pair": 1e3 * dt / len(sel),
        "scores": scores,
    }


def bench_model(a, preset: str, log) -> dict:
    from masc_engine.export.exporter import export_bundle
    from masc_engine.export.random_models import PRESETS
    from masc_engine.runtime.scorer import Scorer

    p = PRESETS[preset.split(":", 1)[1]]
    bundle = Path(a.work) / f"{preset.split(':', 1)[1]}-{a.budget}-{a.precision}"
    if not (bundle / "manifest.json").is_file():  # the precision is in the graphs (both backends)
        export_bundle(preset, bundle, max_num_patches=a.budget, precision=a.precision)
    if a.backend == "tensorrt" and not (bundle / f"tensorrt-{a.precision}").is_dir():
        from masc_engine.engine.backends.tensorrt import build_engines

        build_engines(bundle, precision=a.precision, max_batch=max(a.batches), gpu_memory_budget=a.gpu_memory_budget)
    manifest = json.loads((bundle / "manifest.json").read_text())
    side = int(np.sqrt(a.budget)) * 16
    refs, pairs = workload(a.refs, a.outs_per_ref, side)
    out = {
        "model": preset,
        "shape": {"width": p.vision_width, "layers": p.vision_layers, "mlp": p.vision_mlp},
        "patches": a.budget,
        "image": f"{side}x{side}",
        "pairs": len(pairs),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def mk(b):
            return Scorer(
                bundle,
                backend=a.backend,
                provider=a.provider,
                batch_size=b,
                device_resident=True,
                precision=a.precision,
            )

        with mk(1) as s1:
            t = time.perf_counter()
            for im, _ in refs[:8]:
                s1.preprocess(im)
            out["host_preprocess_images_per_s_one_thread"] = min(8, len(refs)) / (time.perf_counter() - t)
            out["batch1"] = time_ours(s1, refs, pairs[: a.batch1_pairs], 1, cached=False, repeats=1)
        for mode in ("fresh", "cached"):
            per_batch = {}
            for b in a.batches:
                with mk(b) as s:  # closed before the next batch size loads its engines
                    per_batch[b] = time_ours(s, refs, pairs, b, cached=mode == "cached", repeats=a.repeats)
                log(f"{preset} {mode} batch {b}: {per_batch[b]['pairs_per_s']:.1f} pairs/s")
            best = max(per_batch, key=lambda b: per_batch[b]["pairs_per_s"])
            out[mode] = {"by_batch": per_batch, "best_batch": best, "pairs_per_s": per_batch[best]["pairs_per_s"]}
        with mk(out["fresh"]["best_batch"]) as s:
            out["pipeline"] = time_pipeline(s, [im for _, im, _, _, _ in pairs])
    prec = a.precision  # the graphs' precision on either backend; fp32 runs without TF32 on both
    peak = peak_tflops(out.get("gpu", gpu_name()), prec, a.peak_tflops)
    for mode, imgs in (("fresh", 2.0), ("cached", 1.0)):
        f = flops_per_pair(p.vision_width, p.vision_layers, p.vision_mlp, a.budget, imgs)
        achieved = f * out[mode]["pairs_per_s"]
        out[mode]["tflops_per_s"] = achieved / 1e12
        out[mode]["mfu"] = (achieved / (peak * 1e12)) if peak else None
    out["peak_tflops"] = peak
    out["peak_precision"] = prec
    if not a.no_masc_metric:
        try:
            ref = time_masc_metric(
                manifest["source"]["checkpoint_dir"],
                "cpu" if a.dry_run else "cuda",
                a.budget,
                refs,
                pairs,
                a.masc_metric_pairs,
            )
            with Scorer(
                bundle, backend=a.backend, provider=a.provider, device_resident=True, precision=a.precision
            ) as s:
                ours = s.score_batch([_pair(refs, q) for q in pairs[: a.masc_metric_pairs]])
            d_cp = max(abs(o.cp - c) for o, (c, _) in zip(ours, ref.pop("scores")))
            out["masc_metric"] = {**ref, "max_abs_dcp_vs_ours": d_cp}
            out["speedup_fresh_vs_masc_metric"] = out["fresh"]["pairs_per_s"] / ref["pairs_per_s"]
        except ImportError as e:
            out["masc_metric"] = {"skipped": f"masc-metric not importable: {e}"}
    return out


def _pair(refs, q):
    from masc_engine.runtime.scorer import Pair

    r, out_im, out_mask, prompt, name = q
    return Pair(refs[r][0], refs[r][1], out_im, out_mask, prompt, name)


def _missing_gpu_stack(backend: str) -> str | None:
    """What this machine lacks for a GPU run, or None."""
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return f"CuPy with a CUDA GPU is needed for device-resident tokens ({type(e).__name__}: {e})"
    if backend == "tensorrt":
        try:
            import tensorrt  # noqa: F401
        except ImportError:
            return "TensorRT is not importable (pip install tensorrt)"
    else:
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
    return None


def main(argv=None) -> int:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["onnxruntime", "tensorrt"], default="onnxruntime")
    ap.add_argument(
        "--precision",
        choices=["fp32", "fp16", "bf16"],
        default="fp16",
        help="precision of the bundle's graphs (masc-export --precision), run by ONNX Runtime "
        "or built into strongly typed TensorRT engines; MFU is against this precision's peak",
    )
    ap.add_argument("--models", default="random:base-naflex,random:so400m-naflex")
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--refs", type=int, default=8)
    ap.add_argument("--outs-per-ref", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch1-pairs", type=int, default=32)
    ap.add_argument("--masc-metric-pairs", type=int, default=32)
    ap.add_argument("--no-masc-metric", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's peak at the precision (for MFU)")
    ap.add_argument(
        "--gpu-memory-budget",
        type=float,
        default=None,
        metavar="GIB",
        help="TensorRT: device memory the engine set may use (default: the free memory at build)",
    )
    ap.add_argument("--work", default=str(REPO / "out" / "bench-gpu"))
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny model, 64 patches, ONNX Runtime CPU with host-memory IO binding: checks the script",
    )
    a = ap.parse_args(argv)
    a.provider = "cuda"
    if a.dry_run:
        a.models, a.budget, a.batches, a.provider, a.backend = "random:tiny-naflex", 64, "1,4", "cpu", "onnxruntime"
        a.refs, a.outs_per_ref, a.repeats, a.batch1_pairs, a.masc_metric_pairs = 2, 4, 1, 3, 3
    a.batches = [int(b) for b in a.batches.split(",")]
    if not a.dry_run:
        missing = _missing_gpu_stack(a.backend)
        if missing:  # before any export: GPU time is not spent on a run that cannot finish
            print(
                f"gpu_throughput: cannot run here: {missing}. Use --dry-run to check the script on CPU.",
                file=sys.stderr,
            )
            return 2
    out_path = (
        Path(a.out)
        if a.out
        else RESULTS / ("gpu_throughput.dryrun.json" if a.dry_run else f"gpu_throughput.{a.backend}.json")
    )
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    import onnxruntime

    result = {
        "script": "bench/gpu_throughput.py",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_1_5_15": list(os.getloadavg()),
        },
        "versions": {"python": platform.python_version(), "onnxruntime": onnxruntime.__version__},
        "dry_run": a.dry_run,
        "gpu": gpu_name(),
        "backend": a.backend,
        "precision": a.precision,
        "provider": a.provider,
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "cpu_cores": os.cpu_count(),
        "targets": TARGETS,
        "models": {},
    }
    for preset in a.models.split(","):
        result["models"][preset] = bench_model(a, preset, log)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    so = result["models"].get("random:so400m-naflex")
    if so:
        result["targets_met"] = {
            "fresh_pairs_per_s": so["fresh"]["pairs_per_s"] >= TARGETS["fresh_pairs_per_s"],
            "cached_pairs_per_s": so["cached"]["pairs_per_s"] >= TARGETS["cached_pairs_per_s"],
            "batch1_ms_per_pair": so["batch1"]["ms_per_pair"] <= TARGETS["batch1_ms_per_pair"],
            "speedup_vs_masc_metric": so.get("speedup_fresh_vs_masc_metric", 0) >= TARGETS["speedup_vs_masc_metric"],
        }
    out_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
