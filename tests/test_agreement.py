"""Meta-evaluation layer: known values for alpha, Spearman, bootstrap, AUC, the table and the CLI."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

krippendorff = pytest.importorskip("krippendorff")
stats = pytest.importorskip("scipy.stats")
pytest.importorskip("sklearn.metrics")

from click.testing import CliRunner  # noqa: E402

from masc_engine.cli.eval_cmd import main  # noqa: E402
from masc_engine.jobs import evaluation as ev  # noqa: E402
from masc_engine.jobs.tables import Table  # noqa: E402
from masc_engine.metrics import agreement as ag  # noqa: E402
from masc_engine.metrics.agreement import alpha as ag_alpha  # noqa: E402
from masc_engine.tolerances import FLOAT64_SAME_FORMULA_TOL  # noqa: E402

NAN = float("nan")

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", example C:
# 4 observers x 12 units, values 1-5, missing entries.
KRIPP_2011 = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
]


# ---------------------------------------------------------------- alpha


@pytest.mark.parametrize(
    ("level", "expected"), [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849), ("ratio", 0.797)]
)
def test_krippendorff_canonical_example(level, expected):
    est = ag.krippendorff_alpha(KRIPP_2011, level)
    assert round(est.value, 3) == expected
    assert est.n == 40  # Krippendorff's n: 40 pairable values
    assert est.reason is None


@pytest.mark.parametrize("level", ag.LEVELS)
def test_canonical_example_direct_formula_matches_package(level):
    data = np.asarray(KRIPP_2011, dtype=float)
    want = krippendorff.alpha(data, level_of_measurement=level)
    assert ag_alpha._alpha_direct(data, level) == pytest.approx(want, abs=FLOAT64_SAME_FORMULA_TOL)


@pytest.mark.parametrize("level", ag.LEVELS)
def test_large_domain_path_equals_package(level):
    # > 64 distinct values: krippendorff_alpha takes the direct path; the package is the oracle.
    rng = np.random.default_rng(7)
    truth = rng.uniform(1, 10, size=50)
    data = np.round(truth + rng.normal(0, 1.0, size=(3, 50)), 2)
    data[rng.random(data.shape) < 0.15] = np.nan
    assert np.unique(data[~np.isnan(data)]).size > ag_alpha._PACKAGE_MAX_DOMAIN
    got = ag.krippendorff_alpha(data, level)
    want = krippendorff.alpha(data, level_of_measurement=level)
    assert got.value == pytest.approx(want, abs=FLOAT64_SAME_FORMULA_TOL)
    if level != "nominal":  # continuous values almost never coincide, so nominal alpha is near 0
        assert 0.5 < got.value < 1.0


def test_alpha_hand_computed_interval():
    # units (0,0) (1,1) (2,2) (3,4): W = 2, B = 2*8*13.875 = 222, alpha = 1 - 7*2/222 = 104/111
    est = ag.krippendorff_alpha([[0, 1, 2, 3], [0, 1, 2, 4]], "interval")
    assert est.value == pytest.approx(104 / 111, abs=FLOAT64_SAME_FORMULA_TOL)


def test_alpha_undefined_cases():
    same = ag.krippendorff_alpha([[2, 2, 2], [2, 2, NAN]], "interval")
    assert math.isnan(same.value) and not same.defined
    assert "expected disagreement is 0" in same.reason
    single = ag.krippendorff_alpha([1, 2, 3], "nominal")
    assert math.isnan(single.value) and "pairable" in single.reason
    with pytest.raises(ValueError, match="level"):
        ag.krippendorff_alpha(KRIPP_2011, "likert")
    with pytest.raises(ValueError, match="value_domain"):
        ag.krippendorff_alpha([[0, 1], [1, 7]], "ordinal", value_domain=[0, 1, 2, 3, 4])


# ---------------------------------------------------------------- metric on the rating scale


def test_quantile_bin_matches_human_marginal():
    # human marginal 2/5, 1/5, 2/5: ranks 1-2 -> 0, rank 3 -> 1, ranks 4-5 -> 2
    human = [0, 0, 1, 2, 2]
    metric = [0.40, 0.12, 0.31, 0.95, 0.50]  # ranks 3, 1, 2, 5, 4
    assert ag.quantile_bin(metric, human).tolist() == [1.0, 0.0, 0.0, 2.0, 2.0]
    # unit 1 has no metric score, so its rating is left out of the marginal: F = 1/3 at 0..3, 1 at 4.
    # ranks 1, 3, 2 -> u = 1/6, 5/6, 1/2 -> categories 0, 4, 4; categories 1-3 (no ratings) stay empty
    out = ag.quantile_bin([0.1, NAN, 0.3, 0.2], [4, 0, 0, 4], categories=range(5))
    assert math.isnan(out[1])
    assert out[[0, 2, 3]].tolist() == [0.0, 4.0, 4.0]


def test_quantile_bin_ties_share_a_category():
    # three tied scores get average rank 2 -> u = 1.5/4 = 0.375 > F_0 = 0.25 -> all in category 1
    out = ag.quantile_bin([0.5, 0.5, 0.5, 0.9], [0, 1, 1, 1])
    assert out.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_metric_human_alpha_perfect_rank_agreement_is_one():
    human = [0, 0, 1, 2, 2, 3, 4]
    metric = [0.10, 0.11, 0.35, 0.50, 0.52, 0.70, 0.99]
    for level in ("interval", "ordinal", "nominal"):
        est = ag.metric_human_alpha(metric, human, level)
        assert est.value == pytest.approx(1.0, abs=FLOAT64_SAME_FORMULA_TOL)
        assert est.n == 7


def test_metric_human_alpha_mapping_none_and_errors():
    est = ag.metric_human_alpha([0, 1, 2, 4], [0, 1, 2, 3], "interval", mapping="none")
    assert est.value == pytest.approx(104 / 111, abs=FLOAT64_SAME_FORMULA_TOL)
    with pytest.raises(ValueError, match="quantile"):
        ag.metric_human_alpha([0.1, 0.2, 0.3], [0, 1, 2], "ordinal", mapping="none")
    with pytest.raises(ValueError, match="units"):
        ag.metric_human_alpha([0.1, 0.2], [0, 1, 2])
    few = ag.metric_human_alpha([0.1, NAN], [1, 2])
    assert math.isnan(few.value) and "need >= 2" in few.reason


def test_metric_human_alpha_per_rater_is_mean_of_single_raters():
    rng = np.random.default_rng(3)
    q = rng.normal(size=60)
    metric = q + rng.normal(0, 0.5, 60)
    h = np.clip(np.round(2 + q + rng.normal(0, 0.7, (2, 60))), 0, 4)
    h[1, :5] = np.nan
    per = ag.metric_human_alpha(metric, h, "interval", categories=range(5))
    # the quantile fit uses the pooled marginal of both raters, so map once and compare with mapping="none"
    mapped = ag.quantile_bin(metric, h, categories=range(5))
    singles = [ag.krippendorff_alpha([h[i], mapped], "interval").value for i in range(2)]
    assert per.value == pytest.approx(np.mean(singles), abs=FLOAT64_SAME_FORMULA_TOL)
    joint = ag.metric_human_alpha(metric, h, "interval", categories=range(5), human_agg="joint")
    assert joint.value == pytest.approx(
        ag.krippendorff_alpha(np.vstack([h, mapped]), "interval").value, abs=FLOAT64_SAME_FORMULA_TOL
    )


# ---------------------------------------------------------------- Spearman


def test_spearman_ties_equal_average_rank_pearson():
    # average ranks x -> [1, 2.5, 2.5, 4], y -> [1, 3, 2, 4]; Pearson = 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    est = ag.spearman([1, 2, 2, 3], [1, 3, 2, 4])
    assert est.value == pytest.approx(math.sqrt(0.9), abs=FLOAT64_SAME_FORMULA_TOL)
    assert est.n == 4
    # not the no-ties shortcut 1 - 6 sum d^2 / (n (n^2 - 1)) = 0.95
    assert est.value != pytest.approx(0.95, abs=FLOAT64_SAME_FORMULA_TOL)


def test_spearman_constant_is_undefined_not_zero():
    est = ag.spearman([0.5, 0.5, 0.5, 0.5], [1, 2, 3, 4])
    assert math.isnan(est.value)
    assert not est.defined
    assert "x is constant" in est.reason
    est_y = ag.spearman([1, 2, 3], [2, 2, 2])
    assert math.isnan(est_y.value) and "y is constant" in est_y.reason


def test_spearman_drops_incomplete_pairs():
    est = ag.spearman([1, 2, 2, NAN, 3], [1, 3, 2, 9, 4])
    assert est.value == pytest.approx(math.sqrt(0.9), abs=FLOAT64_SAME_FORMULA_TOL)
    assert est.n == 4
    assert "need >= 2" in ag.spearman([1, NAN], [1, 2]).reason
    with pytest.raises(ValueError, match="length"):
        ag.spearman([1, 2, 3], [1, 2])


# ---------------------------------------------------------------- bootstrap


def _correlated(n=80, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return x, x + rng.normal(0, 0.8, n)


def test_bootstrap_ci_contains_estimate_and_is_deterministic():
    x, y = _correlated()
    stat = lambda a, b: ag.spearman(a, b)  # noqa: E731
    ci = ag.bootstrap_ci(stat, x, y, n_resamples=500, seed=11)
    assert ci.value == pytest.approx(stats.spearmanr(x, y).statistic, abs=FLOAT64_SAME_FORMULA_TOL)
    assert ci.low < ci.value < ci.high
    assert 0.3 < ci.low and ci.high < 0.95
    assert (ci.n_resamples, ci.n_valid, ci.confidence) == (500, 500, 0.95)
    again = ag.bootstrap_ci(stat, x, y, n_resamples=500, seed=11)
    assert (again.low, again.high) == (ci.low, ci.high)
    other = ag.bootstrap_ci(stat, x, y, n_resamples=500, seed=12)
    assert (other.low, other.high) != (ci.low, ci.high)
    narrower = ag.bootstrap_ci(stat, x, y, n_resamples=500, seed=11, confidence=0.5)
    assert ci.low < narrower.low < narrower.high < ci.high


def test_bootstrap_ci_percentiles_of_resampled_means():
    # statistic = mean; check against a hand-rolled loop with the same generator stream
    x = np.arange(10.0)
    ci = ag.bootstrap_ci(np.mean, x, n_resamples=200, seed=5)
    rng = np.random.default_rng(5)
    means = [x[rng.integers(0, 10, size=10)].mean() for _ in range(200)]
    lo, hi = np.quantile(means, [0.025, 0.975])
    assert (ci.low, ci.high) == (
        pytest.approx(lo, abs=FLOAT64_SAME_FORMULA_TOL),
        pytest.approx(hi, abs=FLOAT64_SAME_FORMULA_TOL),
    )
    assert ci.value == 4.5


def test_bootstrap_undefined_resamples_are_counted():
    x = np.array([0.0, 0.0, 0.0, 1.0])
    y = np.array([1.0, 2.0, 3.0, 4.0])
    ci = ag.bootstrap_ci(ag.spearman, x, y, n_resamples=200, seed=0)
    assert ci.n_valid < 200
    assert f"{200 - ci.n_valid} of 200 resamples undefined" in ci.note
    const = ag.bootstrap_ci(ag.spearman, np.ones(5), np.arange(5.0), n_resamples=50)
    assert math.isnan(const.value) and math.isnan(const.low) and math.isnan(const.high)
    assert "constant" in const.reason


def test_bootstrap_units_on_last_axis_and_errors():
    h = np.array([[0, 1, 2, 3, 4], [0, 1, 2, 4, 3]], dtype=float)
    m = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    ci = ag.bootstrap_ci(lambda mm, hh: ag.metric_human_alpha(mm, hh, mapping="none"), m, h, n_resamples=100)
    assert ci.value == pytest.approx(ag.metric_human_alpha(m, h, mapping="none").value)
    with pytest.raises(ValueError, match="unit"):
        ag.bootstrap_ci(np.mean, np.zeros(4), np.zeros(5))
    with pytest.raises(ValueError, match="confidence"):
        ag.bootstrap_ci(np.mean, np.zeros(4), confidence=1.5)


def test_bootstrap_diff_ci_paired():
    rng = np.random.default_rng(1)
    human = rng.normal(size=120)
    good = human + rng.normal(0, 0.3, 120)
    bad = human + rng.normal(0, 3.0, 120)
    ci = ag.bootstrap_diff_ci(ag.spearman, good, bad, human, n_resamples=400, seed=2)
    want = stats.spearmanr(good, human).statistic - stats.spearmanr(bad, human).statistic
    assert ci.value == pytest.approx(want, abs=FLOAT64_SAME_FORMULA_TOL)
    assert 0 < ci.low < ci.value < ci.high
    same = ag.bootstrap_diff_ci(ag.spearman, good, good, human, n_resamples=100)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)


# ---------------------------------------------------------------- AUC


def test_auc_known_values():
    within = [True, True, False, False]
    assert ag.roc_auc([0.9, 0.8, 0.2, 0.1], within).value == 1.0
    assert ag.roc_auc([0.1, 0.2, 0.8, 0.9], within).value == 0.0
    # pairs (w, c): (0.9, 0.5)=1, (0.9, 0.1)=1, (0.5, 0.5)=0.5 (tie), (0.5, 0.1)=1 -> 3.5 / 4
    assert ag.roc_auc([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0]).value == 0.875
    all_tied = ag.roc_auc([0.3, 0.3, 0.3], [1, 0, 0])
    assert all_tied.value == 0.5


def test_the_bootstrap_auc_counts_ties_as_sklearn_does():
    """The rank-sum form the bootstrap resamples with (``auc_from_counts``: a tie counts one half)
    equals sklearn's roc_auc_score on scores with many ties, and so does every resample's."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(5)
    lab = np.r_[np.ones(40, bool), np.zeros(60, bool)]
    s = np.round(np.where(lab, 0.6, 0.4) + rng.normal(0, 0.3, 100), 1)
    uniq, inv = np.unique(s, return_inverse=True)
    assert uniq.size < 30  # ties between and within the classes
    c_pos, c_neg = np.bincount(inv[lab], minlength=uniq.size), np.bincount(inv[~lab], minlength=uniq.size)
    assert ag.auc_from_counts(c_pos, c_neg) == pytest.approx(roc_auc_score(lab, s), abs=FLOAT64_SAME_FORMULA_TOL)
    ci = ag.within_vs_cross_auc(s, lab, n_resamples=200, seed=3)
    ref = ag.bootstrap_ci(ag.roc_auc, s, lab, n_resamples=200, seed=3, strata=lab)
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high), abs=FLOAT64_SAME_FORMULA_TOL)


