"""Spearman's rho, the one kernel (metrics/ranked.py): equal to scipy.stats.spearmanr with ties,
weighted = scipy on the materialised resample, and every caller goes through it."""

from __future__ import annotations

import ast

import numpy as np
import pytest

from support import REPO
from masc_engine.metrics import ranked
from masc_engine.tolerances import FLOAT64_SAME_FORMULA_TOL

stats = pytest.importorskip("scipy.stats")


def _tied(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Correlated pairs with many ties on both sides (rounded to a coarse grid)."""
    x = rng.normal(size=n)
    y = x + rng.normal(scale=0.7, size=n)
    return np.round(x, 1), np.round(y * 2) / 2


@pytest.mark.parametrize("seed", range(6))
def test_rho_equals_scipy_on_tied_data(seed):
    rng = np.random.default_rng(seed)
    x, y = _tied(rng, int(rng.integers(5, 400)))
    assert np.unique(x).size < x.size and np.unique(y).size < y.size  # ties on both sides
    want = stats.spearmanr(x, y).statistic
    assert ranked.spearman_rho(x, y) == pytest.approx(want, abs=FLOAT64_SAME_FORMULA_TOL)
    np.testing.assert_array_equal(ranked.average_ranks(x), stats.rankdata(x, method="average"))


@pytest.mark.parametrize("seed", range(6))
def test_weighted_rho_equals_scipy_on_the_materialised_resample(seed):
    rng = np.random.default_rng(100 + seed)
    x, y = _tied(rng, 120)
    idx = rng.integers(0, x.size, size=x.size)  # one bootstrap resample
    w = np.bincount(idx, minlength=x.size).astype(np.float64)
    want = stats.spearmanr(x[idx], y[idx]).statistic
    assert ranked.spearman_rho(x, y, w) == pytest.approx(want, abs=FLOAT64_SAME_FORMULA_TOL)
    pairs = ranked.RankedPairs(x, y)
    assert pairs.rho(w) == pytest.approx(want, abs=FLOAT64_SAME_FORMULA_TOL)
    assert pairs.rho() == pytest.approx(stats.spearmanr(x, y).statistic, abs=FLOAT64_SAME_FORMULA_TOL)


def test_undefined_cases_are_nan_and_missing_values_are_refused():
    assert np.isnan(ranked.spearman_rho([1.0], [2.0]))
    assert np.isnan(ranked.spearman_rho(np.ones(5), np.arange(5.0)))  # constant side
    w = np.array([3.0, 0.0, 0.0, 0.0])  # one distinct value carries all the weight
    assert np.isnan(ranked.spearman_rho(np.arange(4.0), np.arange(4.0), w))
    assert ranked.spearman_rho(np.arange(5.0), -np.arange(5.0)) == -1.0
    with pytest.raises(ValueError, match="NaN"):
        ranked.spearman_rho([1.0, np.nan, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="differ in length"):
        ranked.spearman_rho([1.0, 2.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("seed", range(4))
def test_each_caller_equals_scipy_with_its_own_missing_value_rule(seed):
    """agreement.spearman drops a pair with NaN on either side; bf16-cpu compares each score over
    the pairs finite on both sides; int8 drops a pair with any non-finite score."""
    from masc_engine.export import cpu_precision
    from masc_engine.jobs.int8_gate import gate_report
    from masc_engine.metrics.agreement import spearman

    rng = np.random.default_rng(200 + seed)
    cp, pf = _tied(rng, 300)
    cp8, pf8 = cp + np.round(rng.normal(scale=0.05, size=300), 2), pf + rng.normal(scale=0.02, size=300)
    cp[rng.random(300) < 0.05], pf8[rng.random(300) < 0.05] = np.nan, np.nan
    ok_cp = ~np.isnan(cp) & ~np.isnan(cp8)
    assert spearman(cp, cp8).value == pytest.approx(
        stats.spearmanr(cp[ok_cp], cp8[ok_cp]).statistic, abs=FLOAT64_SAME_FORMULA_TOL
    )
    bf16 = cpu_precision.gate_figures({"cp": cp, "pf": pf}, {"cp": cp8, "pf": pf8})
    ok_pf = ~np.isnan(pf) & ~np.isnan(pf8)
    assert bf16["spearman_cp"] == pytest.approx(
        stats.spearmanr(cp[ok_cp], cp8[ok_cp]).statistic, abs=FLOAT64_SAME_FORMULA_TOL
    )
    assert bf16["spearman_pf"] == pytest.approx(
        stats.spearmanr(pf[ok_pf], pf8[ok_pf]).statistic, abs=FLOAT64_SAME_FORMULA_TOL
    )
    ok = ok_cp & ok_pf
    int8 = gate_report(cp, pf, cp8, pf8)
    assert int8["pairs"] == int(ok.sum())
    assert int8["spearman_cp"] == pytest.approx(
        stats.spearmanr(cp[ok], cp8[ok]).statistic, abs=FLOAT64_SAME_FORMULA_TOL
    )
    assert int8["spearman_pf"] == pytest.approx(
        stats.spearmanr(pf[ok], pf8[ok]).statistic, abs=FLOAT64_SAME_FORMULA_TOL
    )


def test_no_other_spearman_in_the_package():
    """One implementation: no module but metrics/ranked.py calls scipy's spearmanr or rankdata, or
    defines a rank function of its own."""
    own = []
    for path in sorted((REPO / "src" / "masc_engine").rglob("*.py")):
        if path.name == "ranked.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("spearmanr", "rankdata"):
                own.append(f"{path.name}: {node.attr}")
            if isinstance(node, ast.alias) and node.name in ("spearmanr", "rankdata"):
                own.append(f"{path.name}: import {node.name}")
            if isinstance(node, ast.FunctionDef) and node.name in ("_ranks", "rankdata", "spearmanr"):
                own.append(f"{path.name}: def {node.name}")
    assert not own, own
