"""``masc-export``: build a validated bundle from a SigLIP2 checkpoint, or a segmenter bundle from a
CLIPSeg checkpoint (needs the export extra), and optionally TensorRT engines from its ONNX graphs
(needs TensorRT and a GPU)."""

from __future__ import annotations

import sys

import time
from contextlib import contextmanager

import click

from .logs import PrintableCommand, echo, secho

from ..export.plan import PRECISION_OPTIONS


@click.command(cls=PrintableCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--model",
    "-m",
    default="siglip2-so400m",
    show_default=True,
    help="Hugging Face id (google/siglip2-so400m-patch16-naflex), short name (siglip2-so400m, "
    "siglip2-base, siglip2-base-512), local checkpoint directory, or a random-weight test "
    "model: random:tiny-naflex, random:tiny-fixed, random:base-naflex, random:so400m-naflex. "
    "A CLIPSeg checkpoint (CIDAS/clipseg-rd64-refined, short name clipseg; random:clipseg-tiny, "
    "random:clipseg-rd64) makes a segmenter bundle (docs/segmenter.md). clip-vit-b32, clip-vit-l14, dino-vits16, "
    "dino-vits8, dinov2-small (random:clip-tiny, random:clip-tiny-l14, random:dino-tiny-s16, "
    "random:dino-tiny-s8, random:dinov2-tiny; real shapes: random:clip-b32, random:clip-l14, "
    "random:dino-s16) make an embedder bundle, fp32 or certified bf16-cpu (docs/export.md).",
)
@click.option(
    "--out",
    "-o",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Bundle directory to write: absent, empty, or a bundle masc-export wrote (replaced).",
)
@click.option(
    "--max-num-patches",
    type=click.IntRange(1, 16384),
    default=None,
    help="NaFlex patch budget (default 1024, the paper's).",
)
@click.option("--revision", default=None, help="Hub revision (commit, tag or branch) to pin.")
@click.option(
    "--backend",
    type=click.Choice(["onnx", "tensorrt"]),
    default="onnx",
    show_default=True,
    help="onnx: the ONNX bundle only. tensorrt: also build TensorRT engines from its graphs "
    "into OUT/tensorrt-<precision>/ (needs the tensorrt package and a CUDA GPU; "
    "engines are specific to the GPU and TensorRT version that build them).",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISION_OPTIONS),
    default=None,
    help="Precision of the bundle's graphs (default fp32). fp16 / bf16: mixed-precision ONNX graphs "
    "(LayerNorm, softmax, GELU, reductions and casts stay fp32; inputs and outputs stay fp32), "
    "validated against PyTorch fp32 with the fp16 gates and refused with the figures if they "
    "fail; every backend runs them (bf16 needs a GPU: ONNX Runtime CPU has no bf16 kernels; "
    "TensorRT bf16 needs compute capability >= 8.0). With --backend tensorrt the engines are "
    "strongly typed from these graphs (--engines-only: default and only choice, the bundle's "
    "precision). int8: an ONNX bundle with int8 (dynamic) vision and text towers for CPU, kept "
    "only if it passes its gates against fp32 on --gate-pairs. bf16-cpu: the fp32 bundle, "
    "certified for bf16 on OpenVINO's CPU plugin (needs the openvino extra and a CPU with native "
    "bf16): scored against fp32 on calibration and held-out pairs, encoder layers kept in fp32 "
    "where the gates need it, refused with the figures if they still fail (docs/cpu_precision.md). "
    "fp8: the vision tower with explicit E4M3 Q/DQ around its linear layers (per-tensor activation "
    "scales from the calibration pairs, per-channel weights), certified on ONNX Runtime CPU with "
    "bf16-cpu's pairs and gates, or refused with the figures (docs/gpu.md).",
)
@click.option(
    "--calibration-pairs",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="bf16-cpu / fp8: a pairs CSV to calibrate on instead of the shipped examples + a synthetic grid.",
)
@click.option(
    "--heldout-pairs",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="bf16-cpu / fp8: a pairs CSV (>= 1000 pairs) to confirm on instead of the default held-out set.",
)
@click.option(
    "--bf16-graphs",
    default=None,
    metavar="GRAPHS",
    help="bf16-cpu: the graphs certified to run in bf16, comma-separated (default the image tower: "
    "vision, or an embedder's image; add text for the text tower, which must pass the same gates).",
)
@click.option(
    "--gate-pairs",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="int8: the pairs CSV the int8 bundle is gated on (e.g. the shared DreamBooth pairs).",
)
@click.option(
    "--fp32-bundle",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="int8 / fp8: quantize this existing fp32 bundle instead of exporting one first.",
)
@click.option(
    "--accept-validation-error",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="ERR",
    help="Export even though a fp32 validation check is past its budget, when its error figure (the max "
    "relative error, max |error| / max |reference|) is at most ERR; the override and the measured "
    "error are recorded in the manifest (validation.<check>.override).",
)
@click.option(
    "--max-memory-gb",
    type=click.FloatRange(min=0.5),
    default=None,
    help="Refuse in one line, before the weights are read, when the export plan's estimated peak "
    "memory is past this many GB (default: this machine's or container's memory). Each stage "
    "prints its time and peak memory; the plan is in docs/export.md.",
)
@click.option(
    "--engines-only",
    is_flag=True,
    help="Build TensorRT engines for the existing bundle in OUT without re-exporting it "
    "(no torch needed); the command a GPU/TensorRT mismatch error names.",
)
@click.option(
    "--max-batch",
    type=click.IntRange(1, 4096),
    default=16,
    show_default=True,
    help="TensorRT profiles: largest batch (images, prompts, references per CP call); larger calls are split.",
)
@click.option(
    "--max-outs-per-ref",
    type=click.IntRange(1, 4096),
    default=16,
    show_default=True,
    help="TensorRT profile of the CP head: outputs scored against one reference per call.",
)
@click.option(
    "--gpu-memory-budget",
    type=click.FloatRange(0.01, 4096),
    default=None,
    metavar="GIB",
    help="TensorRT: device memory (GiB) the engine set may use; --max-batch / --max-outs-per-ref are "
    "halved until its memory plan (weights + activations at the profile maxima) fits. Default: the "
    "GPU's free memory at build time. The plan is written to engines.json.",
)
@click.option(
    "--timing-cache",
    type=click.Path(dir_okay=False),
    default=None,
    help="TensorRT timing cache file, reused between builds (default: "
    "$MASC_ENGINE_CACHE/tensorrt/timing-<trt>-sm<cc>.cache).",
)
def main(
    model: str,
    out_dir: str,
    max_num_patches: int | None,
    revision: str | None,
    backend: str,
    precision: str,
    gate_pairs: str | None,
    fp32_bundle: str | None,
    max_memory_gb: float | None,
    engines_only: bool,
    max_batch: int,
    max_outs_per_ref: int,
    gpu_memory_budget: float | None,
    timing_cache: str | None,
    calibration_pairs: str | None = None,
    heldout_pairs: str | None = None,
    bf16_graphs: str | None = None,
    accept_validation_error: float | None = None,
) -> None:
    """Export a SigLIP2 (or CLIPSeg) checkpoint to ONNX graphs + manifest, validated against PyTorch."""
    from ..errors import MascEngineError
    from ..export.plan import ExportPlan
    from ..export.plan_steps import resolve_kind
    from .logs import show_library_log

    show_library_log()
    with _usage_errors():  # the plan's combinations (export/plan.py), before any work or network call
        plan = ExportPlan.from_option(
            precision,
            model=model,
            backend=backend,
            engines_only=engines_only,
            max_num_patches=max_num_patches,
            revision=revision,
            calibration_pairs=calibration_pairs,
            heldout_pairs=heldout_pairs,
            bf16_graphs=tuple(g.strip() for g in bf16_graphs.split(",")) if bf16_graphs is not None else None,
            gate_pairs=gate_pairs,
            fp32_bundle=fp32_bundle,
            max_memory_gb=max_memory_gb,
            max_batch=max_batch,
            max_outs_per_ref=max_outs_per_ref,
            gpu_memory_budget=gpu_memory_budget,
            timing_cache=timing_cache,
        )
    if plan.precision == "fp8":
        _export_fp8(plan, out_dir)
        return
    try:  # a Hub id's probe: one line when it cannot be fetched (offline: --model /local/folder)
        with _usage_errors():  # a segmenter refuses the scorer's options; int8 needs its gate pairs
            plan = resolve_kind(plan, out_dir)
    except MascEngineError as e:
        raise click.ClickException(one_line(e)) from e
    if plan.precision == "int8":
        _export_int8(plan, out_dir)
        return
    if plan.backend == "tensorrt":
        _check_tensorrt()
    if not plan.engines_only:
        _export_onnx(plan, out_dir, accept_validation_error)
    if plan.backend == "tensorrt":
        _build_engines(plan, out_dir)


