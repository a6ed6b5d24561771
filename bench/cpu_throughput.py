"""CPU throughput: per image (our vision graph vs torch eager) and per job (masc-run vs
a masc-metric loop), cold whole processes, side by side in one run on the same machine.

Parts (``--parts``, default all):

- ``vision``: images/s of the bundle's vision graph on ONNX Runtime CPU, fused (``ort-cpu``
  variant, export/fusion.py) and portable, against PyTorch eager fp32 ``vision_model`` as
  masc-metric 0.3.0 loads it (``AutoModel.from_pretrained``, transformers' default attention),
  same random weights, same threads, batch and shape (square images filling the NaFlex budget),
  repetitions interleaved so machine load hits all sides alike. Shapes: base/256 and so400m/1024
  (``--vision-shapes``). Also the max |token| difference between the sides and, with
  ``--profile``, the fused graph's time by op type (ONNX Runtime profiling).
- ``startup``: in a fresh process, what a masc-run pays before and around its first batch:
  imports, bundle load with and without sha256 verification, tokenizer load, each session's
  creation (fused and portable), the first and a warm vision batch.
- ``job``: the DreamBench-shaped workload (``--references`` subjects of ../shared/data/dreambooth,
  each photo 00 the reference, against ``--prompts`` x ``--methods`` *unique* outputs made from
  its other photos), random-weight SigLIP2 of base shape, NaFlex budget 256. Each side is one cold
  whole process, timed from spawn to exit: ``masc-run`` (the CLI, default settings: fused graphs
  on CPU, no persistent cache) and a Python process that imports masc-metric, loads ``MaSC`` and
  loops over ``MaSC.score``. Scores are compared pair by pair.

Before the parts (unless ``--no-probe``), a GEMM probe at the encoder's matmul shape records the
machine's limit (bench/workloads.py ``gemm_probe``: fp32 and bf16 rates, OpenVINO's CPU
capabilities, AMX or not); with ``--profile-stages`` the job part records masc-run's stage split
and the vision graph's run time as a fraction of that limit.

Heavy (exports base and so400m random models): run under ``flock /tmp/masc-heavy.lock``. The
machine may be shared: ``os.getloadavg()`` is recorded before and after each part.

Run (from the repo root, in the test venv made by scripts/setup_env.sh --test):
    flock /tmp/masc-heavy.lock python bench/cpu_throughput.py --out bench/results/cpu_throughput.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import workloads  # noqa: E402
from workloads import dreambench_pairs  # noqa: E402

SHARED = REPO.parent / "shared" / "data" / "dreambooth"
#: The results file's layout (a part run alone updates its key in a file of this layout).
LAYOUT = "vision_per_image+job"


# ----------------------------------------------------------------------------- vision per image


def child_export_vision(preset: str, budget: int, work: str) -> dict:
    """Export the vision graph of ``random:<preset>`` and fuse it (cached in ``work``)."""
    import torch

    from masc_engine.export import fusion, graphs
    from masc_engine.export.exporter import random_checkpoint_dir
    from transformers import AutoModel

    d = Path(work) / f"vision-{preset}"
    rec_path = d / "fusion.json"
    if rec_path.is_file():
        return json.loads(rec_path.read_text())
    d.mkdir(parents=True, exist_ok=True)
    ckpt = random_checkpoint_dir(f"random:{preset}")
    vm = AutoModel.from_pretrained(ckpt, attn_implementation="eager").vision_model.eval()
    torch.set_grad_enabled(False)
    t = time.perf_counter()
    spec = graphs.vision_spec_naflex(vm, int(vm.config.patch_size), int(round(vm.config.num_patches**0.5)), 64)
    graphs.export_graph(spec, d / "vision.onnx")
    t_export = time.perf_counter() - t
    t = time.perf_counter()
    rec = fusion.fuse_graph(
        d / "vision.onnx", d / "vision.fused.onnx", int(vm.config.num_attention_heads), int(vm.config.hidden_size)
    )
    from masc_engine.export.transforms import op_counts

    before, after = op_counts(d / "vision.onnx"), op_counts(d / "vision.fused.onnx")
    rec["node_counts"] = {
        "before": before,
        "after": after,
        "total_before": sum(before.values()),
        "total_after": sum(after.values()),
    }
    rec.update(export_seconds=t_export, fuse_seconds=time.perf_counter() - t, checkpoint=str(ckpt))
    rec_path.write_text(json.dumps(rec, indent=2))
    return rec


def _square_images(budget: int, patch: int, n: int):
    from masc_engine.export.validate import synthetic_image

    side = int(round(budget**0.5)) * patch  # a square image whose grid fills the budget exactly
    return [synthetic_image(side, side, seed=i) for i in range(n)]


def _profile_by_op(path: str, feeds: dict, threads: int) -> dict:
    """One profiled run of an ONNX graph: milliseconds and share of node time per op type."""
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    o.enable_profiling = True
    o.profile_file_prefix = str(Path(path).with_suffix("")) + "-profile"
    s = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
    s.run(None, feeds)
    s.run(None, feeds)
    prof = s.end_profiling()
    events = json.loads(Path(prof).read_text())
    Path(prof).unlink()
    runs = [e for e in events if e.get("name") == "model_run"]
    last = runs[-1]
    t0, t1 = last["ts"], last["ts"] + last["dur"]
    by_op: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and t0 <= e["ts"] <= t1:
            op = e["args"].get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + e["dur"] / 1000
    total = sum(by_op.values())
    return {
        "run_ms": last["dur"] / 1000,
        "node_ms": total,
        "by_op_ms": {k: round(v, 2) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])},
        "by_op_share": {k: round(v / total, 4) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])},
    }


def child_vision_bench(preset: str, budget: int, batch: int, reps: int, threads: int, work: str, profile: bool) -> dict:
    """images/s of torch eager vs the fused and portable graphs, interleaved, one process."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoProcessor

    from masc_engine.runtime.position import position_weights
    from masc_engine.runtime.preprocess import ImageSettings, preprocess_image

    d = Path(work) / f"vision-{preset}"
    rec = json.loads((d / "fusion.json").read_text())
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    model = AutoModel.from_pretrained(rec["checkpoint"])  # as masc-metric 0.3.0 loads it
    attn_impl = model.config._attn_implementation
    vm = model.vision_model.eval()
    del model.text_model
    processor = AutoProcessor.from_pretrained(rec["checkpoint"])
    patch = int(vm.config.patch_size)
    grid = int(round(vm.config.num_patches**0.5))
    imgs = _square_images(budget, patch, batch)
    ref_in = processor.image_processor(images=imgs, max_num_patches=budget, return_tensors="pt")
    ip = processor.image_processor
    s = ImageSettings.from_manifest(
        dict(
            mode="naflex",
            patch_size=patch,
            max_num_patches=budget,
            image_size=None,
            position_grid=grid,
            resample="bilinear",
            rescale_factor=float(ip.rescale_factor),
            image_mean=list(ip.image_mean),
            image_std=list(ip.image_std),
            do_rescale=True,
            do_normalize=True,
            image_processor=type(ip).__name__,
        )
    )
    pre = [preprocess_image(im, s) for im in imgs]
    feeds = {
        "pixel_values": np.stack([p.pixel_values for p in pre]),
        "pixel_attention_mask": np.stack([p.pixel_attention_mask for p in pre]),
        "position_weights": np.stack([position_weights(grid, p.spatial_shape, budget) for p in pre]),
    }
    assert int(feeds["pixel_attention_mask"].sum()) == batch * budget, "images must fill the budget"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = {
        k: ort.InferenceSession(str(d / f), opts, providers=["CPUExecutionProvider"])
        for k, f in (("ort_fused", "vision.fused.onnx"), ("ort_portable", "vision.onnx"))
    }
    run = {
        "torch_eager": lambda: vm(
            pixel_values=ref_in["pixel_values"],
            pixel_attention_mask=ref_in["pixel_attention_mask"],
            spatial_shapes=ref_in["spatial_shapes"],
        ).last_hidden_state.numpy(),
        **{k: (lambda s=s: s.run(None, feeds)[0]) for k, s in sessions.items()},
    }
    outs = {k: f() for k, f in run.items()}  # warm-up, and the outputs to compare
    times: dict[str, list[float]] = {k: [] for k in run}
    for _ in range(reps):  # interleaved: load from other processes hits every side alike
        for k, f in run.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    res = {
        "preset": preset,
        "budget": budget,
        "batch": batch,
        "threads": threads,
        "reps": reps,
        "torch_attn_implementation": attn_impl,
        "vision": {
            "width": int(vm.config.hidden_size),
            "layers": int(vm.config.num_hidden_layers),
            "heads": int(vm.config.num_attention_heads),
        },
        "fusions": rec["fusions"],
        "nodes": [rec["node_counts"]["total_before"], rec["node_counts"]["total_after"]],
    }
    for k, ts in times.items():
        res[k] = {
            "images_per_s_median": batch / float(np.median(ts)),
            "images_per_s_best": batch / min(ts),
            "seconds_per_batch": [round(t, 4) for t in ts],
        }
    res["fused_vs_torch"] = res["ort_fused"]["images_per_s_median"] / res["torch_eager"]["images_per_s_median"]
    res["portable_vs_torch"] = res["ort_portable"]["images_per_s_median"] / res["torch_eager"]["images_per_s_median"]
    res["fused_vs_portable"] = res["ort_fused"]["images_per_s_median"] / res["ort_portable"]["images_per_s_median"]
    res["max_abs_dtoken"] = {
        "fused_vs_torch": float(np.abs(outs["ort_fused"] - outs["torch_eager"]).max()),
        "portable_vs_torch": float(np.abs(outs["ort_portable"] - outs["torch_eager"]).max()),
        "fused_vs_portable": float(np.abs(outs["ort_fused"] - outs["ort_portable"]).max()),
    }
    if profile:
        res["profile_fused"] = _profile_by_op(str(d / "vision.fused.onnx"), feeds, threads)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            run["torch_eager"]()
        top = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
        res["profile_torch_top_ms"] = {e.key: round(e.self_cpu_time_total / 1000, 2) for e in top}
    return res


