"""The steps of an export plan (export/plan.py :class:`~.plan.ExportPlan`): the model's kind,
the ONNX bundle (scorer or segmenter, certified for bf16-cpu when the plan says so), the FP8 bundle
and the TensorRT engines.

The int8 bundle is gated by scoring pairs, which the jobs layer does (jobs/int8_gate.py
``quantize_bundle``, on :func:`fp32_source`'s bundle); masc-export calls it with the plan's
``gate_pairs``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .plan import ExportPlan, ExportPlanError


def resolve_kind(plan: ExportPlan, out_dir: str | Path) -> ExportPlan:
    """The plan with its model's kind: for ``engines_only``, the kind of the bundle at ``out_dir``
    (a scorer when it has no readable manifest); else the checkpoint's (export/segmenter.py
    ``is_segmenter_model``: a Hub id's config is fetched, one request).

    Raises:
        ExportPlanError: the kind makes the plan illegal (:meth:`ExportPlan.validate`).
        CheckpointError: a Hub id's config cannot be fetched, or a local config is unreadable.
    """
    if plan.kind is not None:
        return plan
    if plan.engines_only:
        from ..engine.manifest import read_manifest
        from ..errors import BundleError

        try:  # read_manifest caps the read: a huge or sparse manifest.json costs one stat
            kind = read_manifest(out_dir).get("kind")
        except BundleError:
            kind = None  # the bundle's load refuses it in one line, after the plan
        kind = kind if kind in ("segmenter", "embedder") else "scorer"
    else:
        from .embedders import is_embedder_model
        from .segmenter import is_segmenter_model

        kind = (
            "segmenter"
            if is_segmenter_model(plan.model, plan.revision)
            else "embedder"
            if is_embedder_model(plan.model, plan.revision)
            else "scorer"
        )
    return dataclasses.replace(plan, kind=kind)


def export_onnx(plan: ExportPlan, out_dir: str | Path, ort_cpu_variant: bool = True) -> Path:
    """Write the plan's ONNX bundle (fp32, fp16 or bf16 graphs; certified for bf16-cpu when the
    plan says so) to ``out_dir``: a segmenter bundle (export/segmenter.py) or a scorer bundle
    (export/exporter.py ``export_bundle``). The kind is resolved first when unknown.

    Raises:
        ExportPlanError: the plan is not an ONNX export of this kind.
        MascEngineError: as ``export_bundle`` / ``export_segmenter_bundle`` (checkpoint, memory,
            validation, certification errors).
    """
    plan = resolve_kind(plan, out_dir)
    if plan.precision in ("int8", "fp8"):
        raise ExportPlanError(
            f"--precision {plan.precision} is made from an fp32 bundle (export_fp8, or the int8 gate)"
        )
    if plan.kind == "segmenter":
        from .segmenter import export_segmenter_bundle

        return export_segmenter_bundle(
            plan.model,
            out_dir,
            revision=plan.revision,
            precision=plan.graph_precision,
            max_memory_gb=plan.max_memory_gb,
        )
    # what the scorer's and the embedder's exports take alike (the certification included)
    common: dict[str, Any] = dict(
        revision=plan.revision,
        max_memory_gb=plan.max_memory_gb,
        certify=plan.certify,
        cpu_precision_options=plan.certification_options,
    )
    if plan.kind == "embedder":
        from .embedders import export_embedder_bundle

        return export_embedder_bundle(plan.model, out_dir, **common)
    from .exporter import export_bundle

    return export_bundle(
        plan.model,
        out_dir,
        max_num_patches=plan.max_num_patches,
        precision=plan.graph_precision,
        ort_cpu_variant=ort_cpu_variant,
        **common,
    )


def export_fp8(plan: ExportPlan, out_dir: str | Path) -> Path:
    """The plan's FP8 bundle: its ``fp32_bundle``, or an fp32 export of its model into a temporary
    folder (portable graphs only), then the certified FP8 copy (export/fp8.py ``certify_fp8``).

    Raises:
        ExportPlanError: the plan's precision is not fp8.
        CertificationError: the FP8 graphs fail their gates (nothing written).
        MascEngineError: as the fp32 export.
    """
    import tempfile

    from .fp8 import certify_fp8

    if plan.precision != "fp8":
        raise ExportPlanError(f"export_fp8 makes fp8 bundles; the plan's precision is {plan.mode}")
    with tempfile.TemporaryDirectory() as tmp:
        src = plan.fp32_bundle or fp32_source(plan, Path(tmp) / "fp32")
        certify_fp8(src, out_dir, calibration=plan.calibration_pairs, heldout=plan.heldout_pairs)
    return Path(out_dir)


def fp32_source(plan: ExportPlan, out_dir: str | Path) -> Path:
    """The fp32 scorer bundle an int8 or fp8 bundle is made from, exported to ``out_dir`` with the
    portable graphs only (the derived bundle drops the fused CPU variant anyway)."""
    from .exporter import export_bundle

    return export_bundle(
        plan.model,
        out_dir,
        max_num_patches=plan.max_num_patches,
        revision=plan.revision,
        ort_cpu_variant=False,
        max_memory_gb=plan.max_memory_gb,
        then="int8" if plan.precision == "int8" else None,  # its quantizer and gates in the plan
    )


def build_plan_engines(plan: ExportPlan, bundle_dir: str | Path) -> Path:
    """TensorRT engines for the bundle at ``bundle_dir`` with the plan's profile maxima, memory
    budget and timing cache (engine/backends/tensorrt.py ``build_engines``; the engines' precision
    is the bundle's, which ``plan.precision``, when given, must equal).

    Raises:
        BackendUnavailableError, EngineBuildError, DeviceMemoryError, BundleError: as
            ``build_engines``.
    """
    from ..engine.backends.tensorrt import build_engines

    return build_engines(
        bundle_dir,
        precision=plan.precision,
        max_batch=plan.max_batch,
        max_outs_per_ref=plan.max_outs_per_ref,
        timing_cache=plan.timing_cache,
        gpu_memory_budget=plan.gpu_memory_budget,
    )