def test_auc_one_class_is_undefined():
    est = ag.roc_auc([0.1, 0.2, 0.3], [True, True, True])
    assert math.isnan(est.value) and "only within-subject" in est.reason
    ci = ag.within_vs_cross_auc([0.1, 0.2], [0, 0])
    assert math.isnan(ci.value) and math.isnan(ci.low) and "only cross-subject" in ci.reason
    with pytest.raises(ValueError, match="0/1"):
        ag.roc_auc([0.1, 0.2], [0, 2])


def test_within_vs_cross_auc_ci():
    perfect = ag.within_vs_cross_auc([0.9, 0.8, 0.7, 0.2, 0.1], [1, 1, 1, 0, 0], n_resamples=200)
    assert (perfect.value, perfect.low, perfect.high, perfect.n_valid) == (1.0, 1.0, 1.0, 200)
    rng = np.random.default_rng(4)
    lab = np.r_[np.ones(50, bool), np.zeros(50, bool)]
    s = np.where(lab, 1.0, 0.0) + rng.normal(0, 1.0, 100)
    ci = ag.within_vs_cross_auc(s, lab, n_resamples=300, seed=9)
    assert ci.value == pytest.approx(ag.roc_auc(s, lab).value)
    assert ci.low < ci.value < ci.high
    assert ci.n_valid == 300  # stratified: every resample has both classes
    assert ag.within_vs_cross_auc(s, lab, n_resamples=300, seed=9) == ci
    # the rank-sum fast path equals sklearn's roc_auc_score on every resample
    ref = ag.bootstrap_ci(ag.roc_auc, s, lab, n_resamples=300, seed=9, strata=lab)
    assert ci.low == pytest.approx(ref.low, abs=FLOAT64_SAME_FORMULA_TOL) and ci.high == pytest.approx(
        ref.high, abs=FLOAT64_SAME_FORMULA_TOL
    )


