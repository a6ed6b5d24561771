"""Krippendorff's alpha, and putting a continuous metric on the human rating scale.

:func:`krippendorff_alpha` (the ``krippendorff`` package on small value domains, the exact
pairable-values formulas above them), :func:`quantile_bin` / :func:`linear_map` /
:func:`map_to_scale` (the metric on the rating scale), :func:`metric_human_alpha` (the metric as
one more coder), and ``_CountsAlpha``: alpha of a bootstrap resample from unit weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..ranked import average_ranks
from .estimate import (
    MAPPINGS,
    Estimate,
    _as_metric_human,
    _as_reliability,
    _categories,
    _check_agg,
    _check_level,
    _mean_over_raters,
    _require,
)

# Above this many distinct values the krippendorff package would build a
# (units x V x V) array (see krippendorff._coincidences); we switch to the
# exact pairable-values formulas in _alpha_direct instead.
_PACKAGE_MAX_DOMAIN = 64


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


def krippendorff_alpha(
    ratings: Any, level: str = "interval", *, value_domain: Sequence[float] | np.ndarray | None = None
) -> Estimate:
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
        domain = (
            np.unique(np.concatenate([uniq, np.asarray(value_domain, dtype=np.float64)]))
            if value_domain is not None
            else uniq
        )
        # Units with fewer than two values carry no weight; dropping them keeps
        # the package's arrays small and does not change alpha.
        value = float(kd.alpha(reliability_data=data[:, pairable], value_domain=domain, level_of_measurement=level))
    else:
        value = _alpha_direct(data, level)
    if math.isnan(value):
        return Estimate.undefined(n_pairable, "expected disagreement is 0")
    return Estimate(value, n_pairable)


def quantile_bin(
    metric_scores: Any, human_scores: Any, categories: Sequence[float] | np.ndarray | None = None
) -> np.ndarray:
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
    twice_rank = np.rint(2 * average_ranks(m[valid])).astype(np.int64)
    lhs = (twice_rank - 1) * total  # 2n * u_i * T
    rhs = 2 * cum * n  # 2n * F_k * T
    idx = np.searchsorted(rhs, lhs, side="left")
    out[valid] = cats[np.minimum(idx, cats.size - 1)]
    return out


def linear_map(
    metric_scores: Any, categories: Sequence[float] | np.ndarray, *, round_to_scale: bool = False
) -> np.ndarray:
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
    categories: Sequence[float] | np.ndarray | None = None,
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


def metric_human_alpha(
    metric_scores: Any,
    human_scores: Any,
    level: str = "interval",
    *,
    mapping: str = "quantile",
    categories: Sequence[float] | np.ndarray | None = None,
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
            self.d_fixed: np.ndarray | None = (self.dom[:, np.newaxis] - self.dom[np.newaxis, :]) ** 2
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
