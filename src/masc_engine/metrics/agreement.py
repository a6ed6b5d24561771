"""Meta-evaluation: how well a metric agrees with human ratings.

The MaSC paper (arXiv 2605.22469) validates its CP and PF scores two ways:

* on DreamBench++ human ratings (ordinal 0-4 scale, per generated image), by
  Krippendorff's alpha and Spearman's rho between the metric and the human
  rating, per method and pooled, with bootstrap 95% confidence intervals;
* on ORIDa, by the ROC AUC with which the score separates within-subject
  pairs from cross-subject pairs.

This module is the statistics for both. Everything here is pure: arrays in,
small frozen result objects (or rows of plain values) out. No file I/O, no
printing, no reading of table cells: joining score and rating tables is
:mod:`masc_engine.jobs.evaluation`, which masc-eval and masc-report share.

Conventions used throughout:
* Arrays are float64. ``NaN`` means *missing* (an unrated unit, a failed
  score); it is never treated as a value.
* Multi-rater data uses the ``krippendorff`` package's *reliability data*
  layout: shape ``(coders, units)``. A 1-D array is one coder.
* The **unit** is one scored pair (reference image, generated image, prompt).
  Bootstrap resampling is always over units, along the *last* axis.
* A statistic that is mathematically undefined for the given input (constant
  input, one class only, no pairable values ...) is returned as
  ``Estimate(value=nan, reason="...")`` -- never silently as 0.

Third-party dependencies (the ``eval`` extra: ``scipy``, ``krippendorff``,
``scikit-learn``) are imported lazily, so that importing this module works on
a bare runtime install; calling a function that needs one of them raises an
``ImportError`` that names the extra.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "LEVELS",
    "MAPPINGS",
    "HUMAN_AGGS",
    "Estimate",
    "CI",
    "krippendorff_alpha",
    "quantile_bin",
    "linear_map",
    "map_to_scale",
    "metric_human_alpha",
    "spearman",
    "metric_human_spearman",
    "bootstrap_ci",
    "bootstrap_diff_ci",
    "roc_auc",
    "auc_from_counts",
    "within_vs_cross_auc",
    "Joined",
    "POOLED",
    "groups_in_order",
    "agreement_rows",
    "auc_rows",
]

LEVELS = ("nominal", "ordinal", "interval", "ratio")
MAPPINGS = ("quantile", "linear", "none")
HUMAN_AGGS = ("per_rater", "joint")

# Above this many distinct values the krippendorff package would build a
# (units x V x V) array (see krippendorff._coincidences); we switch to the
# exact pairable-values formulas in _alpha_direct instead.
_PACKAGE_MAX_DOMAIN = 64

def _require(module: str) -> Any:
    from .. import extras

    # MissingDependencyError (an ImportError): one line naming the [eval] extra's packages
    return extras.require(module, "masc-engine's meta-evaluation", extra="eval")


# --------------------------------------------------------------------------
# Result types
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Krippendorff's alpha
# --------------------------------------------------------------------------


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


def _ratio_delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    s = a + b
    out = np.zeros(np.broadcast(a, b).shape)
    np.divide(a - b, s, out=out, where=s != 0)
    return out**2


def _alpha_direct(data: np.ndarray, level: str) -> float:
    """Exact alpha from the pairable-values definition, O(values) memory.

    alpha = 1 - (n - 1) * W / B, with
      W = sum_u sum_{c != k in u} delta(c, k) / (m_u - 1)   (observed)
      B = sum_{c != k over all pairable values} delta(c, k)  (expected)
    (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability", sec. A-D).
    Ordinal uses the identity delta_ord(g, h) = (r_h - r_g)^2 with the
    mid-rank r_v = N_{<=v} - n_v / 2 of value v among the pairable values,
    i.e. ordinal alpha is interval alpha on mid-ranks.
    Callers guarantee >= 1 pairable unit and >= 2 distinct pairable values.
    """
    mask = ~np.isnan(data)
    m_u = mask.sum(axis=0)
    keep = m_u >= 2
    data, mask, m_u = data[:, keep], mask[:, keep], m_u[keep]
    values = data[mask]
    n = values.size

    if level == "ordinal":
        uniq, inv, counts = np.unique(values, return_inverse=True, return_counts=True)
        midrank = np.cumsum(counts) - counts / 2.0
        data = data.copy()
        data[mask] = midrank[inv]
        values = data[mask]
        level = "interval"

    coders = data.shape[0]
    within = np.zeros(data.shape[1])
    if level == "interval":
        mean_u = np.where(mask, data, 0.0).sum(axis=0) / m_u
        ss_u = np.where(mask, (data - mean_u) ** 2, 0.0).sum(axis=0)
        # sum_{c != k} (x_c - x_k)^2 = 2 m SS
        w = float((2.0 * m_u * ss_u / (m_u - 1)).sum())
        b = 2.0 * n * float(((values - values.mean()) ** 2).sum())
    else:
        for i in range(coders):
            for j in range(coders):
                if i == j:
                    continue
                both = mask[i] & mask[j]
                a, c = data[i, both], data[j, both]
                if level == "nominal":
                    d = (a != c).astype(np.float64)
                else:
                    d = _ratio_delta(a, c)
                np.add.at(within, np.nonzero(both)[0], d)
        w = float((within / (m_u - 1)).sum())
        uniq, counts = np.unique(values, return_counts=True)
        counts = counts.astype(np.float64)
        if level == "nominal":
            b = float(n) ** 2 - float((counts**2).sum())
        else:  # ratio, chunked over distinct values
            b = 0.0
            step = max(1, 4_000_000 // max(1, uniq.size))
            for start in range(0, uniq.size, step):
                sl = slice(start, start + step)
                d = _ratio_delta(uniq[sl, np.newaxis], uniq[np.newaxis, :])
                b += float((counts[sl, np.newaxis] * counts[np.newaxis, :] * d).sum())
    if b == 0.0:
        return float("nan")
    return 1.0 - (n - 1) * w / b


def krippendorff_alpha(ratings: Any, level: str = "interval", *, value_domain: Sequence[float] | None = None) -> Estimate:
    """Krippendorff's alpha for a coders x units matrix.

    Args:
        ratings: float array_like, shape ``(coders, units)`` or ``(units,)``. Reliability data as in the ``krippendorff`` package: row i holds the
            values coder i gave to each unit; ``NaN`` marks a missing value. A 1-D
            input is a single coder (alpha is then undefined: nothing is
            pairable).
        level: ``"nominal"``, ``"ordinal"``, ``"interval"`` or ``"ratio"``: the level of measurement, which fixes the difference function
            delta (Krippendorff 2011, sec. D).
        value_domain: The ordered scale (optional), e.g. ``[0, 1, 2, 3, 4]``. Only consulted for the
            package path; values absent from the data carry zero weight for every
            level, so this never changes the result, but values outside it raise.

    Returns:
        Estimate: ``value`` <= 1 (1 = perfect agreement, 0 = chance agreement, < 0 =
            systematic disagreement); ``n`` = number of *pairable values* (values
            in units coded by at least two coders), as Krippendorff's n.
            Undefined (``nan`` + reason) when no unit has two values or all
            pairable values are identical (expected disagreement is 0).

    Raises:
        ValueError: Unknown ``level``; not 1-D/2-D; ``inf`` values; values outside
            ``value_domain``.
        TypeError: Non-numeric ratings (encode nominal labels as numbers first).

    Note:
        Source: Krippendorff, K. (2011). *Computing Krippendorff's
        Alpha-Reliability*. Computed by ``krippendorff.alpha`` (reliability_data
        layout, NaN = missing) when the data has at most 64 distinct values;
        above that the package materialises a units x V x V array, so the same
        quantity is computed from the pairable-values formulas directly (exactly
        equal; ``tests/test_agreement.py`` checks both paths against each other).
    """
    _check_level(level)
    data = _as_reliability(ratings)
    mask = ~np.isnan(data)
    m_u = mask.sum(axis=0)
    pairable = m_u >= 2
    n_pairable = int(m_u[pairable].sum())
    if not pairable.any():
        return Estimate.undefined(0, "no unit has values from two or more coders (nothing is pairable)")
    pv = data[:, pairable][mask[:, pairable]]
    uniq = np.unique(pv)
    if value_domain is not None:
        dom = np.asarray(value_domain, dtype=np.float64)
        outside = np.setdiff1d(np.unique(data[mask]), dom)
        if outside.size:
            raise ValueError(f"ratings contain values outside value_domain: {outside[:5].tolist()}")
    if uniq.size < 2:
        return Estimate.undefined(
            n_pairable, f"all {n_pairable} pairable values equal {uniq[0]:g}; expected disagreement is 0"
        )
    if uniq.size <= _PACKAGE_MAX_DOMAIN:
        kd = _require("krippendorff")
        domain = np.unique(np.concatenate([uniq, np.asarray(value_domain, dtype=np.float64)])) if value_domain is not None else uniq
        # Units with fewer than two values carry no weight; dropping them keeps
        # the package's arrays small and does not change alpha.
        value = float(kd.alpha(reliability_data=data[:, pairable], value_domain=domain, level_of_measurement=level))
    else:
        value = _alpha_direct(data, level)
    if math.isnan(value):
        return Estimate.undefined(n_pairable, "expected disagreement is 0")
    return Estimate(value, n_pairable)


# --------------------------------------------------------------------------
# Putting a continuous metric on the human rating scale
# --------------------------------------------------------------------------


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


def _categories(h: np.ndarray, categories: Sequence[float] | None) -> np.ndarray:
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


def quantile_bin(metric_scores: Any, human_scores: Any, categories: Sequence[float] | None = None) -> np.ndarray:
    """Rank-bin a continuous metric into the human scale's categories.

    The metric's values are ranked (ties share their average rank, so tied
    scores always land in the same category) and cut at the cumulative
    proportions of the human ratings, so that the binned metric has the same
    marginal distribution over categories as the human ratings (up to ties and
    rounding): "histogram matching" / equipercentile linking.

    Args:
        metric_scores: float array_like, shape ``(units,)``; NaN = no score; stays NaN in the output.
        human_scores: float array_like, shape ``(units,)`` or ``(raters, units)``. The human marginal is pooled over all raters' non-missing ratings of
            units that have a metric score.
        categories: The ordered rating scale (e.g. ``range(5)`` for DreamBench++'s 0-4).
            Default: the distinct observed human ratings. Categories with no human
            rating receive no metric values.

    Returns:
        ndarray of float64, shape (units,): Each value is one of ``categories`` (or NaN).

    Raises:
        ValueError: Shape mismatch, no human ratings, ratings off ``categories``.

    Note:
        Unit i with average rank r_i among the n scored units gets plotting
        position u_i = (r_i - 1/2) / n and the smallest category k with
        u_i <= F_k, F_k the human cumulative proportion (computed in exact
        integer arithmetic, so boundaries are deterministic).
    """
    stats = _require("scipy.stats")
    m, h = _as_metric_human(metric_scores, human_scores)
    valid = ~np.isnan(m)
    cats = _categories(h[:, valid], categories)
    pool = h[:, valid]
    pool = pool[~np.isnan(pool)]
    out = np.full(m.shape, np.nan)
    n = int(valid.sum())
    if n == 0 or pool.size == 0:
        return out
    counts = np.array([(pool == c).sum() for c in cats], dtype=np.int64)
    cum = np.cumsum(counts)  # F_k * T
    total = int(pool.size)
    twice_rank = np.rint(2 * stats.rankdata(m[valid], method="average")).astype(np.int64)
    lhs = (twice_rank - 1) * total  # 2n * u_i * T
    rhs = 2 * cum * n  # 2n * F_k * T
    idx = np.searchsorted(rhs, lhs, side="left")
    out[valid] = cats[np.minimum(idx, cats.size - 1)]
    return out


def linear_map(metric_scores: Any, categories: Sequence[float], *, round_to_scale: bool = False) -> np.ndarray:
    """Min-max rescale the metric onto [min(categories), max(categories)].

    With ``round_to_scale`` each value is then snapped to the nearest
    category (ties to the lower one). A constant metric maps to the scale's
    midpoint. NaN stays NaN. Returns float64, shape (units,).
    """
    m = np.asarray(metric_scores, dtype=np.float64)
    cats = np.unique(np.asarray(categories, dtype=np.float64))
    lo, hi = float(cats[0]), float(cats[-1])
    valid = ~np.isnan(m)
    out = np.full(m.shape, np.nan)
    if not valid.any():
        return out
    mn, mx = float(m[valid].min()), float(m[valid].max())
    if mx == mn:
        out[valid] = (lo + hi) / 2.0
    else:
        out[valid] = lo + (m[valid] - mn) / (mx - mn) * (hi - lo)
    if round_to_scale:
        dist = np.abs(out[valid][:, np.newaxis] - cats[np.newaxis, :])
        out[valid] = cats[np.argmin(dist, axis=1)]
    return out


def map_to_scale(
    metric_scores: Any,
    human_scores: Any,
    level: str,
    mapping: str = "quantile",
    categories: Sequence[float] | None = None,
) -> np.ndarray:
    """Apply ``mapping`` ("quantile", "linear" or "none") for ``level``.

    "none" returns the metric unchanged, and for ordinal/nominal levels
    requires its values to already lie on ``categories`` (ValueError
    otherwise). See :func:`metric_human_alpha` for the rationale.
    """
    _check_level(level)
    if mapping not in MAPPINGS:
        raise ValueError(f"mapping must be one of {MAPPINGS}, got {mapping!r}")
    m, h = _as_metric_human(metric_scores, human_scores)
    if mapping == "quantile":
        return quantile_bin(m, h, categories)
    cats = _categories(h, categories)
    if mapping == "linear":
        return linear_map(m, cats, round_to_scale=level in ("ordinal", "nominal"))
    if level in ("ordinal", "nominal"):
        off = np.setdiff1d(np.unique(m[~np.isnan(m)]), cats)
        if off.size:
            raise ValueError(
                f"mapping='none' with level={level!r} needs metric values on the scale {cats.tolist()}; "
                f"got e.g. {off[:3].tolist()} (use mapping='quantile')"
            )
    return m.copy()


def _on_scale(level: str, mapping: str) -> bool:
    """Whether ``map_to_scale(level, mapping)`` yields values on the categories."""
    return mapping == "quantile" or level in ("ordinal", "nominal")


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


def metric_human_alpha(
    metric_scores: Any,
    human_scores: Any,
    level: str = "interval",
    *,
    mapping: str = "quantile",
    categories: Sequence[float] | None = None,
    human_agg: str = "per_rater",
) -> Estimate:
    """Krippendorff's alpha between a metric and human ratings.

    The metric is treated as one more coder next to the human rating(s), as
    DreamBench++ does for its GPT judge ("G-H" alpha,
    ``dreambench_plus/krippendorff_analysis.py``: ``krippendorff.alpha`` on
    the two-row matrix [human group, GPT], interval level, then averaged over
    the human groups).

    Args:
        metric_scores: float array_like, shape ``(units,)``: the metric (e.g. MaSC CP, cosine-like, roughly [-1, 1]); NaN = missing.
        human_scores: float array_like, shape ``(units,)`` or ``(raters, units)``: human ratings on an ordinal scale (DreamBench++: 0-4); NaN = missing.
        level: ``"interval"``, ``"ordinal"``, ``"nominal"`` or ``"ratio"`` (Krippendorff's levels of measurement).
        mapping: ``"quantile"``, ``"linear"`` or ``"none"``: how the metric is put on the rating scale before alpha is computed.
            Alpha compares *values*, so a cosine in [0.5, 0.9] against ratings in
            0-4 would register mostly scale mismatch. The paper does not spell out
            its conversion in any source we could obtain, so the default here is
            ``"quantile"`` (:func:`quantile_bin`): rank-binning into the human
            scale's categories at the quantiles of the human marginal
            distribution. This is monotone, so it keeps everything rank-based, and
            it makes the metric's marginal equal to the humans', so alpha then
            measures *which* units get high/low ratings rather than calibration.
            It applies to every level (for interval/ratio the categories' numeric
            values are used). ``"linear"`` min-max rescales onto the scale's range
            (and rounds to the nearest category for ordinal/nominal). ``"none"``
            uses the values as given (for a judge already on the scale, e.g. GPT
            0-4; ordinal/nominal then require on-scale values).
        categories: The rating scale; default the distinct observed human ratings.
        human_agg: ``"per_rater"`` or ``"joint"``: with several human raters (rows): ``"per_rater"`` (default,
            DreamBench++'s convention) averages alpha([rater_i, metric]) over the
            raters whose alpha is defined; ``"joint"`` computes one alpha on
            [rater_1, ..., rater_r, metric]. Identical for a single rater.

    Returns:
        Estimate: ``n`` = units with a metric score and at least one human rating.
            Undefined (NaN + reason) when alpha is undefined for every rater.

    Raises:
        ValueError: Bad level/mapping/human_agg, shape mismatch, ratings off the scale.
    """
    _check_level(level)
    _check_agg(human_agg)
    m, h = _as_metric_human(metric_scores, human_scores)
    used = ~np.isnan(m) & (~np.isnan(h)).any(axis=0)
    n = int(used.sum())
    if n < 2:
        return Estimate.undefined(n, f"{n} unit(s) with both a metric score and a human rating; need >= 2")
    cats = _categories(h[:, used], categories)
    mapped = map_to_scale(m[used], h[:, used], level, mapping, cats)
    hu = h[:, used]
    domain = cats if _on_scale(level, mapping) else None
    if human_agg == "joint" or hu.shape[0] == 1:
        est = krippendorff_alpha(np.vstack([hu, mapped]), level, value_domain=domain)
        return Estimate(est.value, n, est.reason)
    return _mean_over_raters([krippendorff_alpha(np.vstack([r, mapped]), level, value_domain=domain) for r in hu], n)


class _CountsAlpha:
    """Alpha of unit-resampled data from per-unit coincidence contributions.

    For data on a small value domain, the coincidence matrix is a sum over
    units, o = sum_u o_u with o_u = (c_u c_u^T - diag(c_u)) / (m_u - 1)
    (c_u: value counts of unit u; Krippendorff 2011, sec. B). A bootstrap
    resample that draws unit u w_u times has o = sum_u w_u o_u, and alpha =
    1 - sum(o * d) / sum(e * d) with e = (n_v n_v^T - diag(n_v)) / (n - 1),
    exactly as ``krippendorff.alpha`` computes it. This avoids re-running the
    package (which is ~100x slower) for each of the B resamples;
    ``tests/test_agreement.py`` checks it equals the package.
    """

    def __init__(self, data: np.ndarray, level: str, domain: np.ndarray) -> None:
        self.level = level
        self.dom = np.asarray(domain, dtype=np.float64)
        v = self.dom.size
        n_units = data.shape[1]
        counts = np.zeros((n_units, v))
        mask = ~np.isnan(data)
        for row, row_mask in zip(data, mask):
            pos = np.searchsorted(self.dom, row[row_mask])
            np.add.at(counts, (np.flatnonzero(row_mask), pos), 1.0)
        m_u = counts.sum(axis=1)
        scale = np.where(m_u >= 2, 1.0 / np.maximum(m_u - 1, 1), 0.0)
        outer = counts[:, :, np.newaxis] * counts[:, np.newaxis, :]
        outer[:, np.arange(v), np.arange(v)] -= counts
        self.o_units = (outer * scale[:, np.newaxis, np.newaxis]).reshape(n_units, v * v)
        if level == "interval":
            self.d_fixed = (self.dom[:, np.newaxis] - self.dom[np.newaxis, :]) ** 2
        elif level == "nominal":
            self.d_fixed = 1.0 - np.eye(v)
        elif level == "ratio":
            self.d_fixed = _ratio_delta(self.dom[:, np.newaxis], self.dom[np.newaxis, :])
        else:
            self.d_fixed = None

    def alpha(self, weights: np.ndarray) -> float:
        v = self.dom.size
        o = (weights @ self.o_units).reshape(v, v)
        n_v = o.sum(axis=0)
        n = n_v.sum()
        if n < 2 or np.count_nonzero(n_v > 1e-12) < 2:
            return float("nan")
        if self.d_fixed is None:  # ordinal: depends on the marginals
            mid = np.cumsum(n_v) - n_v / 2.0
            d = (mid[:, np.newaxis] - mid[np.newaxis, :]) ** 2
        else:
            d = self.d_fixed
        e = (np.outer(n_v, n_v) - np.diag(n_v)) / (n - 1)
        de = float((e * d).sum())
        if de <= 0.0:
            return float("nan")
        return 1.0 - float((o * d).sum()) / de


def _fast_metric_human_alpha(
    mapped: np.ndarray, human: np.ndarray, level: str, domain: np.ndarray, human_agg: str
) -> Callable[[np.ndarray], float]:
    """``idx -> metric_human_alpha(mapped[idx], human[:, idx], level, mapping="none")``."""
    n = mapped.size
    if human_agg == "joint" or human.shape[0] == 1:
        parts = [_CountsAlpha(np.vstack([human, mapped]), level, domain)]
    else:
        parts = [_CountsAlpha(np.vstack([human[i], mapped]), level, domain) for i in range(human.shape[0])]

    def run(idx: np.ndarray) -> float:
        w = np.bincount(idx, minlength=n).astype(np.float64)
        vals = [a for a in (p.alpha(w) for p in parts) if not math.isnan(a)]
        return float(np.mean(vals)) if vals else float("nan")

    return run


# --------------------------------------------------------------------------
# Spearman
# --------------------------------------------------------------------------


def spearman(x: Any, y: Any) -> Estimate:
    """Spearman's rank correlation, ties as average ranks.

    Args:
        x, y: float array_likes, shape ``(n,)``: paired observations; a pair with NaN in either is dropped
            (pairwise-complete).

    Returns:
        Estimate: ``value`` in [-1, 1]: the Pearson correlation of the average ranks
            (``scipy.stats.spearmanr``; Spearman 1904, tie correction as in
            Kendall & Gibbons, *Rank Correlation Methods*). ``n`` = complete pairs.
            Undefined (NaN + reason) with fewer than 2 complete pairs or when
            either side is constant (zero rank variance) -- never 0.

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
            return Estimate.undefined(n, f"{name} is constant (all {n} values equal {v[0]:g}); rank correlation is undefined")
    stats = _require("scipy.stats")
    res = stats.spearmanr(a, b)
    return Estimate(float(res.statistic), n)


class _WeightedSpearman:
    """Spearman's rho of unit-resampled data from unit weights.

    In a resample where unit u appears w_u times, the average rank of value
    v is (count of items < v) + (count of items == v + 1) / 2, computable
    from weighted counts per distinct value; rho is then the w-weighted
    Pearson correlation of those ranks over the units -- identical to
    ``scipy.stats.spearmanr`` on the materialised resample.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        ok = ~(np.isnan(x) | np.isnan(y))
        self.ok = ok
        _, self.ix = np.unique(x[ok], return_inverse=True)
        _, self.iy = np.unique(y[ok], return_inverse=True)
        self.kx = int(self.ix.max()) + 1 if self.ix.size else 0
        self.ky = int(self.iy.max()) + 1 if self.iy.size else 0

    @staticmethod
    def _ranks(inv: np.ndarray, k: int, w: np.ndarray) -> tuple[np.ndarray, int]:
        c = np.bincount(inv, weights=w, minlength=k)
        r = np.cumsum(c) - (c - 1.0) / 2.0
        return r[inv], int(np.count_nonzero(c))

    def rho(self, weights: np.ndarray) -> float:
        w = weights[self.ok]
        total = w.sum()
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


# --------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------


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
        return CI(point, float("nan"), float("nan"), confidence, n_resamples, 0, "statistic undefined in every resample")
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
    return _percentile_bootstrap(statistic, arrs, n, n_resamples=n_resamples, confidence=confidence, seed=seed, strata=strata)


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

    return _percentile_bootstrap(diff, arrs, n, n_resamples=n_resamples, confidence=confidence, seed=seed, strata=strata)


# --------------------------------------------------------------------------
# AUC (ORIDa: within-subject vs cross-subject pairs)
# --------------------------------------------------------------------------


def _as_labels(is_within: Any) -> np.ndarray:
    lab = np.asarray(is_within)
    if lab.dtype == bool:
        return lab
    if lab.dtype.kind in "iuf":
        vals = set(np.unique(lab.astype(np.float64)).tolist())
        if not vals <= {0.0, 1.0}:
            raise ValueError(f"is_within must be boolean or 0/1, got values {sorted(vals)[:5]}")
        return lab.astype(np.float64) == 1.0
    raise ValueError(f"is_within must be boolean or 0/1, got dtype {lab.dtype}")


def auc_from_counts(c_pos: np.ndarray, c_neg: np.ndarray) -> float:
    """ROC AUC from per-distinct-score counts of the two classes (scores ascending): P(within >
    cross) + P(tie) / 2, the Mann-Whitney form of ``sklearn.metrics.roc_auc_score``.

    Args:
        c_pos: ``[K]`` counts of within-subject pairs per distinct score, in ascending score order.
        c_neg: ``[K]`` counts of cross-subject pairs, same order.

    Returns:
        AUC in ``[0, 1]`` (NaN-free: both classes must be present).
    """
    c_pos, c_neg = np.asarray(c_pos, np.float64), np.asarray(c_neg, np.float64)
    below = np.cumsum(c_neg) - c_neg
    return float(np.dot(c_pos, below + 0.5 * c_neg)) / (float(c_pos.sum()) * float(c_neg.sum()))


def roc_auc(scores: Any, is_within: Any) -> Estimate:
    """ROC AUC of ``scores`` for telling within-subject from cross-subject pairs.

    Args:
        scores: float array_like, shape ``(n,)``: higher = more similar; NaN pairs are dropped.
        is_within: bool (or 0/1) array_like, shape ``(n,)``: True for a within-subject (same identity) pair.

    Returns:
        Estimate: ``value`` in [0, 1] = P(score_within > score_cross) + 0.5 *
            P(tie) (Mann-Whitney form; ``sklearn.metrics.roc_auc_score``). 1 =
            perfect separation, 0.5 = chance, 0 = reversed. Undefined when only
            one class is present after dropping NaN scores.

    Raises:
        ValueError: Shape mismatch or non-binary labels.
    """
    s = np.asarray(scores, dtype=np.float64)
    lab = _as_labels(is_within)
    if s.ndim != 1 or lab.shape != s.shape:
        raise ValueError(f"scores and is_within must be 1-D of equal length, got {s.shape} and {lab.shape}")
    ok = ~np.isnan(s)
    s, lab = s[ok], lab[ok]
    n = int(s.size)
    n_pos = int(lab.sum())
    if n_pos == 0 or n_pos == n:
        which = "within-subject" if n_pos else "cross-subject"
        return Estimate.undefined(n, f"only {which} pairs ({n}); AUC needs both classes")
    metrics = _require("sklearn.metrics")
    return Estimate(float(metrics.roc_auc_score(lab, s)), n)


def within_vs_cross_auc(
    scores: Any,
    is_within: Any,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> CI:
    """AUC of within- vs cross-subject pairs with a stratified bootstrap CI.

    The paper's ORIDa protocol (MaSC reports AUC = 0.992). See
    :func:`roc_auc` for inputs and the estimate; the interval resamples pairs
    within each class (stratified on ``is_within``), so every resample has
    both classes. One-class input gives an undefined estimate and NaN bounds.
    """
    s = np.asarray(scores, dtype=np.float64)
    lab = _as_labels(is_within)
    if s.ndim != 1 or lab.shape != s.shape:
        raise ValueError(f"scores and is_within must be 1-D of equal length, got {s.shape} and {lab.shape}")
    ok = ~np.isnan(s)
    s, lab = s[ok], lab[ok]
    arrs, n = _unit_arrays((s, lab))
    # Each resample's AUC from counts per distinct score (O(n), no re-ranking: 100k pairs x
    # 1,000 resamples take seconds); equal to roc_auc's sklearn value (tests/test_agreement.py).
    _, inv = np.unique(s, return_inverse=True)
    k = int(inv.max()) + 1 if inv.size else 0

    def fast(idx: np.ndarray) -> float:
        ll = lab[idx]
        if ll.all() or not ll.any():
            return float("nan")
        return auc_from_counts(np.bincount(inv[idx][ll], minlength=k), np.bincount(inv[idx][~ll], minlength=k))

    return _percentile_bootstrap(
        roc_auc, arrs, n, n_resamples=n_resamples, confidence=confidence, seed=seed, strata=lab, resampled=fast
    )


# --------------------------------------------------------------------------
# Per-method and pooled rows (the paper's tables) from joined units
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    """Score rows joined with human ratings on the key.

    Attributes:
        keys (list of tuple of str): Join key per unit, in score-file order.
        methods (list of str or None): Method label per unit (None when there is no method column).
        metric (ndarray float64, shape (units,)):
        human (ndarray float64, shape (raters, units), NaN = missing rating):
        rating_columns (tuple of str): One rater per column, in row order of ``human``.
        counts (dict): ``score_rows``, ``not_ok`` (status != ok), ``missing_score``,
            ``rating_rows``, ``unrated`` (usable score, no rating),
            ``unscored`` (rating row with no usable score), ``units``.
    """

    keys: list[tuple[str, ...]]
    methods: list[str | None]
    metric: np.ndarray
    human: np.ndarray
    rating_columns: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)


#: The label of the row over every unit (all methods / groups together), in the ``method`` or
#: ``group`` column of masc-eval's rows and of masc-report's per-method table; also the ``scope``
#: of that row. One label in every output.
POOLED = "pooled"


def groups_in_order(labels: Iterable[Any] | None, n: int, scope: str = "method") -> list[tuple[str, str, np.ndarray]]:
    """The rows of a per-group table: one group per distinct label, in order of first
    appearance, then the pooled group over every unit.

    Args:
        labels: one label per unit (``None``, NaN or blank text: unlabelled), or None (no grouping
            column: the pooled group only). Labels are compared as stripped text.
        n: the number of units (``len(labels)`` when labels are given).
        scope: the ``scope`` of the per-label groups (``"method"`` or ``"group"``).

    Returns:
        ``[(scope, name, indices)]``: ``indices`` an int64 array of the group's units, ascending.
        Unlabelled units belong to the pooled group only. The last entry is always
        ``("pooled", POOLED, arange(n))``.

    Raises:
        ValueError: ``labels`` does not have ``n`` entries.
    """
    order: dict[str, list[int]] = {}
    if labels is not None:
        names = [_label(x) for x in labels]
        if len(names) != n:
            raise ValueError(f"{len(names)} labels for {n} units")
        for i, name in enumerate(names):
            if name:
                order.setdefault(name, []).append(i)
    out = [(scope, name, np.asarray(idx, dtype=np.int64)) for name, idx in order.items()]
    return out + [("pooled", POOLED, np.arange(n))]


def _label(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return str(x).strip()


def _ci_cols(prefix: str, ci: CI) -> dict[str, Any]:
    return {prefix: ci.value, f"{prefix}_low": ci.low, f"{prefix}_high": ci.high}


def agreement_rows(
    joined: Joined,
    *,
    levels: Sequence[str] = ("interval", "ordinal"),
    mapping: str = "quantile",
    categories: Sequence[float] | None = None,
    human_agg: str = "per_rater",
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> list[dict[str, Any]]:
    """Per-method and pooled agreement rows, the layout of the paper's tables.

    The metric is put on the rating scale **once**, on all joined units
    (``map_to_scale`` per level, fitted on the pooled data: one calibration
    for every method), and the mapped values are then held fixed in the
    per-method subsets and in every bootstrap resample. Spearman uses the raw
    metric (mapping-free). Each CI is a percentile bootstrap over the units
    of that row (:func:`bootstrap_ci`'s index stream, same ``seed`` for every
    row). The resampled statistics are computed from unit weights
    (``_CountsAlpha``, ``_WeightedSpearman``) rather than by re-running the
    package on each resample -- the same numbers, ~50x faster (DreamBench++
    size, 7 x 1350 units, 2 raters, B = 1000: ~10 s); the tests check the
    intervals equal the plain :func:`bootstrap_ci` ones.

    Raises:
        ValueError: Unknown level / human_agg / mapping, ratings off ``categories``.

    Returns:
        list of dict: One row per method then one pooled row (:func:`groups_in_order`:
            methods in order of first appearance; ``scope`` and ``method`` of the last row
            are ``"pooled"``, :data:`POOLED`). Keys: ``scope``,
            ``method``, ``n``, for each level ``alpha_<level>``,
            ``alpha_<level>_low``, ``alpha_<level>_high``, then ``spearman``,
            ``spearman_low``, ``spearman_high``, and ``note`` (reasons for
            undefined values / dropped resamples, "" if none). Undefined values
            are NaN.
    """
    for lv in levels:
        _check_level(lv)
    _check_agg(human_agg)
    m, h = joined.metric, joined.human
    cats = _categories(h, categories) if m.size else np.asarray(categories or [], dtype=np.float64)
    mapped = {lv: (map_to_scale(m, h, lv, mapping, cats) if m.size else m) for lv in levels}

    def alpha_stat(level: str) -> Callable[..., Estimate]:
        dom = cats if _on_scale(level, mapping) else None

        def stat(mm: np.ndarray, hh: np.ndarray) -> Estimate:
            return metric_human_alpha(mm, hh, level, mapping="none", categories=dom, human_agg=human_agg)

        return stat

    def rho_stat(mm: np.ndarray, hh: np.ndarray) -> Estimate:
        return metric_human_spearman(mm, hh, human_agg=human_agg)

    kw = dict(n_resamples=n_resamples, confidence=confidence, seed=seed)
    rows = []
    for scope, name, idx in groups_in_order(joined.methods, m.size, "method"):
        row: dict[str, Any] = {"scope": scope, "method": name, "n": int(idx.size)}
        notes = []
        for lv in levels:
            mm, hh = mapped[lv][idx], h[:, idx]
            arrs, n_units = _unit_arrays((mm, hh))
            fast = None
            if _on_scale(lv, mapping) and cats.size <= _PACKAGE_MAX_DOMAIN:
                used = ~np.isnan(mm) & (~np.isnan(hh)).any(axis=0)
                if used.all():
                    fast = _fast_metric_human_alpha(mm, hh, lv, cats, human_agg)
            ci = _percentile_bootstrap(alpha_stat(lv), arrs, n_units, strata=None, resampled=fast, **kw)
            row.update(_ci_cols(f"alpha_{lv}", ci))
            for t in (ci.reason, ci.note if ci.estimate.defined else None):
                if t:
                    notes.append(f"alpha_{lv}: {t}")
        arrs, n_units = _unit_arrays((m[idx], h[:, idx]))
        fast_rho = _fast_metric_human_spearman(m[idx], h[:, idx], human_agg)
        ci = _percentile_bootstrap(rho_stat, arrs, n_units, strata=None, resampled=fast_rho, **kw)
        row.update(_ci_cols("spearman", ci))
        for t in (ci.reason, ci.note if ci.estimate.defined else None):
            if t:
                notes.append(f"spearman: {t}")
        row["note"] = "; ".join(notes)
        rows.append(row)
    return rows


def auc_rows(
    scores: Sequence[float] | np.ndarray,
    is_within: Sequence[bool] | np.ndarray,
    groups: Iterable[str | None] | None = None,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> list[dict[str, Any]]:
    """Per-group and pooled within-vs-cross AUC rows.

    ``scores`` float (n,), NaN = no score (left out); ``is_within`` bool (n,);
    ``groups`` optional labels (n,), grouped by :func:`groups_in_order` (order of first
    appearance, unlabelled units in the pooled row only, last row :data:`POOLED`).
    Rows: ``scope``, ``group``, ``n``, ``n_within``, ``n_cross``, ``auc``, ``auc_low``,
    ``auc_high``, ``note``; each AUC is :func:`within_vs_cross_auc` on the row's units.
    """
    s = np.asarray(scores, dtype=np.float64)
    lab = _as_labels(is_within)
    rows = []
    for scope, name, idx in groups_in_order(groups, s.size, "group"):
        ss, ll = s[idx], lab[idx]
        ok = ~np.isnan(ss)
        ci = within_vs_cross_auc(ss, ll, n_resamples=n_resamples, confidence=confidence, seed=seed)
        note = "; ".join(t for t in (ci.reason, ci.note if ci.estimate.defined else None) if t)
        rows.append(
            {
                "scope": scope,
                "group": name,
                "n": int(ok.sum()),
                "n_within": int((ll & ok).sum()),
                "n_cross": int((~ll & ok).sum()),
                "auc": ci.value,
                "auc_low": ci.low,
                "auc_high": ci.high,
                "note": note,
            }
        )
    return rows
