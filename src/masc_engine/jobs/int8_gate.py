"""Opt-in int8 on CPU: the gated build step. A quantized bundle is accepted only when its gates hold.

``masc-export --precision int8`` (or :func:`quantize_bundle`) copies an fp32 bundle, quantizes the
weights of the vision tower's and text tower's MatMuls to int8 (:func:`masc_engine.export.int8.quantize_graphs`,
ONNX Runtime's dynamic quantization, activations quantized per call), scores a gate set of pairs
with both bundles through the pairs job (masc-run's own code), and keeps the int8 bundle only
if, against fp32 on the same pairs (the int8 acceptance gates, :data:`INT8_GATES` of
:mod:`masc_engine.metrics.certification`, the rule every reduced-precision build is certified by):

- max per-pair |Delta CP| <= 1e-2, and
- Spearman's rho >= 0.995 for CP and for PF.

Otherwise it raises :class:`Int8GateError` printing the measured figures, and writes nothing.
The pooling head stays fp32: it is a few MatMuls on one query, and PF is its cosine.

This step sits in the job layer, above both the export layer (which only quantizes) and the
runtime, so that ``export/`` never imports the jobs that score.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..engine.manifest import write_manifest
from ..errors import MascEngineError
from ..export.int8 import quantize_graphs
from ..export.stages import StageClock
from ..metrics.certification import INT8_GATES, certify, gate_thresholds
from ..tolerances import INT8_MAX_ABS_DCP, INT8_MIN_SPEARMAN  # noqa: F401  (the gates; importable from here too)
from .pairs import RunOptions, run_pairs
from .results import read_output

logger = logging.getLogger(__name__)


class Int8GateError(MascEngineError):
    """The int8 bundle failed its gates against fp32; ``report`` holds the figures."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


#: What the int8 path imports, each with what needs it: ONNX Runtime's quantizer reads and writes
#: graphs with onnx; exporting the fp32 bundle first needs the export extra (torch, transformers,
#: onnxscript). The gate's Spearman's rho is numpy's (metrics/ranked.py): no scipy.
INT8_NEEDS = (("onnx", "quantizing to int8 (onnxruntime.quantization)"),)
EXPORT_NEEDS = (("torch", "masc-export"), ("transformers", "masc-export"), ("onnxscript", "masc-export"))


def check_int8_dependencies(exporting: bool = True) -> None:
    """Fail in one line, before any work, when a package the int8 path needs is missing (the
    message names the package and the extra that brings it).

    Args:
        exporting: the fp32 bundle is exported first (no ``--fp32-bundle``): torch and
            transformers are needed too.

    Raises:
        MissingDependencyError: one line naming the first missing package and its extra.
    """
    from ..extras import check

    for module, purpose in (EXPORT_NEEDS if exporting else ()) + INT8_NEEDS:
        check(module, purpose)


def gate_report(cp32, pf32, cp8, pf8) -> dict:
    """The int8 gate report for paired score arrays: :func:`masc_engine.metrics.certification.certify`
    with :data:`INT8_GATES` (pairs with any non-finite score dropped; |dPF| reported, not gated).

    Args:
        cp32, pf32, cp8, pf8 (array_like of float): ``[N]`` scores of the same pairs from the fp32 and int8 bundles.

    Returns:
        The certification report: ``pass`` (and ``passed``), ``pairs`` (kept), ``max_abs_dcp``,
        ``mean_abs_dcp``, ``max_abs_dpf``, ``mean_abs_dpf``, ``spearman_cp``, ``spearman_pf``
        (:func:`masc_engine.metrics.ranked.spearman_rho`, equal to scipy.stats.spearmanr),
        ``gates`` (per gate: value, threshold, margin, pass) and ``margins`` (per gate, how far
        inside its threshold the figure sits; negative: past it).

    Raises:
        ValueError: the arrays are not 1-D of one length.
    """
    return certify({"cp": cp32, "pf": pf32}, {"cp": cp8, "pf": pf8}, INT8_GATES)


