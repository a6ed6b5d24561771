"""The whole evaluation table in one masc-run against the reference way, cold processes, side by side.

Workload: DreamBench-shaped (bench/workloads.py ``dreambench_pairs``: ``--references`` subjects, photo
00 the reference, against ``--prompts`` x ``--methods`` unique outputs made from the other photos).
Columns: CP, PF, CLIP-I, CLIP-T and DINO.

- ``masc_run``: ONE ``masc-run pairs.csv --bundle B --metrics cp,pf,clip_i,clip_t,dino --embedder
  clip=... --embedder dino=...`` process (fp32 graphs, ONNX Runtime CPU, default settings: each
  distinct image decoded once and encoded once per encoder, no persistent cache), timed from spawn
  to exit.
- ``reference``: ONE Python process doing what a user does today: masc-metric 0.3.0 (``MaSC.score``
  per pair) for CP/PF, and a DreamBench++-style transformers loop for the rest
  (yuangpeng/dreambench_plus ``dreambench_plus/metrics/clip_score.py`` and ``dino_score.py``): per pair
  both images loaded (EXIF transpose, alpha on white, RGB), CLIP-I/CLIP-T from ``CLIPModel``
  ``get_image_features`` / ``get_text_features`` (transformers 5's output objects unwrapped) on
  ``CLIPImageProcessorPil`` pixels and the tokenizer's ids, DINO from ``ViTModel`` (no pooler,
  LayerNorm eps 1e-6) on torchvision's ``Resize(256, BICUBIC) + CenterCrop(224) + ToTensor +
  Normalize`` (written with Pillow and the same rounding when torchvision is not installed), each
  score ``100 * cos`` of the L2-normalised embeddings. Timed from spawn to exit.

Both sides load random weights of the real shapes from the same checkpoint folders: SigLIP2
``random:base-naflex`` (NaFlex budget ``--budget``), CLIP ``random:clip-b32`` (openai/clip-vit-base-
patch32's shapes), DINO ``random:dino-s16`` (facebook/dino-vits16's). The sides run as paired,
alternating repetitions (``--reps``; the order flips each repetition) so the machine's load hits
both alike; the ratio is reference / masc-run per repetition and of the medians. Scores are
compared row by row (max |diff| per column, masc-run against the reference loop).

The machine may be shared: ``os.getloadavg()`` is recorded around each repetition; run it under
``nice -n 5`` there and say so with ``--load-note``.

``--bf16-cpu`` adds a third side, ``masc_run_bf16``: the same masc-run with the SigLIP2, CLIP and
DINO bundles certified for bf16 on OpenVINO's CPU plugin (copies of the fp32 bundles, each certified
once with export/cpu_precision.py ``certify_bundle``'s default calibration and held-out pairs;
``--backend auto`` and ``Embedder`` pick OpenVINO for them; a refused embedder stays fp32 on ONNX
Runtime, and the results say so); its own cache root, so its first repetition compiles every
OpenVINO graph and the later ones import them. Its certified columns are held to the
certification's gate against the reference (tolerances ``FIDELITY_MAX_ABS_DELTA`` on CP and PF, 100
times it on the x100 CLIP-I, CLIP-T and DINO columns), the others to the same tolerances as fp32.
Goal of that side: >= 6x the reference.

masc-run's cache root (``MASC_ENGINE_CACHE``: records of graph files already hashed, OpenVINO's
compiled models) is ``<work>/cache-root``, emptied at the start: the first repetition is a
machine's first run, the later ones find what it kept (each repetition says which).
``--profile-stages``: each masc-run's stage split (``MASC_PROFILE_STAGES``, engine/stage_clock.py;
bench/workloads.py ``stage_split``) and a GEMM probe of the machine's limit (``machine_limit``).

Run (from the repo root, in the venv with the export extra and masc-metric 0.3.0):
    nice -n 5 python bench/classic_speed.py --out bench/results/classic_speed.json
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import workloads  # noqa: E402
from workloads import dreambench_pairs  # noqa: E402

METRICS = "cp,pf,clip_i,clip_t,dino"
COLUMNS = ("cp", "pf", "clip_i", "clip_t", "dino")


def photo_root() -> Path:
    """The shared photo set beside the checkout when present, else the shipped examples."""
    shared = REPO.parent / "shared" / "data" / "dreambooth"
    return shared if (shared / "images").is_dir() else REPO / "examples" / "dreambooth"


def subjects_of(root: Path) -> list[tuple[str, str]]:
    """``(subject folder, class noun)`` of a photo set: its subjects.csv, else its pairs.csv."""
    if (root / "subjects.csv").is_file():
        return [(r["subject"], r["class"]) for r in csv.DictReader(open(root / "subjects.csv"))]
    seen = {r["subject"]: r["object_name"] for r in csv.DictReader(open(root / "pairs.csv"))}
    return list(seen.items())


# ----------------------------------------------------------------------------- the reference process


def _load_image(path: str):
    """DreamBench++ ``load_image``: EXIF transpose, RGBA composited on white, RGB."""
    from PIL import Image, ImageOps

    im = ImageOps.exif_transpose(Image.open(path))
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        rgba = im.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return im.convert("RGB")


def _dino_transform():
    """torchvision ``Resize(256, BICUBIC), CenterCrop(224), ToTensor(), Normalize(ImageNet)`` on a PIL
    image; the same steps with Pillow (torchvision's PIL path) when torchvision is not installed."""
    try:
        from torchvision import transforms as T

        return T.Compose(
            [
                T.Resize(256, interpolation=T.InterpolationMode.BICUBIC),
                T.CenterCrop(224),
                T.ToTensor(),
                T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            ]
        ), "torchvision"
    except ImportError:
        import numpy as np
        import torch
        from PIL import Image

        mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

        def tf(im):
            w, h = im.size
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(256 * long / short)
            size = (256, new_long) if w <= h else (new_long, 256)
            im = im.resize(size, Image.Resampling.BICUBIC)
            top, left = int(round((im.height - 224) / 2.0)), int(round((im.width - 224) / 2.0))
            im = im.crop((left, top, left + 224, top + 224))
            x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)
            return (x - mean) / std

        return tf, "Pillow (torchvision's PIL path and rounding; torchvision not installed)"


