"""``masc-export``: build a validated bundle from a SigLIP2 checkpoint, or a segmenter bundle from a
CLIPSeg checkpoint (needs the export extra), and optionally TensorRT engines from its ONNX graphs
(needs TensorRT and a GPU)."""

from __future__ import annotations

import sys

import time

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", "-m", default="siglip2-so400m", show_default=True,
              help="Hugging Face id (google/siglip2-so400m-patch16-naflex), short name (siglip2-so400m, "
                   "siglip2-base, siglip2-base-512), local checkpoint directory, or a random-weight test "
                   "model: random:tiny-naflex, random:tiny-fixed, random:base-naflex, random:so400m-naflex. "
                   "A CLIPSeg checkpoint (CIDAS/clipseg-rd64-refined, short name clipseg; random:clipseg-tiny, "
                   "random:clipseg-rd64) makes a segmenter bundle (docs/segmenter.md).")
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Bundle directory to write.")
@click.option("--max-num-patches", type=click.IntRange(1, 16384), default=None,
              help="NaFlex patch budget (default 1024, the paper's).")
@click.option("--revision", default=None, help="Hub revision (commit, tag or branch) to pin.")
@click.option("--backend", type=click.Choice(["onnx", "tensorrt"]), default="onnx", show_default=True,
              help="onnx: the ONNX bundle only. tensorrt: also build TensorRT engines from its graphs "
                   "into OUT/tensorrt-<precision>/ (needs the tensorrt package and a CUDA GPU; "
                   "engines are specific to the GPU and TensorRT version that build them).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16", "int8", "bf16-cpu", "fp8"]), default=None,
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
                   "bf16-cpu's pairs and gates, or refused with the figures (docs/gpu.md).")
@click.option("--calibration-pairs", type=click.Path(dir_okay=False, exists=True), default=None,
              help="bf16-cpu / fp8: a pairs CSV to calibrate on instead of the shipped examples + a synthetic grid.")
@click.option("--heldout-pairs", type=click.Path(dir_okay=False, exists=True), default=None,
              help="bf16-cpu / fp8: a pairs CSV (>= 1000 pairs) to confirm on instead of the default held-out set.")
@click.option("--gate-pairs", type=click.Path(dir_okay=False, exists=True), default=None,
              help="int8: the pairs CSV the int8 bundle is gated on (e.g. the shared DreamBooth pairs).")
@click.option("--fp32-bundle", type=click.Path(file_okay=False, exists=True), default=None,
              help="int8 / fp8: quantize this existing fp32 bundle instead of exporting one first.")
@click.option("--accept-validation-error", type=click.FloatRange(min=0, min_open=True), default=None, metavar="ERR",
              help="Export even though a fp32 validation check is past its budget, when its error figure (the max "
                   "relative error, max |error| / max |reference|) is at most ERR; the override and the measured "
                   "error are recorded in the manifest (validation.<check>.override).")
@click.option("--max-memory-gb", type=click.FloatRange(min=0.5), default=None,
              help="Refuse in one line, before the weights are read, when the export plan's estimated peak "
                   "memory is past this many GB (default: this machine's or container's memory). Each stage "
                   "prints its time and peak memory; the plan is in docs/export.md.")
@click.option("--engines-only", is_flag=True,
              help="Build TensorRT engines for the existing bundle in OUT without re-exporting it "
                   "(no torch needed); the command a GPU/TensorRT mismatch error names.")
@click.option("--max-batch", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="TensorRT profiles: largest batch (images, prompts, references per CP call); larger "
                   "calls are split.")
@click.option("--max-outs-per-ref", type=click.IntRange(1, 4096), default=16, show_default=True,
              help="TensorRT profile of the CP head: outputs scored against one reference per call.")
@click.option("--gpu-memory-budget", type=click.FloatRange(0.01, 4096), default=None, metavar="GIB",
              help="TensorRT: device memory (GiB) the engine set may use; --max-batch / --max-outs-per-ref are "
                   "halved until its memory plan (weights + activations at the profile maxima) fits. Default: the "
                   "GPU's free memory at build time. The plan is written to engines.json.")
@click.option("--timing-cache", type=click.Path(dir_okay=False), default=None,
              help="TensorRT timing cache file, reused between builds (default: "
                   "$MASC_ENGINE_CACHE/tensorrt/timing-<trt>-sm<cc>.cache).")