def _check_tensorrt() -> None:
    """Fail before a long export when TensorRT is missing (one line, exit 1)."""
    from ..engine.backends.tensorrt import import_tensorrt
    from ..errors import MascEngineError

    try:
        import_tensorrt()
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e


@contextmanager
def _usage_errors():
    """An illegal export plan (export/plan.py ``ExportPlanError``) as a usage error (exit 2)."""
    from ..export.plan import ExportPlanError

    try:
        yield
    except ExportPlanError as e:
        raise click.UsageError(str(e)) from e


def _export_onnx(plan, out_dir: str, accept_error: float | None = None) -> None:
    """The plan's ONNX bundle (SigLIP2 or segmenter), library chatter in ``OUT.export.log``; a
    missing export extra or a failed export is one line (exit 1)."""
    from ..errors import MascEngineError
    from ..extras import available, missing

    for module in ("torch", "transformers", "onnx"):  # the worker imports them later, in another process
        if not available(module):
            raise click.ClickException(str(missing(module, "masc-export", extra="export")))
    try:
        from ..export.exporter import export_bundle  # noqa: F401 (what the export imports is installed)
        from ..export.plan_steps import export_onnx
        from ..export.segmenter import export_segmenter_bundle  # noqa: F401
        from ..export.validate import accept_validation_error
    except ImportError as e:  # torch / transformers / onnx missing
        raise click.ClickException(str(missing(e.name or "torch", "masc-export", extra="export"))) from e
    from pathlib import Path

    from .quiet import libraries_to_log

    # torch.onnx / onnxscript / transformers chatter goes to OUT.export.log beside the bundle (not
    # inside it: the exporter refuses a non-empty OUT that is not a bundle and renames the staged
    # bundle into place); stages stay on screen
    lib_log = Path(out_dir).with_name(Path(out_dir).name + ".export.log")
    started = time.monotonic()
    try:
        with libraries_to_log(lib_log) as (say, lib), accept_validation_error(accept_error):
            say(f"exporting {plan.model} to {out_dir} (loading the checkpoint; library messages go to {lib_log})")
            export_onnx(plan, out_dir)  # CLIPSeg: a segmenter bundle (docs/segmenter.md)
    except MascEngineError as e:
        log_traceback(lib_log, e)
        raise click.ClickException(f"{one_line(e)} (library messages and details: {lib_log})") from e
    except Exception as e:  # a library's failure on a bad checkpoint: one line, its traceback in the log
        log_traceback(lib_log, e)
        raise click.ClickException(
            f"the export failed: {type(e).__name__}: {one_line(e)} (traceback: {lib_log})"
        ) from e
    echo(f"{lib.summary()}; the command took {time.monotonic() - started:.0f} s", err=True)
    _warn_random_weights(out_dir)