# ----------------------------------------------------------------------------- start-up


def child_startup(bundle: str, batch: int) -> dict:
    """What a fresh masc-run process pays before and around its first batch (seconds)."""
    t = time.perf_counter()
    import numpy as np

    from masc_engine.engine.bundle import Bundle
    from masc_engine.jobs.pairs import run_pairs  # noqa: F401  (what masc-run imports)
    from masc_engine.runtime.scorer import Scorer
    from masc_engine.runtime.text import PromptTokenizer, TextSettings

    out = {"import_s": time.perf_counter() - t}
    import warnings

    warnings.simplefilter("ignore")
    t = time.perf_counter()
    b = Bundle(bundle, verify=True)
    out["bundle_load_verified_s"] = time.perf_counter() - t
    t = time.perf_counter()
    b = Bundle(bundle, verify=False)
    out["bundle_load_unverified_s"] = time.perf_counter() - t
    out["bundle_bytes"] = sum((Path(bundle) / f).stat().st_size for f in b.manifest["files"])
    t = time.perf_counter()
    PromptTokenizer(b.file(b.manifest["text"]["tokenizer_file"]), TextSettings.from_manifest(b.manifest["text"]))
    out["tokenizer_load_s"] = time.perf_counter() - t
    sessions = {}
    for variant in ("ort-cpu", "portable"):
        for g in ("vision", "text", "pool", "cp"):
            if variant == "ort-cpu" and g not in b.manifest["variants"]["ort-cpu"]["graphs"]:
                continue
            t = time.perf_counter()
            b.runner(g, variant=variant)
            sessions[f"{variant}/{g}"] = round(time.perf_counter() - t, 3)
    out["session_create_s"] = sessions
    t = time.perf_counter()
    s = Scorer(b)
    out["scorer_init_s"] = time.perf_counter() - t
    out["scorer_graph_variant"] = s.graph_variant
    from masc_engine.export.validate import synthetic_image

    budget = s.image_settings.max_num_patches
    imgs = [synthetic_image(256 + 16 * i, 256, seed=i) for i in range(batch)]
    for k in ("first_batch_s", "second_batch_s"):
        t = time.perf_counter()
        s.encode_images(imgs)
        out[k] = time.perf_counter() - t
    t = time.perf_counter()
    s.encode_texts(["a dog on the beach"])
    out["first_prompt_s (text session made lazily)"] = time.perf_counter() - t
    out["budget"] = budget
    del np
    return out


