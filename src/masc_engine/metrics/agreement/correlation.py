"""Spearman's rho between a metric and human ratings (the kernel is :mod:`..ranked`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ranked import RankedPairs, spearman_rho
from .estimate import Estimate, _as_metric_human, _check_agg, _mean_over_raters


def spearman(x: Any, y: Any) -> Estimate:
    """Spearman's rank correlation, ties as average ranks.

    Args:
        x, y: float array_likes, shape ``(n,)``: paired observations; a pair with NaN in either is dropped
            (pairwise-complete).

    Returns:
        Estimate: ``value`` in [-1, 1]: the Pearson correlation of the average ranks
            (Spearman 1904; ties as ``scipy.stats.rankdata(method="average")``, so equal to
            ``scipy.stats.spearmanr``), computed by :func:`masc_engine.metrics.ranked.spearman_rho`.
            ``n`` = complete pairs. Undefined (NaN + reason) with fewer than 2 complete pairs or
            when either side is constant (zero rank variance) -- never 0.

    Raises:
        ValueError: Not 1-D, or lengths differ.
    """
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"spearman needs 1-D inputs, got shapes {a.shape} and {b.shape}")
    if a.shape != b.shape:
        raise ValueError(f"spearman inputs differ in length: {a.size} vs {b.size}")
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    n = int(a.size)
    if n < 2:
        return Estimate.undefined(n, f"{n} complete pair(s); need >= 2")
    for name, v in (("x", a), ("y", b)):
        if np.all(v == v[0]):
            return Estimate.undefined(
                n, f"{name} is constant (all {n} values equal {v[0]:g}); rank correlation is undefined"
            )
    return Estimate(spearman_rho(a, b), n)


class _WeightedSpearman:
    """Spearman's rho of unit-resampled data from unit weights: the complete pairs of ``x`` and
    ``y`` (NaN in either dropped) as :class:`~masc_engine.metrics.ranked.RankedPairs`, whose
    weighted rho equals ``scipy.stats.spearmanr`` on the materialised resample."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.ok = ~(np.isnan(x) | np.isnan(y))
        self.pairs = RankedPairs(x[self.ok], y[self.ok])

    def rho(self, weights: np.ndarray) -> float:
        return self.pairs.rho(weights[self.ok])


def _fast_metric_human_spearman(metric: np.ndarray, human: np.ndarray, human_agg: str) -> Callable[[np.ndarray], float]:
    """``idx -> metric_human_spearman(metric[idx], human[:, idx], human_agg)``."""
    n = metric.size
    if human.shape[0] == 1:
        parts = [_WeightedSpearman(metric, human[0])]
    elif human_agg == "joint":
        cnt = (~np.isnan(human)).sum(axis=0)
        mean = np.where(cnt > 0, np.nansum(human, axis=0) / np.maximum(cnt, 1), np.nan)
        parts = [_WeightedSpearman(metric, mean)]
    else:
        parts = [_WeightedSpearman(metric, human[i]) for i in range(human.shape[0])]

    def run(idx: np.ndarray) -> float:
        w = np.bincount(idx, minlength=n).astype(np.float64)
        vals = [r for r in (p.rho(w) for p in parts) if not math.isnan(r)]
        return float(np.mean(vals)) if vals else float("nan")

    return run


def metric_human_spearman(metric_scores: Any, human_scores: Any, *, human_agg: str = "per_rater") -> Estimate:
    """Spearman's rho between a metric and one or more human raters.

    ``human_scores`` has shape (units,) or (raters, units), NaN = missing.
    ``"per_rater"`` (default; DreamBench++ ``pearson.py`` averages the
    correlation over its two human groups) = mean over raters of
    ``spearman(metric, rater_i)`` over the raters where it is defined;
    ``"joint"`` = ``spearman(metric, mean rating per unit)``.
    ``n`` = units with a metric score and at least one rating.
    """
    _check_agg(human_agg)
    m, h = _as_metric_human(metric_scores, human_scores)
    n = int((~np.isnan(m) & (~np.isnan(h)).any(axis=0)).sum())
    if h.shape[0] == 1:
        est = spearman(m, h[0])
        return Estimate(est.value, n, est.reason)
    if human_agg == "joint":
        with np.errstate(invalid="ignore"):
            cnt = (~np.isnan(h)).sum(axis=0)
            mean = np.where(cnt > 0, np.nansum(h, axis=0) / np.maximum(cnt, 1), np.nan)
        est = spearman(m, mean)
        return Estimate(est.value, n, est.reason)
    return _mean_over_raters([spearman(m, r) for r in h], n)
