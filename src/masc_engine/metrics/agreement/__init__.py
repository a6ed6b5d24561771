"""Meta-evaluation: how well a metric agrees with human ratings.

The MaSC paper (arXiv 2605.22469) validates its CP and PF scores two ways:

* on DreamBench++ human ratings (ordinal 0-4 scale, per generated image), by
  Krippendorff's alpha and Spearman's rho between the metric and the human
  rating, per method and pooled, with bootstrap 95% confidence intervals;
* on ORIDa, by the ROC AUC with which the score separates within-subject
  pairs from cross-subject pairs.

This package is the statistics for both, one module per rule: :mod:`.estimate` (result
types, input conventions), :mod:`.alpha` (Krippendorff's alpha, the metric on the rating
scale), :mod:`.correlation` (Spearman's rho; the rank kernel is
:mod:`masc_engine.metrics.ranked`), :mod:`.bootstrap`, :mod:`.auc` and :mod:`.rows` (the
per-method and pooled rows). Every public name is importable from here.

Everything here is pure: arrays in, small frozen result objects (or rows of plain values) out.
No file I/O, no printing, no reading of table cells: joining score and rating tables is
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

Third-party dependencies (the ``eval`` extra: ``krippendorff``, ``scikit-learn``) are
imported lazily, so that importing this package works on a bare runtime install; calling a function that needs one of them raises an
``ImportError`` that names the extra.
"""

from __future__ import annotations

from .alpha import krippendorff_alpha, linear_map, map_to_scale, metric_human_alpha, quantile_bin
from .auc import auc_from_counts, roc_auc, within_vs_cross_auc
from .bootstrap import bootstrap_ci, bootstrap_diff_ci
from .correlation import metric_human_spearman, spearman
from .estimate import CI, HUMAN_AGGS, LEVELS, MAPPINGS, Estimate
from .rows import POOLED, Joined, agreement_rows, auc_rows, groups_in_order

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