# ---------------------------------------------------------------- table builder

# Method A ranks perfectly; method B swaps its top two. Pooled human marginal: two of each 0..4,
# so the pooled quantile mapping sends A -> [0,1,2,3,4] and B -> [0,1,2,4,3].
SCORE_ROWS = [
    {"key": "a1", "method": "A", "cp": "0.10", "status": "ok"},
    {"key": "a2", "method": "A", "cp": "0.20", "status": "ok"},
    {"key": "a3", "method": "A", "cp": "0.30", "status": "ok"},
    {"key": "a4", "method": "A", "cp": "0.40", "status": "ok"},
    {"key": "a5", "method": "A", "cp": "0.50", "status": "ok"},
    {"key": "b1", "method": "B", "cp": "0.15", "status": "ok"},
    {"key": "b2", "method": "B", "cp": "0.25", "status": "ok"},
    {"key": "b3", "method": "B", "cp": "0.35", "status": "ok"},
    {"key": "b4", "method": "B", "cp": "0.55", "status": "ok"},
    {"key": "b5", "method": "B", "cp": "0.45", "status": "ok"},
    {"key": "b6", "method": "B", "cp": "", "status": "mask_missing"},
    {"key": "b7", "method": "B", "cp": "0.99", "status": "ok"},  # no rating row
]
RATING_ROWS = [
    {"key": k, "human_cp": v}
    for k, v in zip(["a1", "a2", "a3", "a4", "a5", "b1", "b2", "b3", "b4", "b5"], "0123401234")
]
RATING_ROWS.append({"key": "zz", "human_cp": "2"})  # rated, never scored
RATING_ROWS.append({"key": "b6", "human_cp": "1"})  # rated, score not ok

