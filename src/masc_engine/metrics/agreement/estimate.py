"""Result types and input conventions shared by the agreement statistics.

:class:`Estimate` (a value that may be undefined, with its reason) and :class:`CI` (an estimate
with a percentile-bootstrap interval); the checks every statistic applies to its inputs
(levels of measurement, reliability data ``(coders, units)``, metric/human pairing, the
per-rater aggregation); and :func:`_require`, the lazy import of the ``eval`` extra.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

LEVELS = ("nominal", "ordinal", "interval", "ratio")
MAPPINGS = ("quantile", "linear", "none")
HUMAN_AGGS = ("per_rater", "joint")


def _require(module: str) -> Any:
    from ... import extras

    # MissingDependencyError (an ImportError): one line naming the [eval] extra's packages
    return extras.require(module, "masc-engine's meta-evaluation", extra="eval")


@dataclass(frozen=True)
class Estimate:
    """A point estimate that may be undefined.

    Attributes:
        value (float): The statistic, or ``nan`` when undefined.
        n (int): Number of units that entered the computation (after dropping missing).
        reason (str or None): ``None`` when defined; otherwise a human-readable reason why the value
            is undefined (e.g. ``"x is constant ..."``).
    """

    value: float
    n: int
    reason: str | None = None

    @property
    def defined(self) -> bool:
        return self.reason is None and not math.isnan(self.value)

    def __float__(self) -> float:
        return float(self.value)

    @classmethod
    def undefined(cls, n: int, reason: str) -> Estimate:
        return cls(float("nan"), int(n), reason)


@dataclass(frozen=True)
class CI:
    """A point estimate with a percentile-bootstrap confidence interval.

    Attributes:
        estimate (Estimate): The statistic on the full sample.
        low, high (float): Percentile interval bounds, ``nan`` when the estimate is undefined or
            no resample gave a defined statistic.
        confidence (float): Nominal coverage, e.g. 0.95.
        n_resamples (int): Resamples drawn.
        n_valid (int): Resamples whose statistic was defined (the others are dropped, and
            ``note`` says so).
        note (str or None): Caveats: dropped resamples, or why the interval is missing.
    """

    estimate: Estimate
    low: float
    high: float
    confidence: float
    n_resamples: int
    n_valid: int
    note: str | None = None

    @property
    def value(self) -> float:
        return self.estimate.value

    @property
    def n(self) -> int:
        return self.estimate.n

    @property
    def reason(self) -> str | None:
        return self.estimate.reason


def _check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return level


def _as_reliability(ratings: Any) -> np.ndarray:
    try:
        data = np.asarray(ratings, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"ratings must be numeric (NaN for missing): {exc}") from exc
    if data.ndim == 1:
        data = data[np.newaxis, :]
    if data.ndim != 2:
        raise ValueError(f"ratings must have shape (coders, units), got shape {data.shape}")
    if np.isinf(data).any():
        raise ValueError("ratings contain +/-inf; use NaN for missing values")
    return data


def _as_metric_human(metric_scores: Any, human_scores: Any) -> tuple[np.ndarray, np.ndarray]:
    m = np.asarray(metric_scores, dtype=np.float64)
    if m.ndim != 1:
        raise ValueError(f"metric_scores must be 1-D (units,), got shape {m.shape}")
    h = _as_reliability(human_scores)
    if h.shape[1] != m.shape[0]:
        raise ValueError(f"metric_scores has {m.shape[0]} units but human_scores has {h.shape[1]}")
    if np.isinf(m).any():
        raise ValueError("metric_scores contain +/-inf; use NaN for missing")
    return m, h


def _categories(h: np.ndarray, categories: Sequence[float] | np.ndarray | None) -> np.ndarray:
    pool = h[~np.isnan(h)]
    if categories is None:
        cats = np.unique(pool)
    else:
        cats = np.unique(np.asarray(categories, dtype=np.float64))
        outside = np.setdiff1d(np.unique(pool), cats)
        if outside.size:
            raise ValueError(f"human ratings {outside[:5].tolist()} are not on the scale {cats.tolist()}")
    if cats.size == 0:
        raise ValueError("no human ratings to define the rating scale")
    return cats


def _check_agg(human_agg: str) -> None:
    if human_agg not in HUMAN_AGGS:
        raise ValueError(f"human_agg must be one of {HUMAN_AGGS}, got {human_agg!r}")


def _mean_over_raters(per_rater: Sequence[Estimate], n: int) -> Estimate:
    """``human_agg="per_rater"``: the mean of the raters' defined estimates (``n`` units), undefined
    with every rater's reason when none is defined."""
    vals = [e.value for e in per_rater if e.defined]
    if not vals:
        return Estimate.undefined(n, "; ".join(f"rater {i}: {e.reason}" for i, e in enumerate(per_rater)))
    return Estimate(float(np.mean(vals)), n)