def _unwrap(features):
    """transformers 5: ``get_*_features`` returns an output object whose ``pooler_output`` is the projection."""
    import torch

    return features if isinstance(features, torch.Tensor) else features.pooler_output


def child_reference(siglip: str, clip: str, dino: str, pairs: str, budget: int) -> dict:
    """masc-metric 0.3.0 for CP/PF plus the DreamBench++-style transformers loop, one process."""
    t = time.perf_counter()
    import resource
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    import torch
    from masc import MaSC
    from PIL import Image
    from transformers import AutoConfig, AutoTokenizer, CLIPModel, ViTModel
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    t_import = time.perf_counter() - t
    t = time.perf_counter()
    m = MaSC(model_id=siglip, device="cpu", naflex_max_patches=budget)
    clip_model = CLIPModel.from_pretrained(clip).eval()
    clip_pixels, tokenizer = CLIPImageProcessorPil.from_pretrained(clip), AutoTokenizer.from_pretrained(clip)
    config = AutoConfig.from_pretrained(dino)
    config.layer_norm_eps = 1e-6  # facebookresearch/dino vision_transformer.py
    dino_model = ViTModel.from_pretrained(dino, config=config, add_pooling_layer=False).eval()
    dino_tf, dino_tf_kind = _dino_transform()
    t_load = time.perf_counter() - t
    rows = list(csv.DictReader(open(pairs)))
    out: dict[str, list[float]] = {c: [] for c in COLUMNS}

    def cos100(a, b) -> float:
        a, b = a / a.norm(p=2, dim=-1, keepdim=True), b / b.norm(p=2, dim=-1, keepdim=True)
        return float(100 * (a * b).sum(-1))

    t = time.perf_counter()
    with torch.no_grad():
        for r in rows:
            res = m.score(
                Image.open(r["ref_image"]),
                np.array(Image.open(r["ref_mask"]).convert("L")),
                Image.open(r["out_image"]),
                np.array(Image.open(r["out_mask"]).convert("L")),
                r["prompt"],
                r["object_name"],
            )
            out["cp"].append(res.cp)
            out["pf"].append(res.pf)
            ref, gen = _load_image(r["ref_image"]), _load_image(r["out_image"])
            pv = clip_pixels(images=[ref, gen], return_tensors="pt")["pixel_values"]
            img = _unwrap(clip_model.get_image_features(pixel_values=pv))
            ids = tokenizer([r["prompt"]], padding=True, return_tensors="pt")
            txt = _unwrap(
                clip_model.get_text_features(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"])
            )
            out["clip_i"].append(cos100(img[0], img[1]))
            out["clip_t"].append(cos100(img[1], txt[0]))
            cls = dino_model(pixel_values=torch.stack([dino_tf(ref), dino_tf(gen)])).last_hidden_state[:, 0]
            out["dino"].append(cos100(cls[0], cls[1]))
    return {
        "import_s": t_import,
        "models_load_s": t_load,
        "loop_s": time.perf_counter() - t,
        "pairs": len(rows),
        "torch_threads": torch.get_num_threads(),
        "dino_transform": dino_tf_kind,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "scores": out,
    }


# ----------------------------------------------------------------------------- the masc-run process


def masc_run_process(
    bundle: Path, clip: Path, dino: Path, pairs: Path, out: Path, batch_size: int, stages: Path | None, env: dict
) -> tuple[dict, float, dict | None]:
    """One cold ``masc-run`` with the five columns; returns (its sidecar, wall seconds spawn -> exit,
    its stage split (bench/workloads.py ``stage_split``) when ``stages`` names a file)."""
    extra = ["--metrics", METRICS, "--embedder", f"clip={clip}", "--embedder", f"dino={dino}"]
    return workloads.masc_run(pairs, bundle, out, [*extra, "--batch-size", str(batch_size)], stages, env)


# ----------------------------------------------------------------------------- machine and bundles


def machine() -> dict:
    """bench/workloads.py ``machine`` with masc-metric's version."""
    return workloads.machine(("onnxruntime", "openvino", "torch", "transformers", "masc-metric"))


def bundles(work: Path, siglip: str, clip: str, dino: str, budget: int, bf16_cpu: bool = False) -> dict:
    """Export (or reuse) the SigLIP2 bundle and the two embedder bundles of the given presets; with
    ``bf16_cpu`` also a copy of the SigLIP2 bundle certified for bf16 (``siglip_bf16``; None when
    refused) and the certification's summary (``bf16_certification``)."""
    from masc_engine.export.embedders import export_embedder_bundle
    from masc_engine.export.exporter import export_bundle

    out: dict = {"siglip": work / f"{siglip}-{budget}", "clip": work / clip, "dino": work / dino}
    if not (out["siglip"] / "manifest.json").is_file():
        export_bundle(f"random:{siglip}", out["siglip"], max_num_patches=budget)
    for key, preset in (("clip", clip), ("dino", dino)):
        if not (out[key] / "manifest.json").is_file():
            export_embedder_bundle(f"random:{preset}", out[key])
    if bf16_cpu:
        out["siglip_bf16"], out["bf16_certification"] = _certified_copy(out["siglip"])
        out["embedders_bf16_certification"] = {}
        for key in ("clip", "dino"):
            out[f"{key}_bf16"], out["embedders_bf16_certification"][key] = _certified_copy(out[key])
    return out


def _certified_copy(fp32: Path) -> tuple[Path | None, dict]:
    """A copy of the fp32 bundle certified for bf16-cpu (made once, kept in the work folder;
    bench/workloads.py ``certified_copy``) and a summary of its certificate."""
    cert = fp32.with_name(fp32.name + "-bf16cpu")
    full = workloads.certified_copy(fp32, cert, fp32.with_name(fp32.name + "-bf16cpu.json"))
    info: dict = {"certified": full["certified"], "certify_seconds": round(full["certify_seconds"], 1)}
    if full["certified"]:
        held = full["record"]["gates"]["heldout"]
        info["keep_fp32"] = full["record"]["keep_fp32"]
        info["heldout"] = {k: held[k] for k in ("pairs", "max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf")}
    else:
        info["refused"] = full["refused"]
    return (cert if info["certified"] else None), info


def _checkpoint(bundle: Path) -> str:
    """The random checkpoint folder a bundle was exported from (both sides load it)."""
    from masc_engine.export.checkpoint import random_checkpoint_dir

    src = json.loads((bundle / "manifest.json").read_text())["source"]
    return src.get("checkpoint_dir") or str(random_checkpoint_dir(src["model"]))


def compare(rows: list[dict], ref: dict, bf16: bool = False, bf16_columns: tuple[str, ...] = ()) -> dict:
    """Per column: max |masc-run - reference|, NaN mismatches and both means (side by side).
    ``bf16``: CP and PF come from a bf16-certified bundle, held to its gates instead of the oracle's;
    ``bf16_columns``: classic columns from a bf16-certified embedder, held to 100 x that gate (the
    columns are x100 cosines)."""
    import numpy as np

    from masc_engine.tolerances import CLASSIC_METRIC_ATOL, FIDELITY_MAX_ABS_DELTA, ORACLE_SCORE_ATOL

    out = {}
    for c in COLUMNS:
        ours = np.array([float(r[c]) if r[c] not in ("", None) else np.nan for r in rows])
        theirs = np.array(ref["scores"][c], dtype=float)
        both = np.isfinite(ours) & np.isfinite(theirs)
        out[c] = {
            "max_abs_diff": float(np.abs(ours[both] - theirs[both]).max()) if both.any() else None,
            "nan_mismatch": int(np.sum(np.isfinite(ours) != np.isfinite(theirs))),
            "mean_masc_run": float(np.nanmean(ours)),
            "mean_reference": float(np.nanmean(theirs)),
        }
        if c in bf16_columns:
            tol, name = (
                100 * FIDELITY_MAX_ABS_DELTA,
                "100 x tolerances.FIDELITY_MAX_ABS_DELTA (the bf16 gate in x100 points)",
            )
        elif c not in ("cp", "pf"):
            tol, name = CLASSIC_METRIC_ATOL, "tolerances.CLASSIC_METRIC_ATOL"
        elif bf16:
            tol, name = FIDELITY_MAX_ABS_DELTA, "tolerances.FIDELITY_MAX_ABS_DELTA (the bf16 certification's gate)"
        else:
            tol, name = ORACLE_SCORE_ATOL, "tolerances.ORACLE_SCORE_ATOL"
        out[c].update(
            tolerance=tol,
            tolerance_name=name,
            within=out[c]["max_abs_diff"] is not None and out[c]["max_abs_diff"] <= tol and out[c]["nan_mismatch"] == 0,
        )
    return out


def limit_section(probe: dict, siglip: Path, n_imgs: int, masc_run_s: float, reps: list[dict]) -> dict:
    """The GEMM probe and what it says of the SigLIP2 vision work: its FLOP (2 x the vision
    graph's weights x patches per image, a lower bound: attention's matmuls are left out), the time
    it needs at the fp32 probe rate, and that time as a fraction of the vision graph's measured run
    time and of the whole masc-run."""
    import numpy as np
    import onnx

    budget = json.loads((siglip / "manifest.json").read_text())["image"]["max_num_patches"]
    model = onnx.load(str(siglip / "vision.onnx"), load_external_data=False)
    params = 0
    for init in model.graph.initializer:
        if len(init.dims) == 2:  # the linear layers' weights
            params += int(np.prod(init.dims))
    gflop = 2 * params * budget / 1e9
    fp32 = workloads.limit_rate(probe, "fp32")
    vision_s = [sum(v for k, v in r["masc_run_stages"]["graph_run_s"].items() if k.endswith("/vision")) for r in reps]
    at_limit = n_imgs * gflop / fp32 if fp32 else None
    return {
        "gemm_probe": probe,
        "vision_gflop_per_image (linear layers, at the full patch budget)": round(gflop, 2),
        "distinct_images": n_imgs,
        "vision_s_at_fp32_limit": round(at_limit, 2) if at_limit else None,
        "vision_graph_run_s_per_repetition": [round(v, 2) for v in vision_s],
        "vision_fraction_of_fp32_limit_per_repetition": [round(at_limit / v, 3) for v in vision_s]
        if at_limit
        else None,
        "vision_at_limit_share_of_masc_run_median": round(at_limit / masc_run_s, 3) if at_limit else None,
        "note": "the probe runs once, before the repetitions, on a machine that may be shared (load averages "
        "per repetition); the vision FLOP leave out attention's matmuls, so the fractions are upper bounds",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(REPO / "out" / "bench-classic"))
    ap.add_argument("--photos", default=None, help="photo set (images/, masks/; default: ../shared's, else examples)")
    ap.add_argument("--references", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--methods", type=int, default=2)
    ap.add_argument("--budget", type=int, default=256, help="SigLIP2 NaFlex patch budget")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2, help="paired repetitions (the order alternates)")
    ap.add_argument("--siglip-preset", default="base-naflex")
    ap.add_argument("--clip-preset", default="clip-b32")
    ap.add_argument("--dino-preset", default="dino-s16")
    ap.add_argument("--load-note", default="", help="what else runs on the machine (recorded)")
    ap.add_argument(
        "--profile-stages",
        action="store_true",
        help="record each masc-run's stage split (MASC_PROFILE_STAGES) and the machine's GEMM limit",
    )
    ap.add_argument(
        "--bf16-cpu",
        action="store_true",
        help="also time masc-run with the SigLIP2 bundle certified for bf16 on OpenVINO (a third side)",
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "classic_speed.json"))
    a = ap.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    photos = (Path(a.photos) if a.photos else photo_root()).resolve()
    pairs = dreambench_pairs(work, photos, subjects_of(photos)[: a.references], a.prompts, a.methods)
    t = time.perf_counter()
    b = bundles(work, a.siglip_preset, a.clip_preset, a.dino_preset, a.budget, a.bf16_cpu)
    export_s = time.perf_counter() - t
    ckpt = {k: _checkpoint(b[k]) for k in ("siglip", "clip", "dino")}
    # masc-run's cache root (hashed-graph records, compiled models) starts empty: the first
    # repetition is a machine's first run, the later ones find what it kept.
    root, root_bf16 = work / "cache-root", work / "cache-root-bf16"
    for r in (root, root_bf16):
        shutil.rmtree(r, ignore_errors=True)
    env = {"MASC_ENGINE_CACHE": str(root)}
    sides = ["masc_run", "reference"] + (["masc_run_bf16"] if b.get("siglip_bf16") else [])
    probe = workloads.gemm_probe() if a.profile_stages else None
    from masc_engine.jobs.results import read_output

    reps, rows, rows_bf16, ref, splits = [], None, None, None, {}
    for i in range(a.reps):
        before, timed = workloads.loadavg(), {}
        for side in sides if i % 2 == 0 else sides[::-1]:
            if side == "masc_run":
                stages = work / "stages.json" if a.profile_stages else None
                meta, timed["masc_run"], splits["masc_run"] = masc_run_process(
                    b["siglip"], b["clip"], b["dino"], pairs, work / "scores.csv", a.batch_size, stages, env
                )
                rows = read_output(work / "scores.csv")
            elif side == "masc_run_bf16":
                stages = work / "stages-bf16.json" if a.profile_stages else None
                _, timed["masc_run_bf16"], splits["masc_run_bf16"] = masc_run_process(
                    b["siglip_bf16"],
                    b["clip_bf16"] or b["clip"],
                    b["dino_bf16"] or b["dino"],
                    pairs,
                    work / "scores-bf16.csv",
                    a.batch_size,
                    stages,
                    {"MASC_ENGINE_CACHE": str(root_bf16)},
                )
                rows_bf16 = read_output(work / "scores-bf16.csv")
            else:
                ref, timed["reference"] = workloads.run_child(
                    "classic_speed", "child_reference", ckpt["siglip"], ckpt["clip"], ckpt["dino"], str(pairs), a.budget
                )
        reps.append(
            {
                "order": " > ".join(sides if i % 2 == 0 else sides[::-1]),
                "masc_run_s": timed["masc_run"],
                "reference_s": timed["reference"],
                "ratio": timed["reference"] / timed["masc_run"],
                "masc_run_in_run_s": meta["seconds"],
                "reference_loop_s": ref["loop_s"],
                "reference_import_s": ref["import_s"],
                "reference_models_load_s": ref["models_load_s"],
                "loadavg_before": before,
                "loadavg_after": workloads.loadavg(),
                "cache_root": "empty (first run on the machine)" if i == 0 else "kept from the earlier repetitions",
            }
        )
        if "masc_run_bf16" in timed:
            reps[-1].update(
                masc_run_bf16_s=timed["masc_run_bf16"], ratio_bf16=timed["reference"] / timed["masc_run_bf16"]
            )
        if a.profile_stages:
            reps[-1]["masc_run_stages"] = splits["masc_run"]
            if "masc_run_bf16" in splits:
                reps[-1]["masc_run_bf16_stages"] = splits["masc_run_bf16"]
        print(json.dumps(reps[-1]), flush=True)
    n_imgs = len({r["ref_image"] for r in rows} | {r["out_image"] for r in rows})
    med = {
        k: statistics.median(r[k] for r in reps)
        for k in ("masc_run_s", "reference_s", "masc_run_bf16_s")
        if k in reps[0]
    }
    result = {
        "script": "bench/classic_speed.py",
        "command": " ".join([sys.executable, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "load_note": a.load_note or "not stated",
        "settings": {
            "precision": "fp32",
            "runtime": "ONNX Runtime CPU (masc-run defaults)",
            "metrics": METRICS,
            "siglip": f"random:{a.siglip_preset} (NaFlex budget {a.budget})",
            "clip": f"random:{a.clip_preset}",
            "dino": f"random:{a.dino_preset}",
            "batch_size": a.batch_size,
            "threads": "defaults of both sides (all cores)",
            "reference_torch_threads": ref["torch_threads"],
            "dino_transform": ref["dino_transform"],
            "processes": "cold: each side one fresh process per repetition, timed spawn -> exit",
            "bundle_export_s (not timed in the ratio)": round(export_s, 1),
        },
        "workload": {
            "pairs": len(rows),
            "references": a.references,
            "prompts": a.prompts,
            "methods": a.methods,
            "distinct_images": n_imgs,
            "reference_image_encodes_per_model": 2 * len(rows),
            "photos": str(photos),
        },
        "repetitions": reps,
        "median_s": med,
        "ratio_of_medians": med["reference_s"] / med["masc_run_s"],
        "ratio_per_repetition": [r["ratio"] for r in reps],
        "goal": ">= 4x with fp32",
        "scores_vs_reference": compare(rows, ref),
    }
    if a.bf16_cpu:
        result["bf16_cpu"] = {
            "siglip_bundle": "the fp32 SigLIP2 bundle certified for bf16 on OpenVINO's CPU plugin (--backend auto "
            "picks OpenVINO); CLIP and DINO certified copies too (Embedder picks OpenVINO), each refused one "
            "fp32 on ONNX Runtime; its own cache root (repetition 1 compiles)",
            "certification": b["bf16_certification"],
            "embedders": {
                k: {**v, "runs": "bf16 (OpenVINO)" if b[f"{k}_bf16"] else "fp32 (ONNX Runtime): refused"}
                for k, v in b["embedders_bf16_certification"].items()
            },
        }
        if rows_bf16 is not None:
            result["bf16_cpu"].update(
                ratio_of_medians=med["reference_s"] / med["masc_run_bf16_s"],
                ratio_warm_repetitions=[r["ratio_bf16"] for r in reps[1:]],
                goal=">= 6x with a certified bf16 bundle",
                scores_vs_reference=compare(
                    rows_bf16,
                    ref,
                    bf16=True,
                    bf16_columns=(("clip_i", "clip_t") if b["clip_bf16"] else ())
                    + (("dino",) if b["dino_bf16"] else ()),
                ),
            )
    if probe is not None:
        result["machine_limit"] = limit_section(probe, b["siglip"], n_imgs, med["masc_run_s"], reps)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_s", "ratio_of_medians", "scores_vs_reference")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