def main(model: str, out_dir: str, max_num_patches: int | None, revision: str | None, backend: str,
         precision: str, gate_pairs: str | None, fp32_bundle: str | None, max_memory_gb: float | None,
         engines_only: bool, max_batch: int, max_outs_per_ref: int, gpu_memory_budget: float | None,
         timing_cache: str | None, calibration_pairs: str | None = None, heldout_pairs: str | None = None,
         accept_validation_error: float | None = None) -> None:
    """Export a SigLIP2 (or CLIPSeg) checkpoint to ONNX graphs + manifest, validated against PyTorch."""
    from ..errors import MascEngineError
    from .logs import show_library_log

    show_library_log()
    _check_combination(precision, backend, gate_pairs, calibration_pairs, heldout_pairs, engines_only)
    if precision == "fp8":
        _export_fp8(model, out_dir, max_num_patches, revision, fp32_bundle, calibration_pairs, heldout_pairs,
                    max_memory_gb)
        return
    cpu_options = {"calibration": calibration_pairs, "heldout": heldout_pairs} if precision == "bf16-cpu" else None

    try:  # a Hub id's probe: one line when it cannot be fetched (offline: --model /local/folder)
        segmenter = _segmenter_export(model, revision, out_dir, engines_only, backend, precision, max_num_patches)
    except MascEngineError as e:
        raise click.ClickException(one_line(e)) from e
    if precision == "int8":
        if not gate_pairs:  # after the segmenter probe: a segmenter refuses int8 with its own reason
            raise click.UsageError("--precision int8 needs --gate-pairs CSV: int8 is kept only if it passes "
                                   "its gates against fp32 on those pairs")
        _export_int8(model, out_dir, max_num_patches, revision, gate_pairs, fp32_bundle, max_memory_gb)
        return
    if backend == "tensorrt":  # fail before a long export when TensorRT is missing
        from ..engine.backends.tensorrt import import_tensorrt

        try:
            import_tensorrt()
        except MascEngineError as e:
            raise click.ClickException(str(e)) from e
    if not engines_only:
        _export_onnx(model, out_dir, segmenter, revision, max_num_patches, precision or "fp32", cpu_options,
                     max_memory_gb, accept_validation_error)
    if backend == "tensorrt":
        _build_engines(out_dir, precision, max_batch, max_outs_per_ref, timing_cache, gpu_memory_budget)


def _check_combination(precision: str | None, backend: str, gate_pairs: str | None, calibration_pairs: str | None,
                       heldout_pairs: str | None, engines_only: bool) -> None:
    """The legal combinations of precision, backend and their options, as usage errors (exit 2)
    before any work or network call."""
    if precision in ("bf16-cpu", "fp8", "int8") and backend != "onnx":
        target = {"bf16-cpu": "a bundle for OpenVINO's CPU plugin", "fp8": "an ONNX bundle certified on CPU",
                  "int8": "an ONNX Runtime (CPU) bundle"}[precision]
        raise click.UsageError(f"--precision {precision} makes {target}: use --backend onnx")
    if (calibration_pairs or heldout_pairs) and precision not in ("bf16-cpu", "fp8"):
        raise click.UsageError("--calibration-pairs / --heldout-pairs go with --precision bf16-cpu or fp8")
    if engines_only and backend != "tensorrt":
        raise click.UsageError("--engines-only builds TensorRT engines: add --backend tensorrt")


def _export_onnx(model: str, out_dir: str, segmenter: bool, revision: str | None, max_num_patches: int | None,
                 precision: str, cpu_options: dict | None, max_memory_gb: float | None,
                 accept_error: float | None = None) -> None:
    """The ONNX bundle (SigLIP2 or segmenter), library chatter in ``OUT.export.log``; a missing
    export extra or a failed export is one line (exit 1)."""
    from ..errors import MascEngineError
    from ..extras import available, missing

    for module in ("torch", "transformers", "onnx"):  # the worker imports them later, in another process
        if not available(module):
            raise click.ClickException(str(missing(module, "masc-export", extra="export")))
    try:
        from ..export.exporter import export_bundle
        from ..export.segmenter import export_segmenter_bundle
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
            say(f"exporting {model} to {out_dir} (loading the checkpoint; library messages go to {lib_log})")
            if segmenter:  # CLIPSeg: a segmenter bundle (docs/segmenter.md)
                export_segmenter_bundle(model, out_dir, revision=revision, precision=precision,
                                        max_memory_gb=max_memory_gb)
            else:
                export_bundle(model, out_dir, max_num_patches=max_num_patches, revision=revision,
                              precision=precision, cpu_precision_options=cpu_options, max_memory_gb=max_memory_gb)
    except MascEngineError as e:
        log_traceback(lib_log, e)
        raise click.ClickException(f"{one_line(e)} (library messages and details: {lib_log})") from e
    except Exception as e:  # a library's failure on a bad checkpoint: one line, its traceback in the log
        log_traceback(lib_log, e)
        raise click.ClickException(f"the export failed: {type(e).__name__}: {one_line(e)} "
                                   f"(traceback: {lib_log})") from e
    click.echo(f"{lib.summary()}; the command took {time.monotonic() - started:.0f} s", err=True)
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