# ----------------------------------------------------------------------------- whole job


def child_masc_metric(checkpoint: str, pairs: str, budget: int) -> dict:
    """A masc-metric 0.3.0 loop over ``MaSC.score`` (the whole process is timed by the parent)."""
    t = time.perf_counter()
    import resource
    import warnings

    warnings.simplefilter("ignore")
    import numpy as np
    import torch
    from masc import MaSC
    from PIL import Image

    t_import = time.perf_counter() - t
    t = time.perf_counter()
    m = MaSC(model_id=checkpoint, device="cpu", naflex_max_patches=budget)
    t_load = time.perf_counter() - t
    rows = list(csv.DictReader(open(pairs)))
    cps, pfs = [], []
    t = time.perf_counter()
    for r in rows:
        res = m.score(
            Image.open(r["ref_image"]),
            np.array(Image.open(r["ref_mask"]).convert("L")),
            Image.open(r["out_image"]),
            np.array(Image.open(r["out_mask"]).convert("L")),
            r["prompt"],
            r["object_name"],
        )
        cps.append(res.cp)
        pfs.append(res.pf)
    return {
        "import_s": t_import,
        "model_load_s": t_load,
        "loop_s": time.perf_counter() - t,
        "pairs": len(rows),
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "cp": cps,
        "pf": pfs,
    }