# Hand values. alpha = 1 - (n-1) W / B with W = sum over units of ordered within-unit pairs' delta / (m_u - 1)
# and B = sum over all ordered pairs of pairable values = 2 n sum (x - mean)^2 (interval).
#   B:      units (0,0) (1,1) (2,2) (3,4) (4,3): n = 10, W = 4, B = 2*10*20 = 400  -> 1 - 9*4/400
#   pooled: A adds five agreeing units:          n = 20, W = 4, B = 2*20*40 = 1600 -> 1 - 19*4/1600
# Ordinal equals interval here: every category has equal counts, so the mid-ranks are affine in the value.
# Spearman B: metric ranks 1,2,3,5,4 vs 1..5 -> 1 - 6*2/(5*24).
# Spearman pooled: metric ranks A 1,3,5,7,9 / B 2,4,6,10,8; human mid-ranks 1.5,3.5,...,9.5 twice:
#   sum dx dy = 40 + 36 = 76, sum dx^2 = 82.5, sum dy^2 = 80.
ALPHA_B = 1 - 36 / 400
ALPHA_POOLED = 1 - 76 / 1600
RHO_B = 1 - 6 * 2 / (5 * 24)
RHO_POOLED = 76 / math.sqrt(82.5 * 80)


def test_join_counts():
    j = ev.join_scores_ratings(SCORE_ROWS, RATING_ROWS, ev.AgreementOptions(rating_columns=["human_cp"]))
    assert j.counts == {
        "score_rows": 12,
        "not_ok": 1,
        "missing_score": 0,
        "rating_rows": 12,
        "unrated": 1,
        "unscored": 2,
        "units": 10,
    }
    assert j.methods == ["A"] * 5 + ["B"] * 5
    assert j.human.shape == (1, 10)
    assert j.metric.tolist() == [0.10, 0.20, 0.30, 0.40, 0.50, 0.15, 0.25, 0.35, 0.55, 0.45]