def _build_engines(out_dir: str, precision: str | None, max_batch: int, max_outs_per_ref: int,
                   timing_cache: str | None, gpu_memory_budget: float | None) -> None:
    """TensorRT engines from the bundle in ``out_dir``; unverified on a GPU: tested against a fake
    TensorRT (docs/verification.md)."""
    from ..engine.backends.tensorrt import build_engines
    from ..errors import MascEngineError

    try:
        build_engines(out_dir, precision=precision, max_batch=max_batch, max_outs_per_ref=max_outs_per_ref,
                      timing_cache=timing_cache,
                      gpu_memory_budget=gpu_memory_budget)
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e


def _warn_random_weights(out_dir: str) -> None:
    """The random-weights line masc-run, masc-rank and masc-serve print for this bundle."""
    from ..engine.bundle import random_weights_note
    from ..engine.manifest import read_manifest

    note = random_weights_note(out_dir, read_manifest(out_dir))
    if note:
        click.secho(f"WARNING: {note}", fg="yellow", err=True)


def _segmenter_export(model, revision, out_dir, engines_only, backend, precision, max_num_patches) -> bool:
    """Whether this is a segmenter (CLIPSeg) export; refuses, before any work, the scorer's options
    (docs/segmenter.md): --max-num-patches, --precision bf16 / bf16-cpu / int8, and TensorRT
    engines (their device-memory plan, engine/backends/trt_profiles.py, models the scorer's graphs)."""
    if engines_only:
        import json
        from pathlib import Path

        try:
            segmenter = json.loads((Path(out_dir) / "manifest.json").read_text()).get("kind") == "segmenter"
        except (OSError, ValueError):
            return False
    else:
        from ..export.segmenter import is_segmenter_model

        segmenter = is_segmenter_model(model, revision)
    if segmenter and (backend == "tensorrt" or max_num_patches or precision not in (None, "fp32", "fp16")):
        raise click.UsageError("a segmenter bundle exports fp32 or fp16 ONNX graphs for ONNX Runtime (cpu or cuda); "
                               "--max-num-patches, --precision bf16/bf16-cpu/int8 and --backend tensorrt are the "
                               "scorer's (docs/segmenter.md)")
    return segmenter


def _export_int8(model, out_dir, max_num_patches, revision, gate_pairs, fp32_bundle, max_memory_gb) -> None:
    import tempfile

    from ..errors import MascEngineError
    from ..jobs.int8_gate import Int8GateError, check_int8_dependencies

    try:
        # before any work: what the quantizer, the gate and (without --fp32-bundle) the export import
        check_int8_dependencies(exporting=fp32_bundle is None)
        from ..jobs.int8_gate import quantize_bundle

        with tempfile.TemporaryDirectory() as tmp:
            src = fp32_bundle
            if src is None:
                from ..export.exporter import export_bundle

                # the portable graphs only: the int8 bundle drops the fused CPU variant anyway
                src = export_bundle(model, f"{tmp}/fp32", max_num_patches=max_num_patches, revision=revision,
                                    ort_cpu_variant=False, max_memory_gb=max_memory_gb)
            quantize_bundle(src, out_dir, gate_pairs)
    except Int8GateError as e:
        raise click.ClickException(str(e)) from e
    except MascEngineError as e:
        raise click.ClickException(one_line(e)) from e
    click.echo(f"int8 bundle written: {out_dir}", err=True)


def _export_fp8(model, out_dir, max_num_patches, revision, fp32_bundle, calibration, heldout, max_memory_gb) -> None:
    """The fp32 bundle (given, or exported to a temporary folder), then its certified FP8 copy."""
    import tempfile

    from ..errors import MascEngineError

    try:
        from ..export.fp8 import certify_fp8

        with tempfile.TemporaryDirectory() as tmp:
            src = fp32_bundle
            if src is None:
                from ..export.exporter import export_bundle

                src = export_bundle(model, f"{tmp}/fp32", max_num_patches=max_num_patches, revision=revision,
                                    ort_cpu_variant=False, max_memory_gb=max_memory_gb)
            certify_fp8(src, out_dir, calibration=calibration, heldout=heldout)
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"fp8 bundle written: {out_dir}", err=True)


if __name__ == "__main__":
    sys.exit(main())