def run_child(fn: str, *args) -> tuple[dict, float]:
    """Run ``fn(*args)`` in a fresh Python process; returns (its result, wall seconds spawn->exit)."""
    return workloads.run_child("cpu_throughput", fn, *args)


def masc_run_process(
    bundle: Path, pairs: Path, out: Path, extra: list[str], stages: Path | None = None
) -> tuple[dict, float, dict | None]:
    """``masc-run`` as a user runs it, in a fresh process (bench/workloads.py ``masc_run``); returns
    (its meta.json, wall seconds, its stage split when ``stages`` names a file)."""
    import resource

    meta, wall, split = workloads.masc_run(pairs, bundle, out, extra, stages)
    meta["peak_rss_mb_children"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return meta, wall, split


def machine() -> dict:
    """bench/workloads.py ``machine`` (CPU, cores, memory, ISA flags, versions)."""
    return workloads.machine(("onnxruntime", "openvino", "torch", "transformers"))


_load = workloads.loadavg


def part_vision(a, work: Path) -> list[dict]:
    results = []
    for shape in a.vision_shapes.split(","):
        preset, budget, batch = shape.split(":")
        before = _load()
        run_child("child_export_vision", f"{preset}-naflex", int(budget), str(work))
        res, _ = run_child(
            "child_vision_bench", f"{preset}-naflex", int(budget), int(batch), a.reps, a.threads, str(work), a.profile
        )
        res["loadavg_before"], res["loadavg_after"] = before, _load()
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if not k.startswith("profile")}, indent=1), flush=True)
    return results


def part_job(a, work: Path) -> dict:
    import numpy as np

    from masc_engine.export.exporter import export_bundle
    from masc_engine.jobs.results import read_output

    subjects = [(r["subject"], r["class"]) for r in csv.DictReader(open(SHARED / "subjects.csv"))][: a.references]
    pairs = dreambench_pairs(work, SHARED, subjects, a.prompts, a.methods)
    bundle = work / f"base-naflex-{a.budget}"
    if not (bundle / "manifest.json").is_file() or "variants" not in json.loads((bundle / "manifest.json").read_text()):
        export_bundle("random:base-naflex", bundle, max_num_patches=a.budget)
    manifest = json.loads((bundle / "manifest.json").read_text())
    checkpoint = manifest["source"]["checkpoint_dir"]
    before = _load()
    startup, _ = run_child("child_startup", str(bundle), a.batch_size)
    stages = work / "stages.json" if a.profile_stages else None
    meta, wall_ours, split = masc_run_process(
        bundle, pairs, work / "scores.csv", ["--batch-size", str(a.batch_size)], stages
    )
    ref, wall_ref = run_child("child_masc_metric", checkpoint, str(pairs), a.budget)
    after = _load()
    rows = read_output(work / "scores.csv")
    d_cp = np.abs(np.array([float(r["cp"]) for r in rows]) - np.array(ref["cp"]))
    d_pf = np.abs(np.array([float(r["pf"]) for r in rows]) - np.array(ref["pf"]))
    n_imgs = len({r["ref_image"] for r in rows} | {r["out_image"] for r in rows})
    return {
        "model": "random:base-naflex (width 768, 12 layers)",
        "budget": a.budget,
        "workload": {
            "pairs": len(rows),
            "references": a.references,
            "prompts": a.prompts,
            "methods": a.methods,
            "distinct_images": n_imgs,
            "masc_metric_image_encodes": 2 * len(rows),
        },
        "masc_run": {
            "whole_process_s": wall_ours,
            "in_run_s": meta["seconds"],
            "graph_variant": meta["settings"]["graph_variant"],
            "batch_size": a.batch_size,
            "onnxruntime_threads": "default (all cores)",
            "pairs_per_s_whole_process": len(rows) / wall_ours,
        },
        "masc_metric": {
            "whole_process_s": wall_ref,
            "import_s": ref["import_s"],
            "model_load_s": ref["model_load_s"],
            "loop_s": ref["loop_s"],
            "torch_threads": ref["torch_threads"],
            "peak_rss_mb": ref["peak_rss_mb"],
            "pairs_per_s_whole_process": len(rows) / wall_ref,
        },
        "ratio_whole_process": wall_ref / wall_ours,
        "ratio_in_run": ref["loop_s"] / meta["seconds"],
        "scores": {
            "max_abs_dcp": float(np.nanmax(d_cp)),
            "max_abs_dpf": float(np.nanmax(d_pf)),
            "nan_mismatch": int(np.sum(np.isnan([float(r["cp"]) for r in rows]) != np.isnan(ref["cp"]))),
        },
        "masc_run_startup": startup,
        "masc_run_stages": split,
        "loadavg_before": before,
        "loadavg_after": after,
    }


