"""The reduced-precision certification rule (metrics/certification.py): each gate set's thresholds
pinned to the numbers tolerances.py documents, each gate refusing a delta of either sign, the
non-finite rules, and one report schema that reads the reports written before it."""

from __future__ import annotations

import numpy as np
import pytest

from masc_engine import tolerances as tol
from masc_engine.metrics import certification as cert


def _pairs(n: int = 400, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"cp": rng.uniform(0.2, 0.9, n), "pf": rng.uniform(0.1, 0.8, n)}


def _shift(ref: dict, cp: float = 0.0, pf: float = 0.0, at: int = 7) -> dict:
    """``ref`` with one pair's CP / PF moved (ranks barely change)."""
    out = {k: v.copy() for k, v in ref.items()}
    out["cp"][at] += cp
    out["pf"][at] += pf
    return out


def test_gate_sets_are_the_documented_thresholds():
    """The numbers tolerances.py documents (bf16-cpu / FP8: |d| <= 2e-3 on CP and PF, Spearman >=
    0.999, non-finite pairs gated; int8: |dCP| <= 1e-2, Spearman >= 0.995, non-finite pairs
    dropped, |dPF| not gated): a changed threshold fails here."""
    assert cert.FIDELITY_GATES == cert.GateSet(2e-3, 2e-3, 0.999, "gate")
    assert cert.INT8_GATES == cert.GateSet(1e-2, None, 0.995, "drop")
    from masc_engine.export import cpu_precision
    from masc_engine.jobs import int8_gate

    assert cpu_precision.FIDELITY_GATES is cert.FIDELITY_GATES and int8_gate.INT8_GATES is cert.INT8_GATES


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize(
    ("gates", "score"), [(cert.FIDELITY_GATES, "cp"), (cert.FIDELITY_GATES, "pf"), (cert.INT8_GATES, "cp")]
)
def test_delta_gate_holds_inside_and_refuses_past_either_sign(gates, score, sign):
    ref = _pairs()
    bound = gates.max_abs_dcp if score == "cp" else gates.max_abs_dpf
    inside = cert.certify(ref, _shift(ref, **{score: sign * bound * 0.9}), gates)
    past = cert.certify(ref, _shift(ref, **{score: sign * bound * 1.1}), gates)
    g = f"max_abs_d{score}"
    assert inside["pass"] and inside["gates"][g]["pass"]
    assert not past["pass"] and not past["gates"][g]["pass"] and past["margins"][g] < 0
    assert past[g] == pytest.approx(bound * 1.1, rel=tol.FLOAT64_SAME_FORMULA_TOL)
    assert past["margins"][g] == pytest.approx(-bound * 0.1, rel=tol.FLOAT64_SAME_FORMULA_TOL)


def test_int8_reports_pf_deltas_without_gating_them():
    ref = _pairs()
    r = cert.certify(ref, _shift(ref, pf=0.05), cert.INT8_GATES)
    assert r["pass"] and "max_abs_dpf" not in r["gates"] and "max_abs_dpf" not in r["margins"]
    assert r["max_abs_dpf"] == pytest.approx(0.05, rel=tol.FLOAT64_SAME_FORMULA_TOL)


@pytest.mark.parametrize("gates", [cert.FIDELITY_GATES, cert.INT8_GATES])
@pytest.mark.parametrize("score", ["cp", "pf"])
def test_spearman_gate_refuses_reordered_scores(gates, score):
    ref = _pairs()
    test = {k: v.copy() for k, v in ref.items()}
    rng = np.random.default_rng(1)
    swap = rng.choice(ref[score].size, 60, replace=False)
    test[score][swap] = test[score][rng.permutation(swap)]  # ranks broken, |d| large too
    r = cert.certify(ref, test, gates)
    g = f"spearman_{score}"
    assert not r["pass"] and not r["gates"][g]["pass"]
    assert r["margins"][g] == pytest.approx(r[g] - gates.min_spearman, abs=tol.FLOAT64_SAME_FORMULA_TOL)
    assert r["margins"][g] < 0
    same = cert.certify(ref, ref, gates)
    assert (
        same["pass"]
        and same[g] == 1.0
        and same["margins"][g] == pytest.approx(1 - gates.min_spearman, abs=tol.FLOAT64_SAME_FORMULA_TOL)
    )