def format_gates(report: dict) -> str:
    """The gate figures of :func:`gate_report` as one line, each with its gate and margin."""
    m, t = report["margins"], gate_thresholds(report)
    return (
        f"max |dCP| {report['max_abs_dcp']:.4f} (gate <= {t['max_abs_dcp']:g}, margin {m['max_abs_dcp']:+.4f}), "
        f"Spearman CP {report['spearman_cp']:.4f} (gate >= {t['spearman_cp']:g}, margin {m['spearman_cp']:+.4f}), "
        f"PF {report['spearman_pf']:.4f} (margin {m['spearman_pf']:+.4f}) over {report['pairs']} pairs "
        "(gates: tolerances.INT8_MAX_ABS_DCP, INT8_MIN_SPEARMAN)"
    )


def _score_csv(bundle: Path, pairs_csv: Path) -> tuple[np.ndarray, np.ndarray]:
    """Scores of ``pairs_csv`` by ``bundle`` (masc-run's job; the scorer is gone when this returns)."""
    import warnings

    from ..runtime.scorer import Scorer

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = Path(tmp) / "gate.csv"
        run_pairs(pairs_csv, Scorer(bundle), out, options=RunOptions(progress=False))
        rows = read_output(out)
    return (np.array([float(r["cp"]) for r in rows]), np.array([float(r["pf"]) for r in rows]))


def quantize_bundle(
    fp32_bundle: str | Path, out_dir: str | Path, gate_pairs: str | Path, keep_refused_at: str | Path | None = None
) -> dict:
    """Write an int8 copy of ``fp32_bundle`` to ``out_dir`` if it passes its gates.

    Args:
        fp32_bundle: a bundle from masc-export (fp32).
        out_dir: where the int8 bundle goes (must not be the fp32 bundle).
        gate_pairs: a pairs CSV to gate on (the shared DreamBooth pairs in this project).
        keep_refused_at: benchmarks only: where to keep a *refused* int8 bundle (marked
            ``"refused": true`` in its manifest) so its speed can still be measured.

    Returns:
        The gate report (also stored in the int8 manifest under ``precision``).

    Raises:
        Int8GateError: the gates fail; nothing is written to ``out_dir``.
        MissingDependencyError: onnx is not installed (checked before quantizing).
    """
    src, out = Path(fp32_bundle), Path(out_dir)
    if src.resolve() == out.resolve():
        raise ValueError("write the int8 bundle to another directory than the fp32 one")
    check_int8_dependencies(exporting=False)  # before quantizing, not at the gate
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        stage = Path(tmp) / "bundle"
        shutil.copytree(src, stage)
        manifest = quantize_graphs(src, stage)
        clock = StageClock()
        scores = {}
        for name, bundle in (("fp32", src), ("int8", stage)):  # one bundle in memory at a time
            with clock.stage(f"int8 gate {name} scores") as note:
                scores[name] = _score_csv(bundle, Path(gate_pairs))
                note["message"] = f"scored the gate pairs with the {name} bundle"
        (cp32, pf32), (cp8, pf8) = scores["fp32"], scores["int8"]
        report = gate_report(cp32, pf32, cp8, pf8)
        logger.info("int8 gates vs fp32: " + format_gates(report))
        if not report["pass"]:
            if keep_refused_at is not None:
                manifest["precision"].update(refused=True, gate_report=report)
                write_manifest(stage, manifest)
                shutil.rmtree(keep_refused_at, ignore_errors=True)
                shutil.move(str(stage), str(keep_refused_at))
            raise Int8GateError("int8 refused: " + format_gates(report), report)
        manifest["precision"]["gate_report"] = report
        manifest["precision"]["gate_pairs"] = str(gate_pairs)
        write_manifest(stage, manifest)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(stage), str(out))
    return report