def vision_fraction(job: dict, probe: dict, budget: int) -> dict:
    """The vision graph's measured run time against the time its FLOP need at the probe's GEMM rate
    (fp32; base vision tower ~46.3 GFLOP per image at 256 patches, its linear layers and attention)."""
    gflop = 46.3 * budget / 256
    fp32 = workloads.limit_rate(probe, "fp32")
    run = sum(v for k, v in job["masc_run_stages"]["graph_run_s"].items() if k.endswith("/vision"))
    need = job["workload"]["distinct_images"] * gflop / fp32 if fp32 and run else None
    return {
        "vision_graph_run_s": run,
        "vision_s_at_fp32_limit": need,
        "fraction_of_limit": need / run if need else None,
        "job_fraction_at_vision_limit": need / job["masc_run"]["whole_process_s"] if need else None,
    }


def main() -> None:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(REPO / "out" / "bench-cpu"))
    ap.add_argument("--parts", default="vision,job", help="comma list of: vision, job (job includes start-up)")
    ap.add_argument(
        "--vision-shapes", default="base:256:8,so400m:1024:2", help="preset:budget:batch list for the per-image part"
    )
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per side (per-image part)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for torch and ONNX Runtime")
    ap.add_argument("--profile", action="store_true", help="per-image part: profile by op type")
    ap.add_argument("--references", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--methods", type=int, default=2)
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument(
        "--profile-stages", action="store_true", help="job part: masc-run's stage split (MASC_PROFILE_STAGES)"
    )
    ap.add_argument("--no-probe", action="store_true", help="skip the GEMM probe of the machine's limit")
    ap.add_argument("--int8", action="store_true", help="also quantize, gate and time an int8 bundle (job part)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "cpu_throughput.json"))
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(a.out)
    result = json.loads(out.read_text()) if out.is_file() else {}
    if result.get("layout") != LAYOUT or {"vision", "job"} <= set(a.parts.split(",")):
        result = {"layout": LAYOUT}  # a full run (or an old layout) starts a fresh file; one part updates its key
    result.update(
        script="bench/cpu_throughput.py",
        command=" ".join([sys.executable, *sys.argv]),
        machine=machine(),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        load_note="load averages are recorded per part; ratios are side by side in one run",
    )
    parts = a.parts.split(",")
    if not a.no_probe:
        result["machine_limit"] = workloads.gemm_probe()
    if "vision" in parts:
        result["vision_per_image"] = part_vision(a, work)
        out.write_text(json.dumps(result, indent=2) + "\n")
    if "job" in parts:
        result["job"] = part_job(a, work)
        if "machine_limit" in result and result["job"].get("masc_run_stages"):
            result["job"]["vision_fraction_of_limit"] = vision_fraction(
                result["job"], result["machine_limit"], a.budget
            )
        out.write_text(json.dumps(result, indent=2) + "\n")
        if a.int8:
            result["int8"] = _int8(a, work)
            out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "vision_per_image"}, indent=2, default=str))


def _int8(a, work: Path) -> dict:
    """Quantize the fp32 bundle, gate it on the shared pairs, time masc-run on it (even if refused)."""
    from masc_engine.jobs.int8_gate import Int8GateError, quantize_bundle

    bundle = work / f"base-naflex-{a.budget}"
    int8, refused = work / f"base-naflex-{a.budget}-int8", work / f"base-naflex-{a.budget}-int8-refused"
    try:
        gate = quantize_bundle(bundle, int8, SHARED / "pairs.csv", keep_refused_at=refused)
        entry, timed = {"gates": gate, "accepted": True}, int8
    except Int8GateError as e:
        entry = {
            "accepted": False,
            "refused": str(e),
            "gates": e.report,
            "note": "refused by its gates on these random weights; timed for reference only",
        }
        timed = refused
    pairs = work / "pairs.csv"
    _, wall, _ = masc_run_process(timed, pairs, work / "scores-int8.csv", ["--batch-size", str(a.batch_size)])
    entry.update(whole_process_s=wall, fp32_reference_graphs="ort-cpu (fused)", int8_graphs="portable, quantized")
    return entry


if __name__ == "__main__":
    main()
