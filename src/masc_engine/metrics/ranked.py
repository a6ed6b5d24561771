"""Spearman's rank correlation: the one implementation in the package (numpy only).

Spearman (1904), "The proof and measurement of association between two things", *Am. J.
Psychol.* 15: rho is the Pearson correlation of the two sides' ranks. Ties take the **average**
of the ranks they span (``scipy.stats.rankdata(method="average")``; Kendall & Gibbons, *Rank
Correlation Methods*), so rho equals ``scipy.stats.spearmanr`` (tests/test_ranked.py checks it
to ``tolerances.FLOAT64_SAME_FORMULA_TOL`` on data with ties).

Optional **weights** give the rho of a resample without materialising it: an item drawn ``w``
times is ``w`` tied copies of itself, so value ``v``'s average rank is (weight of items below
``v``) + (weight of items equal to ``v`` + 1) / 2, and rho is the ``w``-weighted Pearson
correlation of those ranks; equal to ``scipy.stats.spearmanr`` on the materialised resample.

Every caller goes through here: :func:`masc_engine.metrics.agreement.spearman` (the point
estimate) and its bootstrap, and the reduced-precision gates
(:mod:`masc_engine.metrics.certification`: bf16-cpu, FP8 and int8). numpy only: the export extra
(which runs the bf16-cpu and FP8 gates) does not install scipy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["average_ranks", "RankedPairs", "spearman_rho"]


def _finite_1d(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if np.isnan(a).any():
        raise ValueError(f"{name} holds NaN; drop the incomplete pairs first")
    return a


def average_ranks(x: Any) -> np.ndarray:
    """1-based ranks with ties sharing their average rank (``scipy.stats.rankdata``'s ``average``).

    Args:
        x: float array_like, shape ``(n,)``, no NaN.

    Returns:
        ndarray of float64, shape ``(n,)``: each value a whole or half number in ``[1, n]``.

    Raises:
        ValueError: not 1-D, or NaN present.
    """
    a = _finite_1d(x, "x")
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inv.reshape(-1)]


class RankedPairs:
    """Paired observations held as codes of their distinct values, for rho under any unit weights.

    Args:
        x, y: float array_likes, shape ``(n,)``, no NaN (callers drop incomplete pairs first).

    Raises:
        ValueError: not 1-D, lengths differ, or NaN present.
    """

    def __init__(self, x: Any, y: Any) -> None:
        a, b = _finite_1d(x, "x"), _finite_1d(y, "y")
        if a.shape != b.shape:
            raise ValueError(f"x and y differ in length: {a.size} vs {b.size}")
        self.n = int(a.size)
        _, ix = np.unique(a, return_inverse=True)
        _, iy = np.unique(b, return_inverse=True)
        self.ix, self.iy = ix.reshape(-1), iy.reshape(-1)
        self.kx = int(self.ix.max()) + 1 if self.n else 0
        self.ky = int(self.iy.max()) + 1 if self.n else 0

    @staticmethod
    def _ranks(inv: np.ndarray, k: int, w: np.ndarray) -> tuple[np.ndarray, int]:
        c = np.bincount(inv, weights=w, minlength=k)
        return (np.cumsum(c) - (c - 1.0) / 2.0)[inv], int(np.count_nonzero(c))

    def rho(self, weights: np.ndarray | None = None) -> float:
        """Spearman's rho with unit ``i`` counted ``weights[i]`` times (default: once each).

        Args:
            weights: float ndarray, shape ``(n,)``, >= 0 (bootstrap draw counts), or None.

        Returns:
            float in ``[-1, 1]``; NaN when the total weight is below 2 or a side has fewer than
            two distinct values carrying weight (zero rank variance).
        """
        w = np.ones(self.n) if weights is None else np.asarray(weights, dtype=np.float64)
        total = float(w.sum())
        if total < 2:
            return float("nan")
        rx, gx = self._ranks(self.ix, self.kx, w)
        ry, gy = self._ranks(self.iy, self.ky, w)
        if gx < 2 or gy < 2:
            return float("nan")
        dx = rx - (w * rx).sum() / total
        dy = ry - (w * ry).sum() / total
        den = math.sqrt(float((w * dx * dx).sum()) * float((w * dy * dy).sum()))
        return float((w * dx * dy).sum()) / den if den > 0 else float("nan")


def spearman_rho(x: Any, y: Any, weights: Any = None) -> float:
    """Spearman's rho of paired observations (average ranks for ties), optionally weighted.

    Args:
        x, y: float array_likes, shape ``(n,)``, no NaN.
        weights: float array_like, shape ``(n,)``, >= 0 (item ``i`` counted ``weights[i]`` times),
            or None (each once).

    Returns:
        float in ``[-1, 1]`` (``scipy.stats.spearmanr(x, y).statistic``, or of the materialised
        weighted sample); NaN with fewer than 2 items or a constant side.

    Raises:
        ValueError: not 1-D, lengths differ, or NaN present.
    """
    return RankedPairs(x, y).rho(None if weights is None else np.asarray(weights, dtype=np.float64))
