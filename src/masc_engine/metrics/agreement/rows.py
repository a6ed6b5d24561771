"""Per-method and pooled rows (the paper's tables) from joined units."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .alpha import _PACKAGE_MAX_DOMAIN, _fast_metric_human_alpha, _on_scale, map_to_scale, metric_human_alpha
from .auc import _as_labels, within_vs_cross_auc
from .bootstrap import _percentile_bootstrap, _unit_arrays
from .correlation import _fast_metric_human_spearman, metric_human_spearman
from .estimate import CI, Estimate, _categories, _check_agg, _check_level


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
            ci = _percentile_bootstrap(
                alpha_stat(lv),
                arrs,
                n_units,
                strata=None,
                resampled=fast,
                n_resamples=n_resamples,
                confidence=confidence,
                seed=seed,
            )
            row.update(_ci_cols(f"alpha_{lv}", ci))
            for t in (ci.reason, ci.note if ci.estimate.defined else None):
                if t:
                    notes.append(f"alpha_{lv}: {t}")
        arrs, n_units = _unit_arrays((m[idx], h[:, idx]))
        fast_rho = _fast_metric_human_spearman(m[idx], h[:, idx], human_agg)
        ci = _percentile_bootstrap(
            rho_stat,
            arrs,
            n_units,
            strata=None,
            resampled=fast_rho,
            n_resamples=n_resamples,
            confidence=confidence,
            seed=seed,
        )
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