def one_line(e: BaseException) -> str:
    """An error's message as one line (a library's message may span several)."""
    return " ".join(str(e).split()) or type(e).__name__


def log_traceback(log_path, e: BaseException) -> None:
    """Append ``e``'s traceback (with its causes: the export worker's own traceback included) to
    the export log, for the one-line error to point at."""
    import traceback

    try:
        with open(log_path, "a", encoding="utf-8", errors="replace") as f:
            f.write("masc-export stopped:\n" + "".join(traceback.format_exception(e)))
    except OSError:
        pass


def _build_engines(plan, out_dir: str) -> None:
    """TensorRT engines from the bundle in ``out_dir``; unverified on a GPU: tested against a fake
    TensorRT (docs/verification.md)."""
    from ..errors import MascEngineError
    from ..export.plan_steps import build_plan_engines

    try:
        build_plan_engines(plan, out_dir)
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e


def _warn_random_weights(out_dir: str) -> None:
    """The random-weights line masc-run, masc-rank and masc-serve print for this bundle."""
    from ..engine.bundle import random_weights_note
    from ..engine.manifest import read_manifest

    note = random_weights_note(out_dir, read_manifest(out_dir))
    if note:
        secho(f"WARNING: {note}", fg="yellow", err=True)


def _export_int8(plan, out_dir: str) -> None:
    """The fp32 bundle (given, or exported to a temporary folder), then its int8 copy if it passes
    its gates on the plan's gate pairs (jobs/int8_gate.py)."""
    import tempfile

    from ..errors import MascEngineError
    from ..jobs.int8_gate import Int8GateError, check_int8_dependencies

    try:
        # before any work: what the quantizer, the gate and (without --fp32-bundle) the export import
        check_int8_dependencies(exporting=plan.fp32_bundle is None)
        from ..export.plan_steps import fp32_source
        from ..jobs.int8_gate import quantize_bundle

        with tempfile.TemporaryDirectory() as tmp:
            src = plan.fp32_bundle or fp32_source(plan, f"{tmp}/fp32")
            quantize_bundle(src, out_dir, plan.gate_pairs)
    except Int8GateError as e:
        raise click.ClickException(str(e)) from e
    except MascEngineError as e:
        raise click.ClickException(one_line(e)) from e
    echo(f"int8 bundle written: {out_dir}", err=True)


def _export_fp8(plan, out_dir: str) -> None:
    """The fp32 bundle (given, or exported to a temporary folder), then its certified FP8 copy."""
    from ..errors import MascEngineError
    from ..export.plan_steps import export_fp8

    try:
        export_fp8(plan, out_dir)
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e
    echo(f"fp8 bundle written: {out_dir}", err=True)


if __name__ == "__main__":
    sys.exit(main())
