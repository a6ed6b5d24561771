"""Reduced-precision certification: a candidate's scores against fp32's on the same pairs.

One rule for every reduced-precision build: bf16 on the CPU and FP8
(:mod:`masc_engine.export.cpu_precision`, :mod:`masc_engine.export.fp8`) and int8
(:mod:`masc_engine.jobs.int8_gate`). Given the fp32 reference's and the candidate's CP and PF of
the same pairs, :func:`certify` computes the figures, compares them with a :class:`GateSet`'s
thresholds (``masc_engine.tolerances``: :data:`FIDELITY_GATES`, :data:`INT8_GATES`), and
returns one report schema (below) with each gate's margin. Pure: arrays in, a dict of plain
values out.

The figures, over the pairs kept (per score, the pairs where both sides are finite):

- ``max_abs_dcp`` / ``max_abs_dpf``: the largest per-pair |candidate - fp32| (0.0 with no pair),
  ``mean_abs_dcp`` / ``mean_abs_dpf`` their means;
- ``spearman_cp`` / ``spearman_pf``: Spearman's rho between the two sides
  (:func:`masc_engine.metrics.ranked.spearman_rho`, average ranks for ties; NaN when a side is
  constant, which fails the gate).

The report (JSON-ready; stored in bundle manifests):

``{"pass", "pairs", "gates": {name: {"value", "threshold", "margin", "pass"}}, "mean_abs_dcp",
"mean_abs_dpf", "max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf", "margins": {score
gate: margin}, "passed"}`` (``passed`` equals ``pass``). A gate's ``margin`` is how far its value
sits inside the threshold (negative: past it). Gates: ``max_abs_dcp``, ``spearman_cp``,
``max_abs_dpf`` (only when the gate set bounds |dPF|), ``spearman_pf``, ``finite_as_fp32``
(non-finite rule ``"gate"`` only: pairs whose score is finite on one side only, plus infinite
candidate scores, must be 0) and ``min_pairs``.

Reports written before this schema: bf16-cpu and FP8 certificates hold a subset of it (``pass``,
``pairs``, ``gates``, the means; summaries hold the flat figures and ``margins``); int8
``precision.gate_report`` holds every key above except ``pass``, with ``gates`` as the thresholds
``{"max_abs_dcp": 0.01, "min_spearman": 0.995}``. :func:`gate_thresholds` and :func:`passed`
read both forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..tolerances import FIDELITY_MAX_ABS_DELTA, FIDELITY_MIN_SPEARMAN, INT8_MAX_ABS_DCP, INT8_MIN_SPEARMAN
from .ranked import spearman_rho

__all__ = ["GateSet", "FIDELITY_GATES", "INT8_GATES", "certify", "gate_load", "gate_thresholds", "passed"]

#: The score gates, in report order (a ``margins`` entry each when present).
SCORE_GATES = ("max_abs_dcp", "max_abs_dpf", "spearman_cp", "spearman_pf")


@dataclass(frozen=True)
class GateSet:
    """The thresholds of one reduced-precision gate set.

    Attributes:
        max_abs_dcp (float): the most per-pair |dCP|.
        max_abs_dpf (float or None): the most per-pair |dPF|; None: reported, not gated.
        min_spearman (float): the least Spearman's rho of CP and of PF, in (-1, 1].
        nonfinite (str): ``"gate"``: each score is compared over the pairs finite on both sides,
            and a pair finite on one side only (or an infinite candidate score) fails the
            ``finite_as_fp32`` gate; ``"drop"``: a pair with any non-finite score (CP or PF,
            either side) is left out of every figure, and ``pairs`` counts those kept.
    """

    max_abs_dcp: float
    max_abs_dpf: float | None
    min_spearman: float
    nonfinite: str = "gate"


#: bf16-cpu and FP8 (tolerances.FIDELITY_MAX_ABS_DELTA on |dCP| and |dPF|, FIDELITY_MIN_SPEARMAN).
FIDELITY_GATES = GateSet(FIDELITY_MAX_ABS_DELTA, FIDELITY_MAX_ABS_DELTA, FIDELITY_MIN_SPEARMAN, "gate")
#: int8 (tolerances.INT8_MAX_ABS_DCP on |dCP|, INT8_MIN_SPEARMAN; non-finite pairs dropped).
INT8_GATES = GateSet(INT8_MAX_ABS_DCP, None, INT8_MIN_SPEARMAN, "drop")


def _gate(value, threshold, ok, upper: bool = True) -> dict:
    """One gate's record; ``upper``: the threshold is a most (|dCP|), else a least (Spearman)."""
    margin = threshold - value if upper else value - threshold
    return {"value": value, "threshold": threshold, "margin": float(margin), "pass": bool(ok)}