def test_a_constant_candidate_fails_the_spearman_gate():
    ref = _pairs()
    flat = {"cp": np.full(ref["cp"].size, 0.5), "pf": ref["pf"]}
    for gates in (cert.FIDELITY_GATES, cert.INT8_GATES):
        r = cert.certify(ref, flat, gates)
        assert not r["pass"] and np.isnan(r["spearman_cp"]) and not r["gates"]["spearman_cp"]["pass"]


def test_non_finite_rules():
    ref = _pairs(50)
    test = {k: v.copy() for k, v in ref.items()}
    test["pf"][3] = np.nan  # finite in fp32, NaN in the candidate
    bf16 = cert.certify(ref, test, cert.FIDELITY_GATES)
    assert not bf16["pass"] and bf16["gates"]["finite_as_fp32"]["value"] == 1 and bf16["pairs"] == 50
    assert bf16["gates"]["max_abs_dpf"]["pass"] and bf16["gates"]["spearman_pf"]["pass"]
    int8 = cert.certify(ref, test, cert.INT8_GATES)
    assert int8["pass"] and int8["pairs"] == 49 and "finite_as_fp32" not in int8["gates"]
    both = {k: v.copy() for k, v in ref.items()}
    both["cp"][5] = np.nan
    both_ref = {k: v.copy() for k, v in ref.items()}
    both_ref["cp"][5] = np.nan  # undefined on both sides: not a mismatch
    assert cert.certify(both_ref, both, cert.FIDELITY_GATES)["pass"]
    inf = {k: v.copy() for k, v in ref.items()}
    inf["cp"][2] = np.inf
    assert not cert.certify(ref, inf, cert.FIDELITY_GATES)["gates"]["finite_as_fp32"]["pass"]


def test_min_pairs_gate():
    ref = _pairs(20)
    assert not cert.certify(ref, ref, cert.FIDELITY_GATES, min_pairs=21)["gates"]["min_pairs"]["pass"]
    assert cert.certify(ref, ref, cert.FIDELITY_GATES, min_pairs=20)["pass"]


def test_one_schema_holds_both_old_schemas():
    """The keys bf16-cpu certificates and int8 gate reports wrote before: a superset, except int8's
    ``gates`` (thresholds then), which gate_thresholds reads in either form."""
    ref = _pairs()
    r = cert.certify(ref, _shift(ref, cp=1e-3), cert.INT8_GATES)
    old_bf16 = {"pass", "pairs", "gates", "mean_abs_dcp", "mean_abs_dpf"}
    old_int8 = {
        "margins",
        "pairs",
        "max_abs_dcp",
        "mean_abs_dcp",
        "max_abs_dpf",
        "mean_abs_dpf",
        "spearman_cp",
        "spearman_pf",
        "gates",
        "passed",
    }
    assert old_bf16 | old_int8 <= set(r) and r["passed"] == r["pass"]
    assert set(r["margins"]) == {"max_abs_dcp", "spearman_cp", "spearman_pf"}  # int8's margins, as before
    assert cert.gate_thresholds(r) == {
        "max_abs_dcp": cert.INT8_GATES.max_abs_dcp,
        "spearman_cp": cert.INT8_GATES.min_spearman,
        "spearman_pf": cert.INT8_GATES.min_spearman,
        "min_pairs": 0,
    }
    written_before = {
        "passed": False,
        "gates": {"max_abs_dcp": tol.INT8_MAX_ABS_DCP, "min_spearman": tol.INT8_MIN_SPEARMAN},
    }
    assert cert.gate_thresholds(written_before) == {
        "max_abs_dcp": tol.INT8_MAX_ABS_DCP,
        "spearman_cp": tol.INT8_MIN_SPEARMAN,
        "spearman_pf": tol.INT8_MIN_SPEARMAN,
    }
    assert cert.passed(written_before) is False and cert.passed(r) is True


