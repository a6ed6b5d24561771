"""The gates of the export validation (export/validate.py builds the cases and runs the graphs):
the error figures of one output against its reference, the fp32 budget check with its one-line
refusal and the ``--accept-validation-error`` override, and the reduced-precision (fp16 / bf16)
cosine gates.

:func:`error_stats` (max, mean and 99th-percentile absolute error, max relative error) and
:func:`cosine_stats` (row cosines) make a case's figures; :func:`refuse_or_accept` compares one
figure with its budget (``tolerances.EXPORT_VALIDATION_BUDGETS`` and the other export gates of
:mod:`masc_engine.tolerances`) and raises :class:`ExportValidationError` carrying the report, unless
:func:`accept_validation_error` allows it.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..errors import ExportValidationError
from ..tolerances import (
    FIDELITY_MIN_EMBEDDING_COSINE,
    REDUCED_TOKEN_COSINE_MEDIAN,
    REDUCED_TOKEN_COSINE_P001,
    export_validation_atol,
    export_validation_rtol,
)

#: Reduced-precision graphs (export/precision.py) are checked with the ``fp16`` / ``bf16`` gates
#: instead of the fp32 per-shape budgets (``tolerances.EXPORT_VALIDATION_BUDGETS``): cosines of
#: patch tokens and pooled embeddings, |dCP|.
REDUCED_GATES = ("fp16", "bf16")


def error_stats(actual: np.ndarray, expected: np.ndarray) -> dict:
    """The error figures of ``actual`` against ``expected`` (same shape, any float dtype; computed in
    float64): max / mean / p99 absolute error, max relative error (max |error| / max |expected|;
    the absolute figure when ``expected`` is all zeros) and the shape."""
    d = np.abs(np.asarray(actual, np.float64) - np.asarray(expected, np.float64))
    scale = float(np.abs(expected).max()) or 1.0
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "p99_abs": float(np.quantile(d, 0.99)),
        "max_rel": float(d.max() / scale),
        "shape": list(np.shape(actual)),
    }


#: ``masc-export --accept-validation-error``: the largest error figure accepted past its budget
#: while :func:`accept_validation_error` is active (None: every budget refuses).
_ACCEPTED: list = [None]


@contextmanager
def accept_validation_error(error: float | None):
    """Within the block, a fp32 validation check whose error figure is past its budget but at most
    ``error`` is accepted: its report records the override (``"override"``: the accepted bound,
    the measured figure, the budget and where it comes from) instead of raising. The figure is the
    one the budget bounds: the max relative error (max |error| / max |reference|) for the SigLIP2
    and segmenter graphs, max |error| for the ``cp`` graph. ``None``: no override (the default)."""
    if error is not None and not (np.isfinite(error) and error > 0):
        raise ValueError(f"--accept-validation-error must be a positive number, got {error}")
    before, _ACCEPTED[0] = _ACCEPTED[0], error
    try:
        yield
    finally:
        _ACCEPTED[0] = before


def refuse_or_accept(what: str, figure: str, error: float, budget: float, budget_from: str, report: dict) -> dict:
    """``report`` when ``error`` is within ``budget``; else the override record added to it when
    :func:`accept_validation_error` allows ``error``; else :class:`ExportValidationError` in one
    line naming the figure, the budget, where the budget comes from and the way out.

    Args:
        what: the check (``graph 'vision' differs from PyTorch``).
        figure: the error figure's name (``max |error|``, ``max relative error``).
        error: the measured figure.
        budget: its budget (same unit as ``error``).
        budget_from: where the budget comes from (a tolerances.py constant and its measurement).
        report: the check's report (returned, or carried by the error).
    """
    if np.isfinite(error) and error <= budget:
        return report
    accepted = _ACCEPTED[0]
    if accepted is not None and error <= accepted:
        report["override"] = {
            "accept_validation_error": accepted,
            "figure": figure,
            "measured": error,
            "budget": budget,
            "budget_from": budget_from,
        }
        return report
    way_out = (
        ""
        if not np.isfinite(error)
        else f"; if the checkpoint is right, pass --accept-validation-error {_round_up(error):g}"
        " to export anyway (recorded in the manifest)"
    )
    raise ExportValidationError(f"{what}: {figure} {error:.3g} > budget {budget:g} ({budget_from}){way_out}", report)


def _round_up(x: float) -> float:
    """``x`` rounded up to 2 significant digits (an override bound that covers it)."""
    e = 10.0 ** (np.floor(np.log10(x)) - 1)
    return float(np.ceil(x / e) * e)


def _check(
    name: str, cases: list[dict], atol: float | None = None, against: str = "PyTorch", budget_from: str = "given"
) -> dict:
    """Raise unless the cases' error is within budget (or accepted by
    :func:`accept_validation_error`). With ``atol`` given: max |error| against it. Default: the
    max relative error (max |error| / max |reference|, per case) against the per-shape gate of
    ``tolerances.export_validation_rtol`` for the outputs' width (the cases' last dimension); the
    report also carries max |error| and the absolute budget at unit scale (``atol``)."""
    worst_abs = max(c["max_abs"] for c in cases)
    if atol is not None:
        report = {"max_abs": worst_abs, "atol": atol, "budget_from": budget_from, "cases": cases}
        return refuse_or_accept(
            f"graph {name!r} differs from {against}", "max |error|", worst_abs, atol, budget_from, report
        )
    width = int(cases[0]["shape"][-1])
    atol = export_validation_atol(name, width)[0]
    rtol, budget_from = export_validation_rtol(name, width)
    worst = max(c["max_rel"] for c in cases)
    report = {
        "max_rel": worst,
        "rtol": rtol,
        "max_abs": worst_abs,
        "atol": atol,
        "budget_from": budget_from,
        "cases": cases,
    }
    return refuse_or_accept(
        f"graph {name!r} differs from {against}", "max relative error", worst, rtol, budget_from, report
    )


def row_cosines(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Cosine per row (last axis) of two ``[..., D]`` arrays, in float64."""
    a = np.asarray(actual, np.float64).reshape(-1, np.shape(actual)[-1])
    b = np.asarray(expected, np.float64).reshape(-1, np.shape(expected)[-1])
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.where(den > 0, den, 1.0)


