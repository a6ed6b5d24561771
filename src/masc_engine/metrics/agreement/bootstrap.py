"""Percentile bootstrap over units: :func:`bootstrap_ci`, :func:`bootstrap_diff_ci` and the
shared driver the agreement and AUC rows use (with their faster, identical resample paths)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .estimate import CI, Estimate


def _as_estimate(out: Any, n: int) -> Estimate:
    if isinstance(out, Estimate):
        return out
    v = float(out)
    return Estimate(v, n) if not math.isnan(v) else Estimate.undefined(n, "statistic returned NaN")


def _unit_arrays(arrays: Sequence[Any]) -> tuple[list[np.ndarray], int]:
    if not arrays:
        raise ValueError("bootstrap needs at least one array")
    arrs = [np.asarray(a) for a in arrays]
    n = arrs[0].shape[-1] if arrs[0].ndim else 0
    for a in arrs:
        if a.ndim == 0 or a.shape[-1] != n:
            raise ValueError(f"all arrays must share the unit (last) axis; got shapes {[x.shape for x in arrs]}")
    return arrs, n


def _resample_indices(rng: np.random.Generator, n: int, strata: np.ndarray | None) -> np.ndarray:
    if strata is None:
        return rng.integers(0, n, size=n)
    parts = []
    for s in np.unique(strata):
        members = np.flatnonzero(strata == s)
        parts.append(members[rng.integers(0, members.size, size=members.size)])
    return np.concatenate(parts)


def _percentile_bootstrap(
    fn: Callable[..., Any],
    arrs: list[np.ndarray],
    n: int,
    *,
    n_resamples: int,
    confidence: float,
    seed: int | None,
    strata: Any,
    resampled: Callable[[np.ndarray], Any] | None = None,
) -> CI:
    """Shared driver. ``resampled(idx)``, when given, replaces
    ``fn(*[a[..., idx] for a in arrs])`` for the resamples (a faster but
    identical computation); the index stream is the same either way."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    st = None
    if strata is not None:
        st = np.asarray(strata)
        if st.shape != (n,):
            raise ValueError(f"strata must have shape ({n},), got {st.shape}")
    point = _as_estimate(fn(*arrs), n)
    if not point.defined:
        return CI(point, float("nan"), float("nan"), confidence, 0, 0, "estimate undefined; no interval")
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(n_resamples):
        idx = _resample_indices(rng, n, st)
        out = resampled(idx) if resampled is not None else fn(*[a[..., idx] for a in arrs])
        est = _as_estimate(out, n)
        if est.defined:
            vals.append(est.value)
    n_valid = len(vals)
    if n_valid == 0:
        return CI(
            point, float("nan"), float("nan"), confidence, n_resamples, 0, "statistic undefined in every resample"
        )
    alpha = 1.0 - confidence
    low, high = np.quantile(np.asarray(vals), [alpha / 2.0, 1.0 - alpha / 2.0])
    note = None
    if n_valid < n_resamples:
        note = f"{n_resamples - n_valid} of {n_resamples} resamples undefined and dropped"
    return CI(point, float(low), float(high), confidence, n_resamples, n_valid, note)


def bootstrap_ci(
    statistic: Callable[..., Any],
    *arrays: Any,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
    strata: Any = None,
) -> CI:
    """Percentile bootstrap confidence interval, resampling units.

    Args:
        statistic: ``statistic(*arrays) -> float | Estimate``. An undefined result (NaN
            or an undefined ``Estimate``) in a resample is dropped and counted.
        *arrays: array_likes, each with the units on its **last** axis (shape (n,) or
            (coders, n)); all share n. One resample draws n unit indices with
            replacement and applies them to every array (paired resampling, so
            the metric/human pairing is kept).
        n_resamples: Number of bootstrap resamples (B).
        confidence: the interval's nominal coverage, in (0, 1).
        seed: Seed for ``numpy.random.default_rng``; a fixed seed gives identical
            intervals on every call and platform with the same NumPy.
        strata: array_like, shape ``(n,)`` (optional): resample within each stratum separately (stratified bootstrap, keeps
            the stratum sizes fixed; used for AUC so each resample has both
            classes).

    Returns:
        CI: ``low``/``high`` are the (1-c)/2 and (1+c)/2 quantiles (NumPy's
            default linear interpolation) of the resampled statistic: Efron &
            Tibshirani (1993), *An Introduction to the Bootstrap*, ch. 13.
            NaN bounds when the full-sample estimate is undefined.

    Raises:
        ValueError: No arrays, unit-axis mismatch, bad confidence / n_resamples / strata.
    """
    arrs, n = _unit_arrays(arrays)
    return _percentile_bootstrap(
        statistic, arrs, n, n_resamples=n_resamples, confidence=confidence, seed=seed, strata=strata
    )


def bootstrap_diff_ci(
    statistic: Callable[..., Any],
    scores_a: Any,
    scores_b: Any,
    *shared: Any,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
    strata: Any = None,
) -> CI:
    """Paired bootstrap CI for ``statistic(a, *shared) - statistic(b, *shared)``.

    For comparing two metrics on the same units (e.g. MaSC CP vs DINO against
    the same human ratings): every resample applies the *same* unit indices
    to ``scores_a``, ``scores_b`` and ``shared``, so the between-metric
    correlation is preserved. An interval excluding 0 indicates a difference
    at the 1 - confidence level. Same parameters, return and errors as
    :func:`bootstrap_ci`; the estimate is undefined if either side is.
    """
    arrs, n = _unit_arrays((scores_a, scores_b, *shared))

    def diff(a: np.ndarray, b: np.ndarray, *rest: np.ndarray) -> Estimate:
        ea = _as_estimate(statistic(a, *rest), n)
        eb = _as_estimate(statistic(b, *rest), n)
        if not ea.defined:
            return Estimate.undefined(ea.n, f"first statistic undefined: {ea.reason}")
        if not eb.defined:
            return Estimate.undefined(eb.n, f"second statistic undefined: {eb.reason}")
        return Estimate(ea.value - eb.value, min(ea.n, eb.n))

    return _percentile_bootstrap(
        diff, arrs, n, n_resamples=n_resamples, confidence=confidence, seed=seed, strata=strata
    )
