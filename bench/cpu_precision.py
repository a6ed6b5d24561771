"""bf16 on the CPU (OpenVINO) against fp32, side by side in one run: per image, per whole job, and
the speed/fidelity frontier per number of encoder layers kept in fp32.

Per shape (``--shapes``, default ``base:256,so400m:1024``: random-weight SigLIP2 of base / so400m
shape, NaFlex budget 256 / 1024):

- ``prepare``: export the fp32 bundle (cached in ``--work``) and certify a copy for bf16 on
  OpenVINO (export/cpu_precision.py ``certify_bundle``: default calibration and held-out pairs);
  the certificate (units kept in fp32, gate figures) is recorded. A refused certificate is
  recorded too and the bf16 sides are then timed uncertified (whole graph in bf16), marked so.
- ``per_image``: the vision graph only, one cold process per shape, sides interleaved so machine
  load hits all alike: ONNX Runtime fp32 (fused ``ort-cpu`` graph, masc-run's default), OpenVINO
  f32, OpenVINO bf16 as certified, and PyTorch eager fp32 ``vision_model`` as masc-metric 0.3.0
  loads it; same batch of square images filling the budget, same threads.
- ``frontier``: for k = 0 .. all units kept in fp32 (``--frontier-ks``), in the order of single-unit
  sensitivity (the certificate's, or measured here when the whole graph passed): per-image speed-up
  of the vision graph against ONNX Runtime fp32 (interleaved, one process) and the gate figures on
  the held-out pairs against fp32 ONNX Runtime (max |dCP|, max |dPF|, Spearman CP / PF). Written as
  a table (``cpu_precision_frontier.md``, its rows in ``cpu_precision_frontier.json``) and a plot (``cpu_precision_frontier.svg``: speed-up
  against max |dPF| and against 1 - Spearman PF, one point per k).
- ``job``: the DreamBench-shaped workload (bench/workloads.py ``dreambench_pairs`` on the shared
  DreamBooth set, or the shipped examples without it), each side one cold whole process timed
  spawn to exit: ``masc-run`` (CLI, fp32 ONNX Runtime: today's default), the pairs job
  (jobs/pairs.py ``run_pairs``, what masc-run runs) with ONNX Runtime fp32, with OpenVINO f32 and
  with the certified bf16 bundle on OpenVINO, and a masc-metric 0.3.0 loop over ``MaSC.score``.
  Ratios are against the masc-metric loop; scores are compared pair by pair (fp32 sides against
  masc-metric, the bf16 side against fp32 ONNX Runtime). masc-run is also timed as users run it
  with its stage split (``MASC_PROFILE_STAGES``): fp32, and the certified bundle on OpenVINO once
  on an empty cache root (every graph compiled) and once on the same root (compiled graphs
  imported). With ``--text-bf16`` a second copy is certified with the text tower too
  (``graphs=("vision", "text")``, masc-export's ``--bf16-graphs vision,text``) and masc-run runs it
  the same two ways, so the text graph's compile and run times sit beside the vision-only
  bundle's in the stage splits. With the GEMM probe (unless ``--no-probe``: bench/workloads.py ``gemm_probe``, run
  first) each ratio is also stated as a fraction of the machine's limit in its precision.
- ``profile`` (only when asked): OpenVINO's per-node timings of one bf16 vision call, by node type
  and kernel.

Timings are meaningful only on an idle machine: load averages are recorded before and after each
part. Run (repo root, test venv with the openvino extra):

    flock /tmp/masc-heavy.lock python bench/cpu_precision.py
    python bench/cpu_precision.py --shapes tiny:64 --reps 1 --references 2 --prompts 1 --methods 1 \\
        --out-dir /tmp/cpu-precision-check     # the quick check that every part runs
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import workloads  # noqa: E402
from workloads import dreambench_pairs  # noqa: E402

SHARED = REPO.parent / "shared" / "data" / "dreambooth"
EXAMPLES = REPO / "examples" / "dreambooth"


def _quiet():
    import warnings

    warnings.simplefilter("ignore")


# ----------------------------------------------------------------------------- bundles


def child_prepare(preset: str, budget: int, work: str, text_bf16: bool = False) -> dict:
    """The fp32 bundle of ``random:<preset>-naflex`` at ``budget`` and its bf16-cpu copy (cached);
    with ``text_bf16`` also a copy certified with the text tower (``text_bf16`` in the result)."""
    _quiet()
    from masc_engine.export.exporter import export_bundle

    fp32 = Path(work) / f"{preset}-{budget}"
    cert = Path(work) / f"{preset}-{budget}-bf16cpu"
    info_path = Path(work) / f"{preset}-{budget}-certificate.json"
    if not (fp32 / "manifest.json").is_file():
        export_bundle(
            f"random:{preset}-naflex",
            fp32,
            max_num_patches=budget,
            validate=preset == "tiny",
        )
    info = workloads.certified_copy(fp32, cert, info_path)
    info.update(fp32_bundle=str(fp32), bf16_bundle=str(cert))
    if text_bf16:
        text_cert = Path(work) / f"{preset}-{budget}-bf16cpu-text"
        text_info = workloads.certified_copy(
            fp32, text_cert, Path(work) / f"{preset}-{budget}-certificate-text.json", graphs=("vision", "text")
        )
        info["text_bf16"] = {k: v for k, v in text_info.items() if k != "report"} | {"bundle": str(text_cert)}
    return info


def _units_and_order(info: dict) -> tuple[dict, list[str], list[str]]:
    """(vision unit table, sensitivity order, certified keep list) of a prepared shape."""
    from masc_engine.export.cpu_precision import graph_units

    from masc_engine.engine.bundle import Bundle

    rec = info.get("record") or {}
    search = rec.get("search") or (info.get("report") or {})
    units = (rec.get("units") or {}).get("vision") or graph_units(
        Bundle(info["fp32_bundle"]).graph_file("vision"), "vision"
    )
    return units, list(search.get("order") or []), list(rec.get("keep_fp32") or [])


def child_order(info: dict) -> list[str]:
    """The sensitivity order of the vision units: the certificate's, else measured on the default
    calibration pairs (when the whole graph passed, the certification had no need to rank them)."""
    _quiet()
    from masc_engine.export.cpu_precision import Evaluator, default_calibration, sensitivity_order, unit_sensitivity

    _, order, _ = _units_and_order(info)
    if order:
        return order
    ev = Evaluator(info["fp32_bundle"])
    cal, _ = default_calibration()
    return sensitivity_order(unit_sensitivity(ev, cal), ev.unit_names)


# ----------------------------------------------------------------------------- per image


def _square_feeds(bundle, batch: int) -> tuple[dict, list]:
    """Vision feeds for ``batch`` square synthetic images whose patch grid fills the budget."""
    import numpy as np

    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.position import position_weights
    from masc_engine.runtime.preprocess import ImageSettings, preprocess_image

    im = bundle.manifest["image"]
    side = int(round(im["max_num_patches"] ** 0.5)) * im["patch_size"]
    imgs = [synthetic_image(side, side, seed=i) for i in range(batch)]
    pre = [preprocess_image(x, ImageSettings.from_manifest(im)) for x in imgs]
    feeds = {
        "pixel_values": np.stack([p.pixel_values for p in pre]),
        "pixel_attention_mask": np.stack([p.pixel_attention_mask for p in pre]),
        "position_weights": np.stack(
            [position_weights(im["position_grid"], p.spatial_shape, im["max_num_patches"]) for p in pre]
        ),
    }
    return feeds, imgs


def _torch_side(bundle, imgs, threads: int):
    """PyTorch eager fp32 ``vision_model`` as masc-metric 0.3.0 loads it, on processor inputs."""
    import torch
    from transformers import AutoModel, AutoProcessor

    ckpt = bundle.manifest["source"]["checkpoint_dir"]
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    vm = AutoModel.from_pretrained(ckpt).vision_model.eval()
    x = AutoProcessor.from_pretrained(ckpt).image_processor(
        images=imgs, max_num_patches=bundle.manifest["image"]["max_num_patches"], return_tensors="pt"
    )
    return lambda: vm(
        pixel_values=x["pixel_values"],
        pixel_attention_mask=x["pixel_attention_mask"],
        spatial_shapes=x["spatial_shapes"],
    ).last_hidden_state.numpy()


def _interleaved(run: dict, reps: int, batch: int) -> dict:
    """Warm each side once, then ``reps`` interleaved rounds; images/s (median, best)."""
    import numpy as np

    for f in run.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in run}
    for _ in range(reps):
        for k, f in run.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {
        k: {
            "images_per_s_median": batch / float(np.median(ts)),
            "images_per_s_best": batch / min(ts),
            "seconds_per_batch": [round(t, 4) for t in ts],
        }
        for k, ts in times.items()
    }


def child_per_image(
    info: dict, order: list[str], ks: list[int], batch: int, reps: int, threads: int, with_torch: bool
) -> dict:
    """Vision graph images/s: ONNX Runtime fp32 (fused), OpenVINO f32, certified bf16, torch eager,
    and OpenVINO bf16 with the first k units of ``order`` in fp32 for each k (the frontier)."""
    _quiet()
    import numpy as np

    from masc_engine.engine.backends.openvino import OpenVINORunner
    from masc_engine.engine.bundle import Bundle

    b = Bundle(info["fp32_bundle"])
    units, _, keep = _units_and_order(info)
    feeds, imgs = _square_feeds(b, batch)
    path = b.graph_file("vision")
    runners = {
        "ort_fp32_fused": b.runner("vision", variant="ort-cpu", intra_op_threads=threads),
        "openvino_f32": OpenVINORunner(path, "vision", "f32", threads=threads),
        ("openvino_bf16_certified" if info["certified"] else "openvino_bf16_uncertified"): OpenVINORunner(
            path, "vision", "bf16", threads, units, keep
        ),
    }
    for k in ks:
        runners[f"openvino_bf16_k{k}"] = OpenVINORunner(path, "vision", "bf16", threads, units, order[:k])
    run = {name: (lambda r=r: r.run(feeds)["last_hidden_state"]) for name, r in runners.items()}
    if with_torch:
        run["torch_eager_fp32"] = _torch_side(b, imgs, threads)
    res = _interleaved(run, reps, batch)
    ref = run["ort_fp32_fused"]()
    base = res["ort_fp32_fused"]["images_per_s_median"]
    for name, r in res.items():
        r["speedup_vs_ort_fp32"] = r["images_per_s_median"] / base
        r["max_abs_dtoken_vs_ort_fp32"] = float(np.abs(run[name]() - ref).max())
    res["segments_bf16"] = [r for k, r in runners.items() if k.startswith("openvino_bf16_")][0].runtime_summary()
    res["settings"] = {
        "batch": batch,
        "reps": reps,
        "threads": threads,
        "openvino_threads": runners["openvino_f32"].threads,
        "budget": b.manifest["image"]["max_num_patches"],
        "keep_fp32_certified": keep,
    }
    return res


def child_vision_profile(info: dict, batch: int, threads: int) -> dict:
    """OpenVINO's per-node timings (``PERF_COUNT``) of one call of the certified bf16 vision graph on
    ``batch`` square images filling the budget: milliseconds per node type and per (node type,
    kernel), e.g. ``FullyConnected`` on ``brgemm_avx512_amx_bf16``; where the vision time goes
    besides the linear layers the GEMM probe rates."""
    _quiet()
    from collections import Counter

    from masc_engine.engine.backends.openvino import compile_config, core
    from masc_engine.engine.bundle import Bundle

    b = Bundle(info["bf16_bundle"] if info["certified"] else info["fp32_bundle"])
    feeds, _ = _square_feeds(b, batch)
    cfg = {**compile_config("bf16", threads), "PERF_COUNT": True}
    req = core().compile_model(core().read_model(str(b.graph_file("vision"))), "CPU", cfg).create_infer_request()
    for _ in range(2):
        req.infer(feeds)
    t = time.perf_counter()
    req.infer(feeds)
    wall = time.perf_counter() - t
    by_type, by_kernel = Counter(), Counter()
    for p in req.profiling_info:
        ms = p.real_time.total_seconds() * 1e3
        by_type[p.node_type] += ms
        by_kernel[f"{p.node_type}:{p.exec_type}"] += ms
    total = sum(by_type.values())
    return {
        "batch": batch,
        "call_s": wall,
        "node_ms_total": total,
        "ms_by_node_type": {k: round(v, 2) for k, v in by_type.most_common() if v >= 0.05},
        "share_by_node_type": {k: round(v / total, 4) for k, v in by_type.most_common() if v >= 0.05},
        "ms_by_kernel": {k: round(v, 2) for k, v in by_kernel.most_common() if v >= 0.05},
        "whole_graph_bf16": not (info.get("record") or {}).get("keep_fp32"),
    }


# ----------------------------------------------------------------------------- frontier fidelity


def child_frontier_fidelity(info: dict, order: list[str], ks: list[int]) -> dict:
    """Gate figures on the default held-out pairs for each k (first k units of ``order`` in fp32)."""
    _quiet()
    from masc_engine.export.cpu_precision import Evaluator, default_heldout
    from masc_engine.tolerances import FIDELITY_MIN_PAIRS

    ev = Evaluator(info["fp32_bundle"])
    held, desc = default_heldout()
    out = {"pairs": desc, "k": {}}
    for k in ks:
        f = ev.figures(order[:k], held, FIDELITY_MIN_PAIRS)
        g = f["gates"]
        out["k"][str(k)] = {
            "keep_fp32": order[:k],
            "pass": f["pass"],
            "max_abs_dcp": g["max_abs_dcp"]["value"],
            "max_abs_dpf": g["max_abs_dpf"]["value"],
            "spearman_cp": g["spearman_cp"]["value"],
            "spearman_pf": g["spearman_pf"]["value"],
            "mean_abs_dpf": f["mean_abs_dpf"],
        }
        print(f"k={k}: {out['k'][str(k)]}", flush=True)
    return out


def frontier_rows(per_image: dict, fidelity: dict, ks: list[int]) -> list[dict]:
    return [
        {"k": k, "speedup": per_image[f"openvino_bf16_k{k}"]["speedup_vs_ort_fp32"], **fidelity["k"][str(k)]}
        for k in ks
    ]


def frontier_table(shape: str, rows: list[dict]) -> str:
    lines = [
        f"### {shape}",
        "",
        "| layers kept in fp32 | speed-up vs ORT fp32 (vision, per image) | max abs dCP | "
        "max abs dPF | Spearman CP | Spearman PF | gates (held-out) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['k']} | {r['speedup']:.2f}x | {r['max_abs_dcp']:.2e} | {r['max_abs_dpf']:.2e} | "
            f"{r['spearman_cp']:.6f} | {r['spearman_pf']:.6f} | {'pass' if r['pass'] else 'fail'} |"
        )
    return "\n".join(lines) + "\n"


def frontier_plot(frontiers: dict[str, list[dict]], path: Path) -> None:
    """Speed-up against max |dPF| and against 1 - Spearman PF, one point per k, a line per shape."""
    import matplotlib

    matplotlib.use("Agg")  # savefig picks the format from the file name (svg in bench/results)
    import matplotlib.pyplot as plt

    from masc_engine.tolerances import FIDELITY_MAX_ABS_DELTA, FIDELITY_MIN_SPEARMAN

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for shape, rows in frontiers.items():
        xs = [r["speedup"] for r in rows]
        for ax, ys in zip(axes, ([r["max_abs_dpf"] for r in rows], [max(1 - r["spearman_pf"], 1e-9) for r in rows])):
            ax.plot(xs, ys, "o-", label=shape)
            for r, x, y in zip(rows, xs, ys):
                ax.annotate(str(r["k"]), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for ax, bound, label in (
        (axes[0], FIDELITY_MAX_ABS_DELTA, "max |dPF| (held-out pairs)"),
        (axes[1], 1 - FIDELITY_MIN_SPEARMAN, "1 - Spearman PF"),
    ):
        ax.axhline(bound, color="grey", ls="--", lw=1, label="gate")
        ax.set_yscale("log")
        ax.set_xlabel("vision speed-up vs ONNX Runtime fp32 (per image)")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("OpenVINO bf16: speed vs fidelity, labels = encoder units kept in fp32")
    fig.tight_layout()
    fig.savefig(path)


# ----------------------------------------------------------------------------- whole job


def child_pairs_job(bundle: str, pairs: str, out: str, backend: str, precision: str | None, batch: int) -> dict:
    """The pairs job (what masc-run runs) with one engine; the parent times the whole process."""
    _quiet()
    t = time.perf_counter()
    from masc_engine.jobs.pairs import RunOptions, run_pairs
    from masc_engine.runtime.scorer import Scorer

    t_import = time.perf_counter() - t
    t = time.perf_counter()
    scorer = Scorer(bundle, backend=backend, precision=precision, batch_size=batch)
    t_load = time.perf_counter() - t
    for p in Path(out).parent.glob(Path(out).name + "*"):
        p.unlink()
    t = time.perf_counter()
    run_pairs(pairs, scorer, out, options=RunOptions(progress=False))
    return {
        "import_s": t_import,
        "scorer_s": t_load,
        "run_s": time.perf_counter() - t,
        "precision": scorer.precision,
        "graph_variant": scorer.graph_variant,
    }


def child_masc_metric(checkpoint: str, pairs: str, budget: int) -> dict:
    """A masc-metric 0.3.0 loop over ``MaSC.score``."""
    _quiet()
    t = time.perf_counter()
    import numpy as np
    from masc import MaSC
    from PIL import Image

    t_import = time.perf_counter() - t
    m = MaSC(model_id=checkpoint, device="cpu", naflex_max_patches=budget)
    base = Path(pairs).parent
    cps, pfs = [], []
    t = time.perf_counter()
    for r in csv.DictReader(open(pairs)):
        res = m.score(
            Image.open(base / r["ref_image"]),
            np.array(Image.open(base / r["ref_mask"]).convert("L")),
            Image.open(base / r["out_image"]),
            np.array(Image.open(base / r["out_mask"]).convert("L")),
            r["prompt"],
            r["object_name"],
        )
        cps.append(res.cp)
        pfs.append(res.pf)
    return {"import_s": t_import, "loop_s": time.perf_counter() - t, "cp": cps, "pf": pfs}


def run_child(fn: str, *args) -> tuple[object, float]:
    """``fn(*args)`` of this script in a fresh Python process: (its result, wall seconds spawn->exit)."""
    return workloads.run_child("cpu_precision", fn, *args)


def _scores(path: Path):
    import numpy as np

    from masc_engine.jobs.results import read_output

    rows = read_output(path)
    return np.array([float(r["cp"]) for r in rows]), np.array([float(r["pf"]) for r in rows])


def _workload(a, work: Path) -> Path:
    root = SHARED if (SHARED / "subjects.csv").is_file() else EXAMPLES
    if root == SHARED:
        subjects = [(r["subject"], r["class"]) for r in csv.DictReader(open(SHARED / "subjects.csv"))]
    else:
        subjects = [(d.name, d.name.rstrip("0123456789")) for d in sorted((EXAMPLES / "images").iterdir())]
    return dreambench_pairs(work, root, subjects[: a.references], a.prompts, a.methods)


def part_job(a, info: dict, work: Path) -> dict:
    import numpy as np

    from masc_engine.export.cpu_precision import gate_figures

    pairs = _workload(a, work / "job")
    fp32, bf16 = info["fp32_bundle"], info["bf16_bundle"]
    manifest = json.loads((Path(fp32) / "manifest.json").read_text())
    before = [round(x, 2) for x in os.getloadavg()]
    cli = _cli_sides(a, info, pairs, work / "job")
    sides = {}
    engines = [("ort_fp32", fp32, "onnxruntime", None), ("openvino_f32", fp32, "openvino", "fp32")]
    if info["certified"]:  # the scorer never runs an uncertified bundle in bf16 (per_image/frontier time it)
        engines.append(("openvino_bf16_certified", bf16, "openvino", None))
    for name, bundle, backend, prec in engines:
        sides[name] = run_child(
            "child_pairs_job", bundle, str(pairs), str(work / "job" / f"{name}.csv"), backend, prec, a.batch_size
        )
    ref, wall_ref = run_child(
        "child_masc_metric", manifest["source"]["checkpoint_dir"], str(pairs), manifest["image"]["max_num_patches"]
    )
    out = {
        "workload": {"pairs": len(ref["cp"]), "references": a.references, "prompts": a.prompts, "methods": a.methods},
        "masc_metric": {"whole_process_s": wall_ref, "loop_s": ref["loop_s"], "import_s": ref["import_s"]},
        "loadavg_before": before,
    }
    cp_ref, pf_ref = np.array(ref["cp"]), np.array(ref["pf"])
    ort = _scores(work / "job" / "ort_fp32.csv")
    for name, (meta, wall) in sides.items():
        cp, pf = _scores(work / "job" / f"{name}.csv")
        entry = {
            "whole_process_s": wall,
            "ratio_vs_masc_metric": wall_ref / wall,
            **meta,
            "max_abs_dcp_vs_masc_metric": float(np.nanmax(np.abs(cp - cp_ref))),
            "max_abs_dpf_vs_masc_metric": float(np.nanmax(np.abs(pf - pf_ref))),
        }
        if "bf16" in name:
            g = gate_figures({"cp": ort[0], "pf": ort[1]}, {"cp": cp, "pf": pf})
            entry["vs_ort_fp32"] = {k: v["value"] for k, v in g["gates"].items()}
        out[name] = entry
    for name, entry in cli.items():
        cp, pf = _scores(work / "job" / f"{name}.csv")
        entry["ratio_vs_masc_metric"] = wall_ref / entry["whole_process_s"]
        entry["max_abs_dcp_vs_masc_metric"] = float(np.nanmax(np.abs(cp - cp_ref)))
        entry["max_abs_dpf_vs_masc_metric"] = float(np.nanmax(np.abs(pf - pf_ref)))
        g = gate_figures({"cp": ort[0], "pf": ort[1]}, {"cp": cp, "pf": pf})
        entry["vs_ort_fp32"] = {k: v["value"] for k, v in g["gates"].items()}
        out[name] = entry
    if getattr(a, "probe", None):
        out["limit"] = job_limit(a.probe, fp32, pairs, wall_ref, out)
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def _cli_sides(a, info: dict, pairs: Path, work: Path) -> dict:
    """masc-run as a user runs it, each a cold process with its stage split (MASC_PROFILE_STAGES):
    fp32 (ONNX Runtime, the default) and, on a certified bundle, bf16 on OpenVINO (``--backend
    auto`` picks it) twice on one cache root: first empty (OpenVINO compiles and stores each graph),
    then warm (it imports the compiled graphs: what every later process of a job pays)."""
    extra = ["--batch-size", str(a.batch_size)]
    runs = [("masc_run_cli_ort_fp32", info["fp32_bundle"], "cache-fp32")]
    if info["certified"]:
        runs += [
            ("masc_run_cli_bf16_empty_cache", info["bf16_bundle"], "cache-bf16"),
            ("masc_run_cli_bf16_warm_cache", info["bf16_bundle"], "cache-bf16"),
        ]
    text = info.get("text_bf16") or {}
    if text.get("certified"):
        runs += [
            ("masc_run_cli_bf16_text_empty_cache", text["bundle"], "cache-bf16-text"),
            ("masc_run_cli_bf16_text_warm_cache", text["bundle"], "cache-bf16-text"),
        ]
    for d in {c for _, _, c in runs}:
        shutil.rmtree(work / d, ignore_errors=True)
    out = {}
    for name, bundle, cache in runs:
        env = {"MASC_ENGINE_CACHE": str(work / cache)}
        meta, wall, split = workloads.masc_run(
            pairs, Path(bundle), work / f"{name}.csv", extra, work / f"{name}.stages.json", env
        )
        split.pop("raw", None)
        out[name] = {
            "whole_process_s": wall,
            "backend": meta["settings"].get("backend"),
            "precision": meta["settings"].get("precision"),
            "stages": split,
            "loadavg_after": workloads.loadavg(),
        }
    return out


def job_limit(probe: dict, bundle: str, pairs: Path, wall_ref: float, job: dict) -> dict:
    """The job's physical limit from the GEMM probe: the vision tower's FLOP on each distinct image
    (padded to the NaFlex budget, as the graph runs it; bench/gpu_throughput.py ``flops_per_image``)
    at the probe's best rate per precision, against the masc-metric loop's wall; each side's ratio
    as a fraction of the limit ratio of its precision."""
    from gpu_throughput import flops_per_image

    m = json.loads((Path(bundle) / "manifest.json").read_text())
    cfg = json.loads((Path(m["source"]["checkpoint_dir"]) / "config.json").read_text())["vision_config"]
    budget = m["image"]["max_num_patches"]
    gflop = flops_per_image(cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], budget) / 1e9
    rows = list(csv.DictReader(open(pairs)))
    images = len({r["ref_image"] for r in rows} | {r["out_image"] for r in rows})
    out = {"distinct_images": images, "vision_gflop_per_image": gflop}
    for prec in ("fp32", "bf16"):
        rate = workloads.limit_rate(probe, prec)
        if not rate:
            out[prec] = "no native rate measured"
            continue
        vision_s = images * gflop / rate
        out[prec] = {"gemm_gflops": rate, "vision_s_at_limit": vision_s, "limit_ratio": wall_ref / vision_s}
        for name, side in job.items():
            if isinstance(side, dict) and "ratio_vs_masc_metric" in side and (prec == "bf16") == ("bf16" in name):
                out[prec][f"fraction_of_limit:{name}"] = side["ratio_vs_masc_metric"] / (wall_ref / vision_s)
    return out


# ----------------------------------------------------------------------------- main


def machine() -> dict:
    import onnxruntime
    import openvino

    from masc_engine.engine.backends.openvino import core

    flags = set()
    try:
        flags = {f for ln in open("/proc/cpuinfo") if ln.startswith("flags") for f in ln.split()}
    except OSError:
        pass
    return {
        "cpu": str(core().get_property("CPU", "FULL_DEVICE_NAME")),
        "cores": os.cpu_count(),
        "cpu_flags": sorted(flags & {"avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni", "amx_tile"}),
        "openvino_capabilities": list(core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "openvino": openvino.__version__,
    }


def _ks(spec: str, n_units: int) -> list[int]:
    ks = sorted({n_units if k == "all" else min(int(k), n_units) for k in spec.split(",")})
    return ks


def run_shape(a, shape: str, work: Path) -> tuple[dict, list[dict] | None]:
    preset, budget = shape.split(":")
    info, _ = run_child("child_prepare", preset, int(budget), str(work), a.text_bf16)
    res = {"certificate": {k: v for k, v in info.items() if k not in ("report", "text_bf16")}}
    if a.text_bf16:
        res["certificate_with_text"] = info["text_bf16"]
    parts = a.parts.split(",")
    # The sensitivity order (one bf16 compile and calibration run per unit when the whole graph
    # passed) is only the frontier's.
    order = run_child("child_order", info)[0] if "frontier" in parts else []
    units = info["record"]["units"]["vision"] if info.get("certified") else None
    n_units = len(units["names"]) if units else len(order)
    ks = _ks(a.frontier_ks, n_units)
    rows = None
    if "per_image" in parts or "frontier" in parts:
        res["per_image"], _ = run_child(
            "child_per_image",
            info,
            order,
            ks if "frontier" in parts else [],
            a.batch,
            a.reps,
            a.threads,
            not a.no_torch,
        )
    if "profile" in parts:
        res["vision_profile"], _ = run_child("child_vision_profile", info, a.batch_size, a.threads)
    if "frontier" in parts:
        res["frontier_fidelity"], _ = run_child("child_frontier_fidelity", info, order, ks)
        rows = frontier_rows(res["per_image"], res["frontier_fidelity"], ks)
    if "job" in parts:
        res["job"] = part_job(a, info, work / shape.replace(":", "-"))
    return res, rows


def main() -> None:
    from masc_engine.cli.logs import show_library_log

    show_library_log()  # the export's stage lines on stderr
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="base:256,so400m:1024", help="preset:budget list (tiny:64 for a check)")
    ap.add_argument("--parts", default="per_image,frontier,job", help="comma list; also: profile (OpenVINO per node)")
    ap.add_argument("--work", default=str(REPO / "out" / "bench-cpu-precision"))
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--batch", type=int, default=4, help="images per vision call (per-image part)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--frontier-ks", default="0,1,2,3,4,6,8,12,all", help="units kept in fp32 (all = every unit)")
    ap.add_argument("--no-torch", action="store_true", help="per image: leave out the torch eager side")
    ap.add_argument("--references", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--methods", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8, help="job part: the scorer's batch size")
    ap.add_argument("--no-probe", action="store_true", help="skip the GEMM probe of the machine's limit")
    ap.add_argument(
        "--text-bf16", action="store_true", help="job part: also a copy certified with the text tower, run by masc-run"
    )
    a = ap.parse_args()
    work, out_dir = Path(a.work), Path(a.out_dir)
    work.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "script": "bench/cpu_precision.py",
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shapes": {},
        "note": "ratios are side by side in one run; load averages recorded per part",
    }
    if not a.no_probe:
        result["machine_limit"] = a.probe = workloads.gemm_probe()
        print(json.dumps(a.probe), flush=True)
    frontiers, tables = {}, []
    for shape in a.shapes.split(","):
        result["shapes"][shape], rows = run_shape(a, shape, work)
        (out_dir / "cpu_precision.json").write_text(json.dumps(result, indent=2, default=float) + "\n")
        if rows:
            frontiers[shape] = rows
            tables.append(frontier_table(shape, rows))
    if frontiers:
        (out_dir / "cpu_precision_frontier.json").write_text(
            json.dumps(
                {k: result[k] for k in ("script", "command", "machine", "date", "note")} | {"frontier": frontiers},
                indent=2,
                default=float,
            )
            + "\n"
        )
        (out_dir / "cpu_precision_frontier.md").write_text(
            "# OpenVINO bf16 speed/fidelity frontier (bench/cpu_precision.py)\n\n" + "\n".join(tables)
        )
        frontier_plot(frontiers, out_dir / "cpu_precision_frontier.svg")
    print(json.dumps(result, indent=1, default=float)[:6000])


if __name__ == "__main__":
    main()