def _paired(ref: dict, test: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for k in ("cp", "pf"):
        r, t = np.asarray(ref[k], np.float64), np.asarray(test[k], np.float64)
        if r.shape != t.shape or r.ndim != 1:
            raise ValueError(f"{k}: {r.shape} reference scores vs {t.shape} candidate scores")
        out[k] = (r, t)
    if out["cp"][0].shape != out["pf"][0].shape:
        raise ValueError(f"{out['cp'][0].shape} CP scores vs {out['pf'][0].shape} PF scores")
    return out


def _kept(sides: dict, rule: str) -> tuple[dict[str, np.ndarray], int, int]:
    """``({score: mask of pairs compared}, pairs, non-finite count)`` under ``rule``."""
    if rule == "drop":
        ok = np.logical_and.reduce([np.isfinite(a) for r, t in sides.values() for a in (r, t)])
        return {"cp": ok, "pf": ok}, int(ok.sum()), 0
    if rule != "gate":
        raise ValueError(f"nonfinite must be 'gate' or 'drop', got {rule!r}")
    bad = sum(int((np.isfinite(r) != np.isfinite(t)).sum() + np.isinf(t).sum()) for r, t in sides.values())
    return {k: np.isfinite(r) & np.isfinite(t) for k, (r, t) in sides.items()}, int(sides["cp"][0].size), bad


def certify(ref: dict, test: dict, gates: GateSet, min_pairs: int = 0) -> dict:
    """The gate report of a candidate's scores against the fp32 reference's (module docstring).

    Args:
        ref, test: ``{"cp": [P], "pf": [P]}`` float array_likes, the same pairs in the same order
            (fp32 reference, reduced-precision candidate); NaN is an undefined score.
        gates: the thresholds and the non-finite rule (:data:`FIDELITY_GATES`, :data:`INT8_GATES`).
        min_pairs: the least number of pairs for the gates to count (``FIDELITY_MIN_PAIRS`` on
            bf16-cpu / FP8 held-out pairs; 0: any number).

    Returns:
        The report: ``pass`` is every gate's ``pass``.

    Raises:
        ValueError: arrays not 1-D of one length, or an unknown ``gates.nonfinite``.
    """
    sides = _paired(ref, test)
    kept, n, bad = _kept(sides, gates.nonfinite)
    records, out = {}, {}
    for k, (r, t) in sides.items():
        both = kept[k]
        d = np.abs(r[both] - t[both])
        worst = float(d.max()) if d.size else 0.0
        bound = gates.max_abs_dcp if k == "cp" else gates.max_abs_dpf
        if bound is not None:
            records[f"max_abs_d{k}"] = _gate(worst, bound, worst <= bound)
        rho = spearman_rho(r[both], t[both])
        records[f"spearman_{k}"] = _gate(
            rho, gates.min_spearman, np.isfinite(rho) and rho >= gates.min_spearman, upper=False
        )
        out[f"mean_abs_d{k}"], out[f"max_abs_d{k}"], out[f"spearman_{k}"] = (
            float(d.mean()) if d.size else 0.0,
            worst,
            rho,
        )
    if gates.nonfinite == "gate":
        records["finite_as_fp32"] = _gate(bad, 0, bad == 0)
    records["min_pairs"] = _gate(n, min_pairs, n >= min_pairs, upper=False)
    ok = all(g["pass"] for g in records.values())
    return {
        "pass": ok,
        "pairs": n,
        "gates": records,
        "mean_abs_dcp": out["mean_abs_dcp"],
        "mean_abs_dpf": out["mean_abs_dpf"],
        "max_abs_dcp": out["max_abs_dcp"],
        "max_abs_dpf": out["max_abs_dpf"],
        "spearman_cp": out["spearman_cp"],
        "spearman_pf": out["spearman_pf"],
        "margins": {k: records[k]["margin"] for k in SCORE_GATES if k in records},
        "passed": ok,
    }


def gate_load(report: dict) -> float:
    """One number per report, <= 1 when its score gates pass: the largest of each max |d| over its
    threshold and (1 - Spearman) over (1 - its threshold); infinite when ``finite_as_fp32``
    fails or a Spearman is NaN. The bf16-cpu and FP8 searches sort units by it (lower: closer
    to fp32)."""
    g = report["gates"]
    if "finite_as_fp32" in g and not g["finite_as_fp32"]["pass"]:
        return float("inf")
    parts = [_ratio(g[k]["value"], g[k]["threshold"]) for k in ("max_abs_dcp", "max_abs_dpf") if k in g]
    for k in ("spearman_cp", "spearman_pf"):
        rho = g[k]["value"]
        parts.append(_ratio(1.0 - rho, 1.0 - g[k]["threshold"]) if np.isfinite(rho) else float("inf"))
    return float(max(parts))


def _ratio(used: float, allowed: float) -> float:
    """``used / allowed``; an exact gate (``allowed`` 0) is 0 when met exactly, else infinite."""
    if allowed > 0:
        return used / allowed
    return 0.0 if used <= 0 else float("inf")


def gate_thresholds(report: dict) -> dict[str, Any]:
    """``{gate: threshold}`` of a report in this schema, or of an int8 ``gate_report`` written
    before it (``gates`` = ``{"max_abs_dcp": t, "min_spearman": t}``, read as the
    ``max_abs_dcp``, ``spearman_cp`` and ``spearman_pf`` thresholds)."""
    g = report["gates"]
    if all(isinstance(v, dict) for v in g.values()):
        return {k: v["threshold"] for k, v in g.items()}
    return {"max_abs_dcp": g["max_abs_dcp"], "spearman_cp": g["min_spearman"], "spearman_pf": g["min_spearman"]}


def passed(report: dict) -> bool:
    """Whether a report's gates passed (``pass``; int8 reports written before this schema hold
    ``passed`` only)."""
    return bool(report["pass"] if "pass" in report else report["passed"])