def test_agreement_table_values():
    opts = ev.AgreementOptions(rating_columns=["human_cp"], scale=range(5), n_resamples=300, seed=0)
    rows = ev.agreement_table(SCORE_ROWS, RATING_ROWS, opts).rows
    assert [(r["scope"], r["method"], r["n"]) for r in rows] == [
        ("method", "A", 5),
        ("method", "B", 5),
        ("pooled", "pooled", 10),
    ]
    a, b, pooled = rows
    assert a["alpha_interval"] == pytest.approx(1.0, abs=FLOAT64_SAME_FORMULA_TOL)
    assert a["alpha_ordinal"] == pytest.approx(1.0, abs=FLOAT64_SAME_FORMULA_TOL)
    assert a["spearman"] == pytest.approx(1.0, abs=FLOAT64_SAME_FORMULA_TOL)
    assert b["alpha_interval"] == pytest.approx(ALPHA_B, abs=FLOAT64_SAME_FORMULA_TOL)
    assert b["alpha_ordinal"] == pytest.approx(ALPHA_B, abs=FLOAT64_SAME_FORMULA_TOL)
    assert b["spearman"] == pytest.approx(RHO_B, abs=FLOAT64_SAME_FORMULA_TOL)
    assert pooled["alpha_interval"] == pytest.approx(ALPHA_POOLED, abs=FLOAT64_SAME_FORMULA_TOL)
    assert pooled["alpha_ordinal"] == pytest.approx(ALPHA_POOLED, abs=FLOAT64_SAME_FORMULA_TOL)
    assert pooled["spearman"] == pytest.approx(RHO_POOLED, abs=FLOAT64_SAME_FORMULA_TOL)
    for r in rows:
        for p in ("alpha_interval", "alpha_ordinal", "spearman"):
            assert (
                r[f"{p}_low"] <= r[p] + FLOAT64_SAME_FORMULA_TOL and r[p] <= r[f"{p}_high"] + FLOAT64_SAME_FORMULA_TOL
            )
    assert pooled["alpha_interval_low"] < pooled["alpha_interval_high"] <= 1.0
    assert a["note"] == "" and pooled["note"] == ""


