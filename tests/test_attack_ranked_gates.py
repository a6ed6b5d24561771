"""Spearman's rho under weights and the certification gates, pinned at their edges: a total
weight below 2, a side constant under fractional weights, a |d| exactly at its bound, an
infinite candidate score, the min_pairs count, gate_load's infinities, int8 reports."""

from __future__ import annotations

import math

import numpy as np
import pytest

from masc_engine.metrics.certification import GateSet, certify, gate_load, passed
from masc_engine.metrics.ranked import RankedPairs, spearman_rho


def test_total_weight_below_two_is_nan():
    assert math.isnan(spearman_rho([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], weights=[0.5, 0.5, 0.5]))
    assert spearman_rho([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], weights=[1.0, 0.5, 0.5]) == pytest.approx(1.0)


def test_a_constant_side_is_nan_under_any_weights():
    # Fractional weights: the constant side's centred ranks are not exactly 0 in float64.
    x = [0.0, 0.0, 0.0, 2.0, 2.0, 2.0]
    w = [
        1.8461553344437616,
        1.1510326627856502,
        2.991629807367633,
        2.9425060163286902,
        2.056625953442084,
        1.951377828803449,
    ]
    assert math.isnan(RankedPairs(x, [1.0] * 6).rho(np.asarray(w)))
    assert math.isnan(RankedPairs([1.0] * 6, x).rho(np.asarray(w)))


def _gates(**kw):
    return GateSet(**{"max_abs_dcp": 0.25, "max_abs_dpf": 0.25, "min_spearman": 0.5, **kw})


REF = {"cp": [0.5, 0.4, 0.3, 0.2], "pf": [0.1, 0.2, 0.3, 0.4]}


def test_a_delta_exactly_at_its_bound_passes():
    test = {"cp": [0.25, 0.4, 0.3, 0.2], "pf": [0.1, 0.2, 0.3, 0.4]}
    rep = certify(REF, test, _gates(max_abs_dcp=0.25))
    assert rep["max_abs_dcp"] == 0.25 and rep["gates"]["max_abs_dcp"]["pass"] is True
    assert rep["gates"]["max_abs_dcp"]["margin"] == 0.0


def test_an_infinite_candidate_score_fails_finite_as_fp32_even_where_fp32_is_infinite():
    ref = {"cp": [0.5, 0.4, 0.3, math.inf], "pf": [0.1, 0.2, 0.3, 0.4]}
    test = {"cp": [0.5, 0.4, 0.3, math.inf], "pf": [0.1, 0.2, 0.3, 0.4]}
    rep = certify(ref, test, _gates())
    assert rep["gates"]["finite_as_fp32"]["value"] == 1 and rep["pass"] is False
    assert gate_load(rep) == math.inf


def test_min_pairs_is_a_least_count():
    assert certify(REF, REF, _gates(), min_pairs=4)["gates"]["min_pairs"]["pass"] is True
    rep = certify(REF, REF, _gates(), min_pairs=5)
    assert rep["gates"]["min_pairs"] == {"value": 4, "threshold": 5, "margin": -1.0, "pass": False}
    assert rep["pass"] is False


def test_max_is_the_worst_pair_not_the_mean():
    test = {"cp": [0.5, 0.4, 0.3, 0.0], "pf": [0.1, 0.2, 0.3, 0.4]}
    rep = certify(REF, test, _gates())
    assert rep["max_abs_dcp"] == pytest.approx(0.2) and rep["mean_abs_dcp"] == pytest.approx(0.05)


def test_gate_load_is_infinite_for_a_nan_spearman_and_the_worst_ratio_else():
    const = {"cp": [0.5, 0.5, 0.5, 0.5], "pf": [0.1, 0.2, 0.3, 0.4]}
    rep = certify(const, const, _gates())
    assert math.isnan(rep["spearman_cp"]) and rep["gates"]["spearman_cp"]["pass"] is False
    assert gate_load(rep) == math.inf
    test = {"cp": [0.45, 0.4, 0.3, 0.2], "pf": [0.1, 0.2, 0.3, 0.4]}
    assert gate_load(certify(REF, test, _gates())) == pytest.approx(0.05 / 0.25)


def test_passed_reads_pass_before_passed():
    assert passed({"pass": True, "passed": False}) is True
    assert passed({"pass": False, "passed": True}) is False
    assert passed({"passed": True}) is True


def test_gate_load_of_a_passing_report_under_an_exact_gate_is_at_most_one():
    """An exact gate set (min_spearman 1, |dCP| bound 0; inside GateSet's documented ranges): a
    report that meets it has load 0, not a division by zero."""
    rep = certify(REF, REF, GateSet(max_abs_dcp=0.0, max_abs_dpf=None, min_spearman=1.0))
    assert rep["pass"] is True
    assert gate_load(rep) == 0.0