def test_gate_load():
    ref = _pairs()
    assert cert.gate_load(cert.certify(ref, ref, cert.FIDELITY_GATES)) == 0.0
    half = cert.certify(ref, _shift(ref, pf=-cert.FIDELITY_GATES.max_abs_dpf / 2), cert.FIDELITY_GATES)
    assert half["pass"] and cert.gate_load(half) == pytest.approx(0.5, abs=tol.FLOAT64_SAME_FORMULA_TOL)
    nan = {"cp": ref["cp"].copy(), "pf": ref["pf"]}
    nan["cp"][0] = np.nan
    assert cert.gate_load(cert.certify(ref, nan, cert.FIDELITY_GATES)) == float("inf")


def test_shape_mismatch_is_one_line():
    ref = _pairs(10)
    with pytest.raises(ValueError, match="reference scores vs"):
        cert.certify(ref, {"cp": ref["cp"][:5], "pf": ref["pf"]}, cert.FIDELITY_GATES)
    with pytest.raises(ValueError, match="nonfinite"):
        cert.certify(ref, ref, cert.GateSet(1.0, None, 0.5, "ignore"))


@pytest.mark.parametrize("score", ["cp", "pf"])
def test_a_delta_exactly_at_the_bound_passes(score):
    """The gate is |d| <= bound: a delta of exactly 2e-3 (0 against 2e-3: exact in float64) passes,
    the next float64 above it fails."""
    ref = {"cp": np.linspace(0.0, 0.5, 40), "pf": np.linspace(0.0, 0.4, 40)}
    bound = cert.FIDELITY_GATES.max_abs_dcp if score == "cp" else cert.FIDELITY_GATES.max_abs_dpf
    at = {k: v.copy() for k, v in ref.items()}
    at[score][0] = bound  # ref[score][0] is 0.0: |d| is bound exactly, ranks unchanged
    r = cert.certify(ref, at, cert.FIDELITY_GATES)
    assert r[f"max_abs_d{score}"] == bound and r["gates"][f"max_abs_d{score}"]["pass"] and r["pass"]
    at[score][0] = np.nextafter(bound, 1.0)
    assert not cert.certify(ref, at, cert.FIDELITY_GATES)["gates"][f"max_abs_d{score}"]["pass"]


def test_a_spearman_exactly_at_the_bound_passes():
    """The gate is rho >= bound: a GateSet whose bound is the candidate's exact rho passes; one a
    float64 step higher fails."""
    ref = _pairs(50)
    test = {k: v.copy() for k, v in ref.items()}
    order = np.argsort(test["cp"])
    test["cp"][order[[10, 11]]] = test["cp"][order[[11, 10]]]  # two neighbours swapped
    rho = cert.certify(ref, test, cert.FIDELITY_GATES)["spearman_cp"]
    assert rho < 1.0
    exact = cert.GateSet(1.0, 1.0, rho, "gate")
    assert cert.certify(ref, test, exact)["gates"]["spearman_cp"]["pass"]
    above = cert.GateSet(1.0, 1.0, float(np.nextafter(rho, 2.0)), "gate")
    assert not cert.certify(ref, test, above)["gates"]["spearman_cp"]["pass"]


def test_an_infinite_score_on_both_sides_fails_finite_as_fp32():
    """An infinite candidate score is a failure even where fp32 is infinite too (the rule's
    docstring): infinity is not a score, unlike NaN, which is an undefined one."""
    ref = _pairs(30)
    for k in ("cp", "pf"):
        ref_inf = {kk: v.copy() for kk, v in ref.items()}
        ref_inf[k][4] = np.inf
        r = cert.certify(ref_inf, ref_inf, cert.FIDELITY_GATES)
        assert not r["pass"] and r["gates"]["finite_as_fp32"]["value"] == 1, k


def test_gate_load_of_exact_gates_met_exactly_is_zero():
    """A zero-tolerance gate (|d| bound 0, Spearman bound 1) met exactly loads 0, not infinity: the
    unit searches sort by it."""
    ref = _pairs()
    r = cert.certify(ref, ref, cert.GateSet(0.0, 0.0, 1.0, "gate"))
    assert r["pass"] and cert.gate_load(r) == 0.0
    off = cert.certify(ref, _shift(ref, cp=1e-9), cert.GateSet(0.0, 0.0, 1.0, "gate"))
    assert cert.gate_load(off) == float("inf")
