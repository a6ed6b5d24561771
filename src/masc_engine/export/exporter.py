"""``masc-export``: a SigLIP2 checkpoint -> a validated bundle (ONNX graphs, tokenizer, manifest).

Steps (optimum-style): load the checkpoint and its processor; read every preprocessing and text
setting from the processor objects into the manifest; export each graph from its spec
(export/graphs.py); validate each graph against PyTorch on batch sizes and patch grids other than
the traced ones (export/validate.py), raising :class:`ExportValidationError` past its per-shape
budget (``tolerances.EXPORT_VALIDATION_BUDGETS``); run the graph-transform pipeline
(export/transforms.py: mixed precision, and for fp32 bundles the fused ``ort-cpu`` variant of the
vision and text graphs, export/fusion.py), validating each result the same way (the fused graphs
also on CP and PF, within ``tolerances.ORACLE_SCORE_ATOL``); write ``manifest.json`` with every
file's sha256.

Before anything is built, the checkpoint's ``config.json`` is read and its shapes (layers x width,
vocabulary) checked against the memory budget (export/config_budget.py): a config naming ten
million layers is refused in one line, not built for minutes. Memory is planned by stage
(docs/export.md): the PyTorch steps (opening the checkpoint, computing
every PyTorch output the checks compare against, exporting each graph) run in a worker process
(export/torch_worker.py) that ends before ONNX Runtime loads the same weights; then one graph at a
time, each ONNX Runtime session closed before the next. Each stage prints its time and memory
(export/stages.py), and a plan whose estimated peak does not fit ``max_memory_gb`` is refused
before the weights are read.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import BundleError
from ..engine.manifest import write_manifest
from ..runtime.masks import DEFAULT_FG_THRESHOLD

# Re-exported: the exporter's public names from before the checkpoint module existed.
from .checkpoint import (
    _PIL_NAMES,  # noqa: F401
    DEFAULT_MAX_NUM_PATCHES,  # noqa: F401
    DEFAULT_MODEL,  # noqa: F401
    SHORT_NAMES,
    CheckpointError,  # noqa: F401
    image_settings_from_processor,  # noqa: F401
    load_checkpoint,
    random_checkpoint_dir,  # noqa: F401
    save_tokenizer,
    text_settings_from_processor,  # noqa: F401
)
from .stages import StageClock, rss

logger = logging.getLogger(__name__)

OPSET = 18

#: The old private names of :func:`~.checkpoint.load_checkpoint` and
#: :func:`~.checkpoint.save_tokenizer` (benchmarks and the segmenter export call them).
_load = load_checkpoint
_save_tokenizer = save_tokenizer


def _versions(worker_versions: dict | None = None) -> dict:
    """Library versions: torch and transformers as the PyTorch worker reported them (the
    exporter's process does not import them; without them, this process's), the rest from this
    process."""
    import onnx
    import onnxruntime
    import tokenizers

    from .. import __version__

    if worker_versions is None:
        import torch
        import transformers

        worker_versions = {"torch": str(torch.__version__), "transformers": str(transformers.__version__)}

    return {
        "masc_engine": __version__,
        **worker_versions,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
        "opset": OPSET,
    }


def export_bundle(
    model: str,
    out_dir: str | Path,
    max_num_patches: int | None = None,
    revision: str | None = None,
    validate: bool = True,
    precision: str = "fp32",
    transforms: Sequence | None = None,
    ort_cpu_variant: bool = True,
    cpu_precision_options: dict | None = None,
    into=None,
    max_memory_gb: float | None = None,
    certify: str | None = None,
    then: str | None = None,
) -> Path:
    """Export ``model`` to a bundle in ``out_dir`` and validate it.

    The bundle is written to a staging directory beside ``out_dir`` (``.<name>.<pid>.partial``)
    and renamed into place only when every graph passed its gates, so a failed export leaves no
    half-written bundle; staging directories of earlier exports to the same ``out_dir`` whose
    process is gone are removed first (one line says so). Every bundle file gets the mode a new
    file gets under the current umask (``0644`` under the usual ``022``), so a bundle shared across
    users or cluster nodes is readable by all of them.

    The stages and their memory plan are in docs/export.md: the PyTorch stages run in a worker
    process (export/torch_worker.py) that ends before ONNX Runtime loads the weights; then one
    graph at a time. Each stage prints a line with its time and peak RSS (export/stages.py).

    Args:
        model: Hugging Face id (``google/siglip2-so400m-patch16-naflex``), short name
            (``siglip2-so400m``), local checkpoint directory, or ``random:<preset>``.
        out_dir: bundle directory; must not exist, be empty, or hold a bundle (which is replaced).
        max_num_patches: NaFlex patch budget (default 1024, the paper's).
        revision: Hub revision to pin.
        validate: run the post-export validation (on by default; the manifest records it;
            required for fp16 / bf16).
        precision: ``fp32``, or ``fp16`` / ``bf16``: mixed-precision graphs (export/precision.py)
            validated with the reduced-precision gates of :mod:`masc_engine.tolerances`.
            ``bf16-cpu`` (masc-export's spelling) is ``precision="fp32", certify="bf16-cpu"``.
        certify: None, or ``bf16-cpu``: the staged fp32 bundle certified for bf16 on OpenVINO's CPU
            plugin (export/cpu_precision.py; refused with the figures); manifest mode ``bf16-cpu``.
        then: None, or ``int8``: the caller quantizes and gates the written fp32 bundle next, in
            this process (masc-export --precision int8), so the memory plan includes those stages
            (export/stages.py ``THEN_STAGES``).
        transforms: further export/transforms.py :class:`~.transforms.GraphTransform` s, run in
            order after the precision transform, each validated and recorded in the manifest.
        ort_cpu_variant: fp32 only: also write the fused ONNX Runtime CPU graphs (the ``ort-cpu``
            variant, export/fusion.py :class:`~.fusion.FusionTransform`, run last in the transform
            pipeline; the manifest's ``variants``), validated like the portable ones. They share
            the portable graphs' weight files (export/external_data.py).
        max_memory_gb: refuse before the weights are read when the plan's estimated peak RSS
            (export/stages.py :func:`~.stages.plan_memory`) is past this many GB (default: this
            machine's or container's memory).
        cpu_precision_options: ``certify="bf16-cpu"`` only: keyword arguments of the certification
            (export/cpu_precision.py :func:`~.cpu_precision.certify_bundle`: ``calibration``,
            ``heldout``, ``graphs``, ``threads``, ``max_keep``).
        into (callable | None): what writes the bundle into the staging directory, called with ``_export_into``'s
            arguments (default ``_export_into``, the SigLIP2 export; export/segmenter.py passes
            the CLIPSeg one).

    Raises:
        CheckpointError: the checkpoint cannot be loaded or is not SigLIP2 (one line; offline,
            it names ``--model /local/folder``).
        ExportMemoryError: the plan's estimated peak is past ``max_memory_gb`` (or the machine),
            from the config's shapes before any model is built, then from the weights' sizes.
        ExportValidationError: a graph disagrees with PyTorch beyond its gates (for fp16 / bf16
            the message gives the figures and suggests fp32); nothing is left at ``out_dir``.
        BundleError: ``out_dir`` is a non-empty directory that is not a bundle.
        FusionError: an attention block of the vision or text graph did not fuse.
        CertificationError: ``bf16-cpu`` fails its gates (export/cpu_precision.py; nothing is left).
        BackendUnavailableError: ``bf16-cpu`` without openvino or native bf16 (before exporting).
        ExportPlanError: ``certify`` with other than fp32 graphs, or unknown (export/plan.py).
    """
    from .cpu_precision import BF16_CPU, certify_bundle
    from .plan import ExportPlan
    from .precision import PRECISIONS

    if precision not in (*PRECISIONS, BF16_CPU):
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if then not in (None, "int8") or (then and (certify or precision != "fp32")):
        raise ValueError(f"then must be None or 'int8' (after fp32 graphs, without certify), got {then!r}")
    plan = ExportPlan.from_option(precision, certify, model=str(model))  # bf16-cpu: fp32 graphs + certify
    precision, certify = plan.graph_precision, plan.certify
    if certify:  # fp32 graphs, certified on the stage below
        from ..engine.backends.openvino import check_available

        check_available(precision="bf16")  # before the long export: openvino installed, native bf16 on this CPU
    if precision != "fp32" and not validate:
        raise ValueError(f"{precision} bundles are kept only if they pass their gates: validate=True")
    out = Path(out_dir)
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_stages(out)
    stage = out.with_name(f".{out.name}.{os.getpid()}.partial")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        # one memory plan, from the config and then the weights, that includes what is made next
        (into or functools.partial(_export_into, then=BF16_CPU if certify else then))(
            stage,
            model,
            max_num_patches,
            revision,
            validate,
            precision,
            list(transforms or []),
            ort_cpu_variant,
            max_memory_gb,
        )
        if certify:
            certify_bundle(stage, **(cpu_precision_options or {}))
        uniform_file_modes(stage)
        if out.exists():
            old = out.with_name(f".{out.name}.{os.getpid()}.old")
            out.rename(old)
            stage.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            stage.rename(out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    logger.info(f"bundle written: {out} ({plan.mode})")
    return out


def check_replaceable(out: Path) -> None:
    """Refuse an ``--out`` that a new bundle may not replace: one that exists and is neither an
    empty folder nor a bundle masc-export wrote, i.e. a ``manifest.json`` of format
    ``masc-bundle`` (engine/manifest.py ``read_manifest``) with nothing beside the files it lists
    and the TensorRT engine sets built into it (``tensorrt-<precision>/``). Replacing anything
    else would erase what the user keeps there (a folder that merely holds some file called
    ``manifest.json``, or a bundle folder with the user's notes in it).

    Raises:
        BundleError: ``out`` is a file, a folder without a masc-bundle manifest, or a bundle
            holding files its manifest does not list (the first few named); the way out is
            another ``--out``.
    """
    from ..engine.manifest import MANIFEST_NAME, read_manifest

    if out.is_symlink():
        raise BundleError(f"{out} is a link; give the folder itself (or another --out)")
    if not out.exists():
        return
    if not out.is_dir():
        raise BundleError(f"{out} exists and is not a directory; choose another --out")
    if not any(out.iterdir()):
        return
    try:
        manifest = read_manifest(out)
    except BundleError as e:
        raise BundleError(f"{out} exists and is neither empty nor a bundle ({e}); choose another --out") from None
    files = manifest.get("files")
    allowed = (set(files) if isinstance(files, dict) else set()) | {MANIFEST_NAME}
    extra: list[str] = []
    for root, dirs, names in os.walk(out):  # links are not followed: a linked folder is one entry
        here = Path(root)
        if here == out:  # the engine sets built into the bundle are its own
            dirs[:] = [d for d in dirs if not d.startswith("tensorrt-") or (here / d).is_symlink()]
        linked = [d for d in dirs if (here / d).is_symlink()]
        rel = here.relative_to(out)
        extra += [n for n in ((rel / f).as_posix() for f in names + linked) if n not in allowed]
    if extra:
        shown = ", ".join(sorted(extra)[:3]) + (", ..." if len(extra) > 3 else "")
        raise BundleError(
            f"{out} is a bundle but also holds {len(extra)} file(s) its manifest does not list ({shown}); "
            "replacing it would erase them: choose another --out or move them"
        )


def remove_stale_stages(out: Path) -> list[str]:
    """Remove what killed exports to ``out`` left beside it: staging folders
    ``.<name>.<pid>.partial`` older than this export whose process is gone, and the replaced
    bundle ``.<name>.<pid>.old`` of a swap that completed (``out`` exists). Says so in one line.

    Returns:
        the names removed.
    """
    from .stages import process_alive

    started, removed = time.time(), []
    for p in sorted(out.parent.glob(f".{glob.escape(out.name)}.*")):
        pid, _, kind = p.name[len(out.name) + 2 :].partition(".")
        if kind not in ("partial", "old") or not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        if kind == "old" and not (out / "manifest.json").is_file():
            continue  # the swap did not finish: this may be the only copy of the earlier bundle
        if kind == "partial" and p.stat().st_mtime >= started:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    if removed:
        logger.info(
            f"removed {len(removed)} stale staging folder(s) of interrupted exports to {out.name}: {', '.join(removed)}"
        )
    return removed


def uniform_file_modes(d: Path) -> int:
    """Give every file under ``d`` the mode a new file gets under the current umask (``0666 &
    ~umask``): the onnx library writes external weight files ``0600``, which made a bundle shared
    across users or cluster nodes unreadable for the others. Returns the mode."""
    mask = os.umask(0)
    os.umask(mask)
    mode = 0o666 & ~mask
    for p in d.rglob("*"):
        if p.is_file():
            p.chmod(mode)
    return mode


def _bundle_files(d: Path, graphs: dict) -> list[str]:
    files = {"tokenizer.json"}
    for entry in graphs.values():
        files.add(entry["file"])
        files.update(v["file"] for v in entry.get("variants", {}).values())
    files.update(p.name for p in d.iterdir() if p.suffix == ".data")  # external weights
    return sorted(files)


def _linked_copy(src: Path, dst: Path, names: Sequence[str]) -> Path:
    """``dst`` holding hard links to ``src``'s files.

    External-weight files (``*.data``) are copied, not linked: the onnx library refuses to read
    external data from a file with more than one hard link ("potential hardlink attack"), which
    made every transform of an so400m graph fail."""
    dst.mkdir()
    for name in names:
        if name.endswith(".data"):
            shutil.copy2(src / name, dst / name)
            continue
        try:
            os.link(src / name, dst / name)
        except OSError:
            shutil.copy2(src / name, dst / name)
    return dst


@dataclass
class _Job:
    """One export: its settings, and what its stages hand each other."""

    out: Path
    model: str
    max_num_patches: int | None
    revision: str | None
    validate: bool
    precision: str
    transforms: list
    fused: bool
    max_memory_gb: float | None
    clock: StageClock
    then: str | None = None  # bf16-cpu / int8: made next from these graphs (stages.THEN_STAGES, in the plan)
    info: dict = field(default_factory=dict)  # the checkpoint: settings, architecture, weight sizes
    refs: dict = field(default_factory=dict)  # PyTorch outputs the validation compares against
    graphs: dict = field(default_factory=dict)  # the manifest's graphs section


def _export_into(
    out: Path,
    model: str,
    max_num_patches,
    revision,
    validate: bool,
    precision: str,
    transforms: list,
    ort_cpu_variant: bool = True,
    max_memory_gb: float | None = None,
    then: str | None = None,
) -> None:
    from .config_budget import preflight
    from .torch_worker import TorchWorker

    t0 = time.time()
    job = _Job(
        out,
        model,
        max_num_patches,
        revision,
        validate,
        precision,
        transforms,
        ort_cpu_variant and precision == "fp32",
        max_memory_gb,
        StageClock(),
        then,
    )
    # the config's shapes against the budget before transformers builds a layer (export/config_budget.py)
    preflight(model, revision, SHORT_NAMES, max_memory_gb, then or precision, job.fused)
    with TorchWorker(job.clock) as worker:
        _open_checkpoint(job, worker)
        _torch_stages(job, worker)
    manifest = _manifest(job)
    manifest["export_peak_rss_gb"] = {"torch worker": round(worker.lifetime_peak / 1e9, 3)}
    if validate:
        manifest["validation"] = _validation_stages(job)
    _transform_stages(job, manifest)
    _onnx_check_stage(job, manifest)
    manifest["export_seconds"] = round(time.time() - t0, 1)
    manifest["export_stages"] = job.clock.records
    manifest["export_peak_rss_gb"]["exporter"] = round(rss()[1] / 1e9, 3)
    logger.info(
        "peak memory (RSS): "
        + ", ".join(f"{k} {v:.2f} GB" for k, v in manifest["export_peak_rss_gb"].items())
        + f"; export stages {manifest['export_seconds']:.0f} s"
    )
    write_manifest(out, manifest)


def _onnx_check_stage(job: _Job, manifest: dict) -> None:
    """Every graph passes the ONNX checker (export/onnx_check.py), or no bundle."""
    from .onnx_check import check_graphs

    with job.clock.stage("onnx checker") as note:
        checked = check_graphs(job.out, manifest["files"])
        note["message"] = f"onnx.checker (full check) passed on {len(checked)} graphs"
    manifest["onnx_checker"] = {"full_check": True, "graphs": checked}


def _open_checkpoint(job: _Job, worker) -> None:
    """Open the checkpoint in the worker (no weight read yet), then refuse a plan that does not
    fit the memory limit before any stage reads the weights."""
    from .stages import check_memory_plan, plan_memory

    job.info = worker.run(
        "checkpoint",
        lambda r: (
            f"opened {job.model} ({r['architecture']['model_type']}, "
            f"{sum(r['tower_bytes'].values()) / 1e9:.2f} GB of fp32 weights, mapped lazily)"
        ),
        "open_checkpoint",
        job.model,
        job.revision,
        job.max_num_patches,
        str(job.out),
    )
    plan = plan_memory(job.info["tower_bytes"], job.precision, fused=job.fused, then=job.then)
    logger.info(check_memory_plan(plan, job.max_memory_gb, job.model))


def _torch_stages(job: _Job, worker) -> None:
    """PyTorch references and graph exports, tower by tower, in the worker."""
    from .external_data import data_files

    for tower, graphs in (("vision", ("vision", "pool")), ("text", ("text", "cp"))):
        if job.validate:
            args = () if tower == "vision" else (str(job.out),)
            job.refs.update(
                worker.run(
                    f"{tower} references",
                    lambda r, t=tower: f"computed the PyTorch outputs the {t} checks compare against",
                    f"{tower}_references",
                    *args,
                )
            )
        for g in graphs:
            entry = worker.run(
                f"export {g}", lambda e, g=g: f"exported {g} -> {e['file']}", "export", g, str(job.out), OPSET
            )
            files = data_files(job.out / entry["file"])
            if files:
                entry["external_data"] = files
            job.graphs[g] = entry


def _manifest(job: _Job) -> dict:
    info = job.info
    return {
        "source": info["source"],
        "architecture": info["architecture"],
        "image": info["image"],
        "text": info["text"],
        "scoring": {
            "fg_threshold": DEFAULT_FG_THRESHOLD,
            "cp_keeps": "reference patches with weight > fg_threshold",
            "pf_hides": "output patches with weight >= fg_threshold, and padding slots",
            "mask_downsample": "bilinear, align_corners=False, no antialias, clamp [0, 1]",
            "reference": "masc-metric 0.3.0",
        },
        "graphs": job.graphs,
        "validation": {},
        "precision": {"mode": "fp32"},
        "transforms": [],
        "variants": {},
        "versions": _versions(info["versions"]),
        "files": _bundle_files(job.out, job.graphs),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _validation_stages(job: _Job) -> dict:
    """Each exported graph against the stored PyTorch outputs, one ONNX Runtime session at a time."""
    from . import validate as val

    report = {}
    for g in ("vision", "pool", "text", "cp"):
        with job.clock.stage(f"validate {g}") as note:
            r = report[g] = val.check_graph(g, job.out / job.graphs[g]["file"], job.refs)
            note["message"] = (
                f"validated {g}: max |error| {r['max_abs']:.2e} (atol {r['atol']:g}) over {len(r['cases'])} cases"
            )
    return report


def _transform_stages(job: _Job, manifest: dict) -> None:
    """The transform pipeline (precision, the caller's, then the fused variant), one graph per
    stage, each result validated; then the reduced-precision pair gates or the fused score check."""
    from . import fusion
    from . import validate as val
    from .precision import PrecisionTransform
    from .transforms import run_transforms

    transforms = ([PrecisionTransform(job.precision)] if job.precision != "fp32" else []) + job.transforms
    fused = fusion.FusionTransform(job.info["towers"]) if job.fused else None
    if fused is not None:
        transforms.append(fused)
    if not transforms:
        return
    fp32_scores = _fp32_pair_scores(job, manifest) if job.precision != "fp32" else None
    check = (
        (lambda g, path, gates: val.check_graph(g, path, job.refs, gates))
        if job.validate
        else (lambda g, path, gates: {"skipped": True})
    )
    manifest["transforms"] = run_transforms(job.out, job.graphs, transforms, check, stage=job.clock.stage)
    _drop_unreferenced_data(job.out, job.graphs)
    manifest["files"] = _bundle_files(job.out, job.graphs)
    if job.precision != "fp32":
        manifest["precision"] = _pair_gate_stage(job, manifest, transforms[0], fp32_scores)
    if fused is not None:
        manifest["variants"][fusion.VARIANT] = _variant_entry(job, fused)


def _fp32_pair_scores(job: _Job, manifest: dict) -> dict:
    """The reduced-precision pair gates' reference: the fp32 graphs' scores, made before the
    precision transform replaces them (no copy of the fp32 graphs is kept)."""
    from . import validate as val

    with job.clock.stage("fp32 pair scores") as note:
        write_manifest(job.out, manifest)
        scores = val.pair_scores(job.out)
        note["message"] = f"scored the fp32 graphs on {scores['pairs']} pairs (the pair gates' reference)"
    return scores


def _pair_gate_stage(job: _Job, manifest: dict, transform, fp32_scores: dict | None) -> dict:
    """The reduced-precision bundle scored on the same pairs; bf16 emulated (no bf16 kernels on CPU)."""
    import tempfile

    from . import validate as val
    from .precision import policy

    p = job.precision
    with job.clock.stage(f"{p} pair gates") as note:
        write_manifest(job.out, manifest)
        with tempfile.TemporaryDirectory(dir=job.out, prefix="bf16emu.") as tmp:
            scored = _emulated_bf16_bundle(job, manifest, Path(tmp)) if p == "bf16" else job.out
            rep = val.validate_pairs(None, scored, p, fp32_scores=fp32_scores)
        note["message"] = (
            f"{p} pair gates: max |dCP| {rep['max_abs_dcp']:.2e}, max |dPF| {rep['max_abs_dpf']:.2e} "
            f"over {rep['pairs']} pairs"
        )
    return {
        "mode": p,
        "graphs": list(transform.graphs),
        "policy": policy(),
        "pair_gates": rep,
        "validated_on": "ONNX Runtime CPU"
        + (", bf16 emulated (export/precision.py emulate_bf16)" if p == "bf16" else ""),
    }


def _emulated_bf16_bundle(job: _Job, manifest: dict, d: Path) -> Path:
    from .precision import emulated_bf16_file

    scored = _linked_copy(job.out, d / "bundle", ["tokenizer.json"])
    for e in job.graphs.values():
        emulated_bf16_file(job.out / e["file"], scored / e["file"])
    plain = {g: {k: v for k, v in e.items() if k not in ("variants", "external_data")} for g, e in job.graphs.items()}
    files = ["tokenizer.json"] + [e["file"] for e in plain.values()] + [p.name for p in scored.glob("*.data")]
    write_manifest(scored, {**manifest, "graphs": plain, "files": files})
    return scored


def _variant_entry(job: _Job, fused) -> dict:
    """The manifest's ``variants["ort-cpu"]``, with the fused graphs' CP and PF checked against PyTorch."""
    from . import fusion

    entry = {"runtime": dict(fused.runtime), "transform": fused.name, "graphs": list(fused.graphs)}
    if job.validate:
        with job.clock.stage(f"{fusion.VARIANT} scores") as note:
            refs = {"vision": job.refs["scores_vision"], "text": job.refs["scores_text"]}
            rep = fusion.check_variant_scores(job.out, job.graphs, refs)
            note["message"] = (
                f"validated {fusion.VARIANT} scores: max |dCP| {rep['max_abs_dcp']:.2e}, "
                f"max |dPF| {rep['max_abs_dpf']:.2e}"
            )
        entry["validation"] = {"scores": rep}
    return entry


def _drop_unreferenced_data(out: Path, graph_entries: dict) -> None:
    """Remove external-weight files no graph of the bundle references any more (a replaced fp32
    graph's ``.data``)."""
    from .external_data import data_files

    used = set()
    for name in _bundle_files(out, graph_entries):
        if name.endswith(".onnx"):
            used.update(data_files(out / name))
    for p in out.iterdir():
        if p.suffix == ".data" and p.name not in used:
            p.unlink()


def dumps_report(report: dict) -> str:
    return json.dumps(report, indent=2)