def test_agreement_rows_fast_paths_equal_generic_bootstrap():
    rng = np.random.default_rng(8)
    n = 60
    q = rng.normal(size=n)
    scores = [
        {"key": f"k{i}", "method": "AB"[i % 2], "cp": float(0.5 + 0.1 * q[i] + 0.05 * rng.normal()), "status": "ok"}
        for i in range(n)
    ]
    h = np.clip(np.round(2 + q + rng.normal(0, 0.8, (2, n))), 0, 4)
    h[1, ::7] = np.nan
    ratings = [{"key": f"k{i}", "g1": h[0, i], "g2": h[1, i]} for i in range(n)]
    for agg in ag.HUMAN_AGGS:
        j = ev.join_scores_ratings(scores, ratings, ev.AgreementOptions(rating_columns=["g1", "g2"]))
        rows = ag.agreement_rows(j, levels=ag.LEVELS, categories=range(5), human_agg=agg, n_resamples=60, seed=3)
        cats = np.arange(5.0)
        for r in rows:
            idx = np.arange(n) if r["scope"] == "pooled" else np.flatnonzero(np.array(j.methods) == r["method"])
            for lv in ag.LEVELS:
                mapped = ag.quantile_bin(j.metric, j.human, cats)[idx]
                ref = ag.bootstrap_ci(
                    lambda mm, hh, lv=lv: ag.metric_human_alpha(
                        mm, hh, lv, mapping="none", categories=cats, human_agg=agg
                    ),
                    mapped,
                    j.human[:, idx],
                    n_resamples=60,
                    seed=3,
                )
                got = (r[f"alpha_{lv}"], r[f"alpha_{lv}_low"], r[f"alpha_{lv}_high"])
                assert got == pytest.approx((ref.value, ref.low, ref.high), abs=FLOAT64_SAME_FORMULA_TOL)
            ref = ag.bootstrap_ci(
                lambda mm, hh: ag.metric_human_spearman(mm, hh, human_agg=agg),
                j.metric[idx],
                j.human[:, idx],
                n_resamples=60,
                seed=3,
            )
            got = (r["spearman"], r["spearman_low"], r["spearman_high"])
            assert got == pytest.approx((ref.value, ref.low, ref.high), abs=FLOAT64_SAME_FORMULA_TOL)


