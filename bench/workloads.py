"""Workload generators shared by the benchmark scripts (and tests/test_precision.py).

Two kinds of pairs, both written as a masc-run pairs CSV:

- :func:`dreambench_pairs`: DreamBench-shaped, per subject photo ``00`` as the reference against
  unique outputs (other photos of the subject, mirrored, cropped and colour-shifted per prompt and
  method, so no output image repeats and deduplication cannot help);
- :func:`odd_size_pairs`: existing pairs with every image and its mask cropped and resized to odd
  sizes (off the traced shapes, patch grids that do not divide evenly).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

#: The prompts of the DreamBench-shaped workloads (``{}`` is the subject's class).
PROMPTS = [
    "a {} in the jungle",
    "a {} on the beach",
    "a {} with a city in the background",
    "a {} floating on top of water",
    "a red {}",
    "a {} in the snow",
]

#: ``(width, height)`` of the odd-sized copies, cycled over pairs and over reference/output.
ODD_SIZES = [(333, 517), (517, 333), (401, 299), (257, 263), (480, 271), (199, 601)]


def write_pairs_csv(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def dreambench_pairs(
    work: Path,
    photo_root: Path,
    subjects: list[tuple[str, str]],
    prompts: int = len(PROMPTS),
    methods: int = 2,
    relative_outputs: bool = False,
) -> Path:
    """``work/pairs.csv``: ``len(subjects) * prompts * methods`` pairs, outputs in ``work/outputs``.

    Args:
        photo_root: a folder with ``images/<subject>/*.jpg`` and ``masks/<subject>/*.png``
            (``examples/dreambooth`` or the shared set).
        subjects: ``(subject folder, class noun)`` pairs.
        prompts: how many of :data:`PROMPTS` (cycled past six).
        relative_outputs: output paths relative to ``work`` (else absolute).
    """
    from PIL import Image, ImageEnhance, ImageOps

    out_dir = work / "outputs"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, cls in subjects:
        photos = sorted((photo_root / "images" / name).glob("*.jpg"))[1:]
        for p in range(prompts):
            for m in range(methods):
                k = p * methods + m
                src = photos[k % len(photos)]
                im = Image.open(src).convert("RGB")
                mask = Image.open(photo_root / "masks" / name / (src.stem + ".png")).convert("L")
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
                out = f"outputs/{stem}" if relative_outputs else str(out_dir / stem)
                rows.append(
                    {
                        "key": stem,
                        "subject": name,
                        "method": f"method{m}",
                        "ref_image": str(photo_root / "images" / name / "00.jpg"),
                        "ref_mask": str(photo_root / "masks" / name / "00.png"),
                        "out_image": out + ".jpg",
                        "out_mask": out + ".png",
                        "prompt": PROMPTS[p % len(PROMPTS)].format(cls),
                        "object_name": cls,
                    }
                )
    return write_pairs_csv(work / "pairs.csv", rows)


def odd_size_pairs(rows: list[dict], base: Path, out_dir: Path) -> tuple[Path, list[dict]]:
    """``out_dir/pairs.csv``: ``rows`` (a pairs CSV's rows, paths relative to ``base``) with every
    image and mask cropped by a few pixels and resized to an :data:`ODD_SIZES` size (bicubic
    images, nearest masks). Returns the CSV and its rows."""
    from PIL import Image

    out_rows = []
    for i, r in enumerate(rows):
        row = dict(r)
        for j, (ic, mc) in enumerate((("ref_image", "ref_mask"), ("out_image", "out_mask"))):
            w, h = ODD_SIZES[(i + j) % len(ODD_SIZES)]
            img, mask = Image.open(base / r[ic]).convert("RGB"), Image.open(base / r[mc]).convert("L")
            box = (7, 3, img.width - 5, img.height - 11)
            stem = f"{i:03d}_{j}"
            img.crop(box).resize((w, h), Image.BICUBIC).save(out_dir / f"{stem}.png")
            mask.crop(box).resize((w, h), Image.NEAREST).save(out_dir / f"{stem}_mask.png")
            row[ic], row[mc] = f"{stem}.png", f"{stem}_mask.png"
        out_rows.append(row)
    return write_pairs_csv(out_dir / "pairs.csv", out_rows), out_rows


def run_child(module: str, fn: str, *args) -> tuple[object, float]:
    """``fn(*args)`` of the bench script ``module`` in a fresh Python process (cold: imports, model
    loads and first calls all counted); returns (its JSON result, wall seconds spawn -> exit)."""
    bench = str(Path(__file__).resolve().parent)
    code = (
        f"import json, sys; sys.path.insert(0, {bench!r}); import {module} as b; "
        f"print('RESULT' + json.dumps(b.{fn}(*{args!r}), default=float))"
    )
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - t
    if out.returncode:
        raise RuntimeError(f"{module}.{fn} failed:\n{out.stderr[-4000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT") :]), wall


# ----------------------------------------------------------------------------- timing and the machine

#: CPU flags worth knowing for a figure (AVX-512 bf16, AMX: what a bf16 bundle could use).
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)

#: The SigLIP2 base encoder's largest matmul at a 256-patch batch of 8: [8*256, 768] x [768, 3072].
ENCODER_GEMM = (8 * 256, 768, 3072)


def certified_copy(fp32: Path, cert: Path, info_path: Path, graphs: tuple[str, ...] | None = None) -> dict:
    """A copy ``cert`` of the fp32 bundle certified for bf16-cpu (export/cpu_precision.py
    ``certify_bundle``, default pair sets; ``graphs`` the graphs certified, None its default), made
    once: the outcome is kept in ``info_path`` and read back on later calls. Returns
    ``{"certified": True, "record"}`` (the manifest's certificate) or ``{"certified": False,
    "refused", "report"}``, with ``certify_seconds``."""
    import shutil

    from masc_engine.export.cpu_precision import CertificationError, certify_bundle

    if not info_path.is_file():
        shutil.rmtree(cert, ignore_errors=True)
        shutil.copytree(fp32, cert)
        t = time.perf_counter()
        try:
            info = {"certified": True, "record": certify_bundle(cert, graphs=graphs)}
        except CertificationError as e:
            info = {"certified": False, "refused": str(e), "report": e.report}
        info["certify_seconds"] = time.perf_counter() - t
        info_path.write_text(json.dumps(info, indent=1, default=float))
    return json.loads(info_path.read_text())


def loadavg() -> list[float]:
    """``os.getloadavg()`` rounded (the machine may be shared: record it around each timing)."""
    import os

    return [round(x, 2) for x in os.getloadavg()]


def timed_process(cmd: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd`` as a fresh process (output captured); returns (the result, wall seconds spawn ->
    exit). Raises RuntimeError with the end of its stderr when it fails."""
    import os

    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t
    if res.returncode:
        raise RuntimeError(f"{Path(cmd[0]).name} failed:\n{res.stderr[-4000:]}")
    return res, wall


def masc_run(
    pairs: Path, bundle: Path, out: Path, extra: list[str], stages: Path | None = None, env: dict | None = None
) -> tuple[dict, float, dict | None]:
    """One cold ``masc-run pairs --bundle bundle --out out --no-progress *extra`` (a fresh output:
    nothing to resume); returns (its sidecar, wall seconds spawn -> exit, its stage split or None).

    With ``stages``, the process writes its stage split there (``MASC_PROFILE_STAGES``,
    engine/stage_clock.py) and the split is returned with ``startup_s``: process start (from
    ``/proc``) to the run's start, i.e. interpreter, imports, argument parsing and bundle loads."""
    exe = Path(sys.executable).parent / "masc-run"
    for p in (out, Path(f"{out}.meta.json"), Path(f"{out}.journal.jsonl"), Path(f"{out}.lock")):
        p.unlink(missing_ok=True)
    env = dict(env or {})
    if stages is not None:
        stages.unlink(missing_ok=True)
        env["MASC_PROFILE_STAGES"] = str(stages)
    _, wall = timed_process(
        [str(exe), str(pairs), "--bundle", str(bundle), "--out", str(out), "--no-progress", *extra], env
    )
    meta = json.loads(Path(f"{out}.meta.json").read_text())
    split = None
    if stages is not None:
        raw = json.loads(stages.read_text())
        raw["scorer_bundle"] = Path(bundle).name
        split = stage_split(raw, wall)
    return meta, wall, split


def stage_split(raw: dict, wall: float) -> dict:
    """A process's stage record (engine/stage_clock.py) summarised: seconds per stage, graphs
    grouped (``session``/``compile`` and ``run`` per graph), ``startup_s`` (process start to the run),
    ``other_s`` (wall minus the stages that do not overlap) and the raw record."""
    st = {k: v["s"] for k, v in raw["stages"].items()}
    start = raw.get("process_start") or raw["clock_imported"]
    marks = raw.get("marks", {})
    out = {
        "wall_s (spawn -> exit, measured outside)": round(wall, 3),
        "startup_s (process start -> run start: interpreter, imports, CLI, bundle manifests)": round(
            marks.get("run_pairs", start) - start, 3
        ),
        "bundle_hash_s": st.get("bundle_hash", 0.0),
        "session_or_compile_s": {
            k.split(":", 1)[1]: v for k, v in st.items() if k.startswith(("session:", "compile:"))
        },
        "graph_run_s": {k.split(":", 1)[1]: v for k, v in st.items() if k.startswith("run:")},
        "decode_s": round(st.get("decode:image", 0.0) + st.get("decode:mask", 0.0), 4),
        "preprocess_s": {k.split(":", 1)[1]: v for k, v in st.items() if k.startswith("preprocess:")},
        "load_wall_s (decode + preprocess on the loader threads)": st.get(
            "load (decode, preprocess, text; its threads)", 0.0
        ),
        "heads_s (score_encoded minus its nested graph runs and sessions)": None,
        "metrics_s": st.get("metrics", 0.0),
        "write_s": round(st.get("write", 0.0) + marks.get("written", 0.0) - marks.get("scored", 0.0), 4)
        if "written" in marks
        else st.get("write", 0.0),
        "exit_s (run end -> process exit)": round(raw["ended"] - marks["written"], 3) if "written" in marks else None,
    }
    enc = st.get("score_encoded (text, pool, CP/PF heads)")
    if enc is not None:
        # score_encoded holds the SigLIP2 text, pool and cp graphs' runs and (made lazily on the first
        # call) their sessions and file hashes: the heads are what is left.
        scorer = raw.get("scorer_bundle")  # the SigLIP2 bundle's folder name, set by the caller
        nested = [f"{kind}:{scorer}/{g}" for kind in ("run", "session", "compile") for g in ("text", "pool", "cp")]
        out["heads_s (score_encoded minus its nested graph runs and sessions)"] = round(
            enc - sum(st.get(k, 0.0) for k in nested), 4
        )
    timed = (
        out["startup_s (process start -> run start: interpreter, imports, CLI, bundle manifests)"]
        + sum(out["session_or_compile_s"].values())
        + sum(out["graph_run_s"].values())
        + out["load_wall_s (decode + preprocess on the loader threads)"]
        + (out["heads_s (score_encoded minus its nested graph runs and sessions)"] or 0.0)
        + out["metrics_s"]
        + out["write_s"]
        + out["bundle_hash_s"]
    )
    out["other_s (wall minus the above)"] = round(wall - timed, 3)
    out["raw"] = raw
    return out


def machine(extra_versions: tuple[str, ...] = ("onnxruntime", "torch", "transformers")) -> dict:
    """CPU model, cores, memory, Python, the :data:`ISA_FLAGS` present and library versions."""
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    cpu, flags = "unknown", set()
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
        cpu = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
        flags = set(next(ln.split(":", 1)[1] for ln in lines if ln.startswith("flags")).split())
    except (OSError, StopIteration):
        pass
    mem = "unknown"
    try:
        mem = f"{int(open('/proc/meminfo').readline().split()[1]) / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    versions = {}
    for pkg in extra_versions:
        try:
            versions[pkg.replace("-", "_")] = version(pkg)
        except PackageNotFoundError:
            versions[pkg.replace("-", "_")] = "not installed"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": mem,
        "python": platform.python_version(),
        "isa_flags": {f: f in flags for f in ISA_FLAGS},
        **versions,
    }


def gemm_probe(shape: tuple[int, int, int] = ENCODER_GEMM, seconds: float = 2.0) -> dict:
    """The machine's matmul rate at the encoder's shape, GFLOP/s: fp32 through numpy (its BLAS)
    and through OpenVINO's CPU plugin, bf16 through torch (``torch.matmul`` on bf16 tensors) and
    through OpenVINO (``INFERENCE_PRECISION_HINT`` bf16, only where its CPU plugin reports BF16),
    each the best of repeated calls over about ``seconds``; plus what OpenVINO's CPU plugin reports
    (``OPTIMIZATION_CAPABILITIES``) and whether the CPU has AMX. Absent libraries are recorded."""
    import numpy as np

    m, k, n = shape
    flop = 2.0 * m * k * n
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)

    def best(fn) -> float:
        fn()
        times, t_end = [], time.perf_counter() + seconds
        while time.perf_counter() < t_end or len(times) < 3:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return round(flop / min(times) / 1e9, 1)

    out: dict = {"shape [M, K] x [K, N]": list(shape), "gflop_per_call": flop / 1e9}
    out["fp32_numpy_gflops"] = best(lambda: a @ b)
    try:
        import torch

        native = machine(())["isa_flags"]
        if native["avx512_bf16"] or native["amx_bf16"]:
            ta, tb = torch.from_numpy(a).bfloat16(), torch.from_numpy(b).bfloat16()
            out["bf16_torch_gflops"] = best(lambda: torch.matmul(ta, tb))
        else:  # emulated bf16 is no limit, and at ~0.5 GFLOP/s one call of this shape takes ~20 s
            out["bf16_torch_gflops"] = "no native bf16 (neither AVX512_BF16 nor AMX): not probed"
        out["torch_threads"] = torch.get_num_threads()
    except ImportError:
        out["bf16_torch_gflops"] = "torch not installed"
    try:
        import openvino as ov
        from openvino import opset13 as ops

        core = ov.Core()
        caps = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
        out["openvino_cpu_capabilities"] = caps
        x = ops.parameter([m, k], ov.Type.f32)
        model = ov.Model([ops.matmul(x, ops.constant(b), False, False)], [x])
        for hint in ("f32", "bf16") if "BF16" in caps else ("f32",):
            req = core.compile_model(
                model, "CPU", {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
            ).create_infer_request()
            out[f"{'fp32' if hint == 'f32' else 'bf16'}_openvino_gflops"] = best(lambda: req.infer([a]))
        if "BF16" not in caps:
            out["bf16_openvino_gflops"] = "no native bf16 (OpenVINO reports no BF16 capability)"
    except ImportError:
        out["openvino_cpu_capabilities"] = "openvino not installed"
    flags = machine(())["isa_flags"]
    out["amx"] = bool(flags.get("amx_bf16"))
    out["avx512_bf16"] = bool(flags.get("avx512_bf16"))
    return out


def limit_rate(probe: dict, precision: str) -> float | None:
    """The best GEMM rate (GFLOP/s) the probe measured in ``precision`` (``fp32`` or ``bf16``)."""
    rates = [
        v
        for k, v in probe.items()
        if k.startswith(f"{precision}_") and "emulated" not in k and isinstance(v, (int, float))
    ]
    return max(rates) if rates else None
