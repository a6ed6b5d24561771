"""The statistics of the paper's score tables: a mean with its percentile-bootstrap CI, the paired
difference of two methods' means, and rows averaged over a shared key (pure numpy).

Every interval is :func:`masc_engine.metrics.agreement.bootstrap_ci` /
:func:`~masc_engine.metrics.agreement.bootstrap_diff_ci` (the one bootstrap: Efron & Tibshirani
1993, ch. 13, percentile interval over units). A group with fewer than :data:`MIN_CI_N` units has
no interval: resampling one value gives the value back, a zero-width interval that would read as
certainty; its ``note`` says ``n=1: no CI`` instead.

Conventions: float64 arrays, NaN = missing (left out of a mean, never 0); units on the last axis.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from .agreement import CI, Estimate, bootstrap_ci, bootstrap_diff_ci

__all__ = ["MIN_CI_N", "no_ci_note", "mean_ci", "paired_mean_diff", "average_over"]

#: The fewest units a group needs for a bootstrap interval.
MIN_CI_N = 2


def no_ci_note(n: int) -> str:
    """The note of a group too small for an interval: ``"n=1: no CI"`` (``"n=0: no value"``)."""
    return "n=0: no value" if n == 0 else f"n={n}: no CI"


def _finite(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"scores must be 1-D (units,), got shape {a.shape}")
    return a[~np.isnan(a)]


def _small(values: np.ndarray, confidence: float) -> CI:
    n = int(values.size)
    est = Estimate(float(values.mean()), n) if n else Estimate.undefined(0, "no value")
    return CI(est, float("nan"), float("nan"), confidence, 0, 0, no_ci_note(n))


def mean_ci(x: Any, *, n_resamples: int = 1000, confidence: float = 0.95, seed: int | None = 0) -> CI:
    """The mean of a score over units with its percentile-bootstrap CI.

    Args:
        x: float array_like, shape ``(n,)``; NaN entries (missing scores) are left out first.
        n_resamples: bootstrap resamples (as :func:`~masc_engine.metrics.agreement.bootstrap_ci`).
        confidence: the interval's coverage in (0, 1).
        seed: the resampling seed (None: fresh entropy).

    Returns:
        CI: ``value`` the mean of the defined values, ``n`` their count; ``low``/``high`` the
            (1-c)/2 and (1+c)/2 quantiles of the resampled means. With fewer than
            :data:`MIN_CI_N` values the bounds are NaN and ``note`` is :func:`no_ci_note`
            (``n=0``: the mean is undefined too).

    Raises:
        ValueError: ``x`` not 1-D; bad confidence or n_resamples.
    """
    v = _finite(x)
    if v.size < MIN_CI_N:
        return _small(v, confidence)
    return bootstrap_ci(np.mean, v, n_resamples=n_resamples, confidence=confidence, seed=seed)


def paired_mean_diff(a: Any, b: Any, *, n_resamples: int = 1000, confidence: float = 0.95, seed: int | None = 0) -> CI:
    """``mean(a) - mean(b)`` over paired units, with a paired bootstrap CI: each resample draws unit
    indices once and applies them to both sides (the pairing is kept; Efron & Tibshirani 1993).

    Args:
        a: float array_like, shape ``(n,)``: unit ``i`` of ``a`` is paired with unit ``i`` of
            ``b`` (same subject, prompt, ...). A pair with NaN on either side is left out.
        b: float array_like, shape ``(n,)``, the other side of each pair.
        n_resamples: bootstrap resamples (as :func:`~masc_engine.metrics.agreement.bootstrap_diff_ci`).
        confidence: the interval's coverage in (0, 1).
        seed: the resampling seed (None: fresh entropy).

    Returns:
        CI: positive when ``a`` scores higher; ``n`` the complete pairs. An interval excluding 0
            is a difference at the 1 - confidence level. Fewer than :data:`MIN_CI_N` complete
            pairs: NaN bounds and the :func:`no_ci_note`.

    Raises:
        ValueError: not 1-D, lengths differ; bad confidence or n_resamples.
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"a and b must be 1-D of equal length, got shapes {x.shape} and {y.shape}")
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if x.size < MIN_CI_N:
        return _small(x - y, confidence)
    return bootstrap_diff_ci(np.mean, x, y, n_resamples=n_resamples, confidence=confidence, seed=seed)


def average_over(keys: Sequence[Hashable], values: Any) -> tuple[list[Hashable], np.ndarray, np.ndarray]:
    """Rows sharing a key averaged into one unit (e.g. one generated image scored against several
    reference photos of its subject, DreamBench++'s multi-reference protocol).

    Args:
        keys: one hashable per row, length ``n``.
        values: float array_like, shape ``(n,)`` or ``(n, k)``; NaN = missing, left out of its
            unit's mean (a unit with no defined value stays NaN).

    Returns:
        ``(unit_keys, means, counts)``: the distinct keys in order of first appearance (``u`` of
        them), float64 means of shape ``(u,)`` or ``(u, k)``, and int64 ``(u,)`` rows per unit.

    Raises:
        ValueError: ``values`` has a different number of rows than ``keys``.
    """
    v = np.asarray(values, dtype=np.float64)
    flat = v.ndim == 1
    v2 = v[:, None] if flat else v
    if v2.ndim != 2 or v2.shape[0] != len(keys):
        raise ValueError(f"values must have {len(keys)} rows, got shape {v.shape}")
    index: dict[Hashable, int] = {}
    inv = np.asarray([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
    u = len(index)
    have = ~np.isnan(v2)
    sums = np.zeros((u, v2.shape[1]))
    cnt = np.zeros((u, v2.shape[1]))
    np.add.at(sums, inv, np.where(have, v2, 0.0))
    np.add.at(cnt, inv, have)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(cnt > 0, sums / np.maximum(cnt, 1), np.nan)
    counts = np.bincount(inv, minlength=u).astype(np.int64)
    return list(index), (means[:, 0] if flat else means), counts