def test_join_errors_name_row_and_reason():
    human = ev.AgreementOptions(rating_columns=["human_cp"])
    dup = RATING_ROWS + [{"key": "a1", "human_cp": "3"}]
    with pytest.raises(ev.DataError, match=r"ratings, row 13: duplicate key 'a1' \(first at row 1\)"):
        ev.join_scores_ratings(SCORE_ROWS, dup, human)
    bad = [dict(r) for r in RATING_ROWS]
    bad[2]["human_cp"] = "three"
    table = Table(Path("human.csv"), ["key", "human_cp"], bad, list(range(2, 2 + len(bad))))
    with pytest.raises(
        ev.DataError, match=r"human\.csv, line 4 \(key 'a3'\): rating column 'human_cp' value 'three' is not a number"
    ):
        ev.join_scores_ratings(SCORE_ROWS, table, human)
    off = [dict(r) for r in RATING_ROWS]
    off[0]["human_cp"] = "7"
    with pytest.raises(ev.DataError, match="not on the scale"):
        ev.join_scores_ratings(SCORE_ROWS, off, ev.AgreementOptions(rating_columns=["human_cp"], scale=range(5)))
    empty_ok = [dict(r) for r in SCORE_ROWS]
    empty_ok[0]["cp"] = ""
    with pytest.raises(
        ev.DataError, match=r"scores, row 1 \(key 'a1'\): status is 'ok' but score column 'cp' is empty"
    ):
        ev.join_scores_ratings(empty_ok, RATING_ROWS, human)
    with pytest.raises(ev.DataError, match="no key column 'id'"):
        ev.join_scores_ratings(SCORE_ROWS, RATING_ROWS, ev.AgreementOptions(key="id", rating_columns=["human_cp"]))
    no_status = [{k: v for k, v in r.items() if k != "status"} for r in empty_ok]  # no status: a missing score
    j = ev.join_scores_ratings(no_status, RATING_ROWS, human)
    assert (j.counts["missing_score"], j.counts["units"]) == (2, 9)  # a1 and b6 (no score), b7 unrated
    with pytest.raises(ev.DataError, match="no units to evaluate"):
        ev.agreement_table([], RATING_ROWS, human)


def test_ok_status_collection():
    rows = [dict(r) for r in SCORE_ROWS]
    rows[10] = {"key": "b6", "method": "B", "cp": "0.05", "status": "no_background"}
    strict = ev.join_scores_ratings(rows, RATING_ROWS, ev.AgreementOptions(rating_columns=["human_cp"]))
    assert (strict.counts["not_ok"], strict.counts["units"]) == (1, 10)
    loose = ev.join_scores_ratings(
        rows, RATING_ROWS, ev.AgreementOptions(rating_columns=["human_cp"], ok_statuses=("ok", "no_background"))
    )
    assert (loose.counts["not_ok"], loose.counts["units"]) == (0, 11)
    assert loose.keys[-1] == ("b6",) and loose.metric[-1] == 0.05


def test_own_status_column_is_used():
    """masc-run's cp_status / pf_status: a PF defined on a row whose CP failed still counts."""
    rows = [dict(r, cp_status=r["status"], pf="0.5", pf_status="ok") for r in SCORE_ROWS]
    rows[0].update(cp="", cp_status="empty_reference_mask", status="empty_reference_mask")
    ratings = [dict(r, pf=r["human_cp"]) for r in RATING_ROWS]
    cp = ev.join_scores_ratings(rows, ratings, ev.AgreementOptions(rating_columns=["human_cp"]))
    pf = ev.join_scores_ratings(rows, ratings, ev.AgreementOptions(score_column="pf"))
    assert (cp.counts["not_ok"], cp.counts["units"]) == (2, 9)
    assert (pf.counts["not_ok"], pf.counts["units"]) == (0, 11) and pf.keys[0] == ("a1",)  # b7: unrated


def test_composite_key():
    scores = [{"method": m, "key": "x", "cp": v} for m, v in (("A", 0.1), ("B", 0.9))]
    ratings = [{"method": m, "key": "x", "cp": v} for m, v in (("A", 0), ("B", 4))]
    j = ev.join_scores_ratings(scores, ratings, ev.AgreementOptions(key="method,key"))
    assert j.keys == [("A", "x"), ("B", "x")]
    with pytest.raises(ev.DataError, match="duplicate key 'x'"):
        ev.join_scores_ratings(scores, ratings, ev.AgreementOptions(key="key"))


def test_groups_in_order_is_the_one_grouping():
    labels = ["b", None, "a", " b ", "", float("nan"), "a", "c"]
    got = ag.groups_in_order(labels, len(labels), "group")
    assert [(s, n, i.tolist()) for s, n, i in got] == [
        ("group", "b", [0, 3]),
        ("group", "a", [2, 6]),
        ("group", "c", [7]),
        ("pooled", ag.POOLED, list(range(8))),
    ]
    assert [(s, n) for s, n, _ in ag.groups_in_order(None, 3)] == [("pooled", "pooled")]
    assert ev.POOLED == ag.POOLED == "pooled"
    with pytest.raises(ValueError, match="3 labels for 4 units"):
        ag.groups_in_order(["a", "b", "c"], 4)


# ---------------------------------------------------------------- CLI


def _write_csv(path, rows):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