def cosine_stats(actual: np.ndarray, expected: np.ndarray) -> dict:
    """Reduced-precision figures for ``[..., D]`` outputs: row cosines (min, 0.1st percentile,
    median), the absolute errors of :func:`error_stats`, and whether every value is finite."""
    cos = row_cosines(actual, expected)
    finite = bool(np.isfinite(actual).all())
    return {
        **error_stats(actual, expected),
        "all_finite": finite,
        "rows": int(cos.size),
        "cos_min": float(cos.min()) if finite else float("nan"),
        "cos_p001": float(np.quantile(cos, 0.001)) if finite else float("nan"),
        "cos_median": float(np.median(cos)) if finite else float("nan"),
    }


def _check_reduced(name: str, cases: list[dict], gates: str, rule: str) -> dict:
    """Gate reduced-precision ``cases`` (from :func:`cosine_stats`).

    ``rule``: ``"tokens"`` (patch tokens: median >= ``REDUCED_TOKEN_COSINE_MEDIAN`` and 0.1st
    percentile >= ``REDUCED_TOKEN_COSINE_P001``) or ``"embedding"`` (every row's cosine >=
    ``FIDELITY_MIN_EMBEDDING_COSINE``). Non-finite values always fail.
    """
    finite = all(c["all_finite"] for c in cases)
    if rule == "tokens":
        median, p001 = min(c["cos_median"] for c in cases), min(c["cos_p001"] for c in cases)
        figures = {"cos_median": median, "cos_p001": p001}
        ok = finite and median >= REDUCED_TOKEN_COSINE_MEDIAN and p001 >= REDUCED_TOKEN_COSINE_P001
        bounds = f"median >= {REDUCED_TOKEN_COSINE_MEDIAN}, 0.1st percentile >= {REDUCED_TOKEN_COSINE_P001}"
    else:
        figures = {"cos_min": min(c["cos_min"] for c in cases)}
        ok = finite and figures["cos_min"] >= FIDELITY_MIN_EMBEDDING_COSINE
        bounds = f"min >= {FIDELITY_MIN_EMBEDDING_COSINE}"
    report = {
        "gates": gates,
        "rule": rule,
        **figures,
        "all_finite": finite,
        "max_abs": max(c["max_abs"] for c in cases),
        "cases": cases,
    }
    if not ok:
        shown = ", ".join(f"{k} {v:.6f}" for k, v in figures.items())
        raise ExportValidationError(
            f"{gates} graph {name!r} fails its gates against PyTorch fp32: cosine {shown} ({bounds})"
            + ("" if finite else "; non-finite outputs")
            + ". Export with --precision fp32 instead.",
            report,
        )
    return report