@pytest.fixture
def files(tmp_path):
    scores = tmp_path / "scores.csv"
    ratings = tmp_path / "human.csv"
    _write_csv(scores, [dict(r, prompt="a photo", ref_image="r.png", out_image="o.png") for r in SCORE_ROWS])
    _write_csv(ratings, RATING_ROWS)
    return tmp_path, scores, ratings


@pytest.mark.parametrize("prefix", [[], ["agreement"]])
def test_cli_agreement(files, prefix):
    tmp, scores, ratings = files
    out = tmp / "table.json"
    args = [
        *prefix,
        str(scores),
        "--ratings",
        str(ratings),
        "--rating-column",
        "human_cp",
        "--scale",
        "0-4",
        "--n-resamples",
        "200",
        "--out",
        str(out),
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "units: 10 joined; skipped 1 not ok, 0 without score, 1 unrated, 2 rating rows without score" in res.output
    lines = {ln.split()[0]: ln for ln in res.output.splitlines() if ln[:2] in ("A ", "B ", "po")}
    assert lines["A"].split()[1] == "5"
    assert "1.000 [" in lines["A"]
    assert "0.910 [" in lines["B"] and "0.900 [" in lines["B"]
    assert lines["pooled"].split()[1] == "10"
    doc = json.loads(out.read_text())
    assert doc["counts"]["units"] == 10 and doc["scale"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    pooled = doc["rows"][-1]
    assert pooled["method"] == "pooled"
    assert pooled["alpha_interval"] == pytest.approx(ALPHA_POOLED, abs=FLOAT64_SAME_FORMULA_TOL)
    assert pooled["spearman"] == pytest.approx(RHO_POOLED, abs=FLOAT64_SAME_FORMULA_TOL)


def test_cli_writes_csv_and_is_deterministic(files):
    tmp, scores, ratings = files
    outs = []
    for name in ("t1.csv", "t2.csv"):
        res = CliRunner().invoke(
            main,
            [
                str(scores),
                "--ratings",
                str(ratings),
                "--rating-column",
                "human_cp",
                "--n-resamples",
                "100",
                "--out",
                str(tmp / name),
            ],
        )
        assert res.exit_code == 0, res.output
        outs.append((tmp / name).read_text())
    assert outs[0] == outs[1]
    rows = list(csv.DictReader(outs[0].splitlines()))
    assert [r["method"] for r in rows] == ["A", "B", "pooled"]
    assert float(rows[1]["alpha_ordinal"]) == pytest.approx(ALPHA_B, abs=FLOAT64_SAME_FORMULA_TOL)


def test_cli_error_names_file_line_reason(files):
    tmp, scores, _ = files
    bad = tmp / "bad.csv"
    bad.write_text("key,human_cp\na1,3\na2,lots\n")
    res = CliRunner().invoke(main, [str(scores), "--ratings", str(bad), "--rating-column", "human_cp"])
    assert res.exit_code == 1
    assert f"{bad}, line 3 (key 'a2'): rating column 'human_cp' value 'lots' is not a number" in res.output
    res = CliRunner().invoke(main, [str(scores), "--ratings", str(bad)])
    assert res.exit_code == 1 and "no rating column 'cp'" in res.output
    res = CliRunner().invoke(main, [str(scores), "--ratings", str(bad), "--out", str(tmp / "x.txt")])
    assert res.exit_code == 2 and "--out" in res.output


def test_cli_auc(tmp_path):
    path = tmp_path / "orida.jsonl"
    recs = [
        {"key": f"p{i}", "cp": s, "same": w, "status": "ok"}
        for i, (s, w) in enumerate([(0.9, "yes"), (0.5, "yes"), (0.5, "no"), (0.1, "no")])
    ]
    recs.append({"key": "x", "cp": None, "same": "no", "status": "mask_missing"})
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = tmp_path / "auc.json"
    res = CliRunner().invoke(
        main, ["auc", str(path), "--within-column", "same", "--n-resamples", "100", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "skipped 1 rows by status" in res.output
    row = json.loads(out.read_text())["rows"][0]
    assert (row["n"], row["n_within"], row["n_cross"], row["auc"]) == (4, 2, 2, 0.875)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"cp": 0.3, "same": "maybe"}) + "\n")
    res = CliRunner().invoke(main, ["auc", str(bad), "--within-column", "same"])
    assert res.exit_code == 1 and f"{bad}, line 1: column 'same'" in res.output
