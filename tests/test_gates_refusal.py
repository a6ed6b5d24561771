"""A refusal says what to do next: the figure, the budget, where the budget comes from and the way
out (``masc-export --accept-validation-error``, recorded in the manifest); a certification report
shows each gate's margin, not only pass or fail."""

from __future__ import annotations

import numpy as np
import pytest

from doubles.exported_graphs import graphs_from
from masc_engine import tolerances as tol
from masc_engine.errors import ExportValidationError
from masc_engine.export import cpu_precision as cpp
from masc_engine.export import segmenter_validate as sv
from masc_engine.export import validate as val


def _cases(error: float, width: int = 64, key: str = "max_abs") -> list[dict]:
    return [
        {"max_abs": error / 3, "max_rel": error / 3, "shape": [2, 37, width]},
        {"max_abs": error, "max_rel": error, "shape": [1, 37, width]},
    ]


def test_a_validation_refusal_names_figure_budget_source_and_way_out():
    budget = tol.EXPORT_VALIDATION_RTOL_BUDGETS["tiny"]["vision"]
    with pytest.raises(ExportValidationError) as e:
        val._check("vision", _cases(budget * 1.37))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("graph 'vision' differs from PyTorch: max relative error ")
    assert (
        f"> budget {budget:g} (tolerances.EXPORT_VALIDATION_RTOL_BUDGETS['tiny']['vision'], measured at the tiny" in msg
    )
    assert (
        f"pass --accept-validation-error {val._round_up(budget * 1.37):g}" in msg and "recorded in the manifest" in msg
    )
    assert e.value.report["max_rel"] == budget * 1.37 and "override" not in e.value.report


def test_the_siglip_gate_is_relative():
    """Activations 10x larger with errors 10x larger (trained-like weights): the same relative
    error, accepted; the absolute error is reported beside it."""
    budget = tol.EXPORT_VALIDATION_RTOL_BUDGETS["tiny"]["text"]
    cases = [{"max_abs": budget * 0.9 * 40.0, "max_rel": budget * 0.9, "shape": [1, 64]}]
    r = val._check("text", cases)
    assert r["max_rel"] == budget * 0.9 and r["max_abs"] == budget * 36 and r["rtol"] == budget
    assert r["atol"] == tol.EXPORT_VALIDATION_BUDGETS["tiny"]["text"]


def test_the_cp_graph_keeps_its_absolute_bound():
    with pytest.raises(ExportValidationError, match=r"max \|error\| .* > budget 1e-06 \(tolerances.CP_HEAD_ATOL\)"):
        val._check("cp", _cases(tol.CP_HEAD_ATOL * 3), atol=tol.CP_HEAD_ATOL, budget_from="tolerances.CP_HEAD_ATOL")


def test_the_suggested_override_covers_the_error():
    for error in (6.02e-6, 1.55e-5, 4.0001e-5, 9.99e-3):
        bound = val._round_up(error)
        assert error <= bound < error * 1.1


def test_the_override_accepts_up_to_its_bound_and_is_recorded():
    budget = tol.EXPORT_VALIDATION_RTOL_BUDGETS["tiny"]["text"]
    err = budget * 2
    with val.accept_validation_error(budget * 3):
        report = val._check("text", _cases(err))
    assert report["override"] == {
        "accept_validation_error": budget * 3,
        "figure": "max relative error",
        "measured": err,
        "budget": budget,
        "budget_from": report["budget_from"],
    }
    assert "EXPORT_VALIDATION_RTOL_BUDGETS['tiny']['text']" in report["budget_from"]
    with val.accept_validation_error(budget * 1.5), pytest.raises(ExportValidationError, match="> budget"):
        val._check("text", _cases(err))  # past the override too: still refused
    with pytest.raises(ExportValidationError):  # the override ends with its block
        val._check("text", _cases(err))
    assert "override" not in val._check("text", _cases(budget / 2))  # within budget: nothing to record


def test_a_non_finite_error_is_refused_whatever_the_override():
    with val.accept_validation_error(1.0), pytest.raises(ExportValidationError) as e:
        val._check("pool", _cases(float("nan")))
    assert "--accept-validation-error" not in str(e.value)
    with pytest.raises(ValueError):
        with val.accept_validation_error(-1.0):
            pass


def test_the_segmenter_refusal_and_override_use_the_relative_figure():
    budget = tol.SEGMENTER_VALIDATION_BUDGETS["clipseg-tiny"]["decoder"]
    with pytest.raises(ExportValidationError) as e:
        sv._check("decoder", _cases(budget * 1.2), 64)
    msg = str(e.value)
    assert "segmenter graph 'decoder' differs from transformers: max relative error" in msg
    assert "tolerances.SEGMENTER_VALIDATION_BUDGETS['clipseg-tiny']['decoder']" in msg
    assert "--accept-validation-error" in msg
    with val.accept_validation_error(budget * 2):
        report = sv._check("decoder", _cases(budget * 1.2), 64)
    assert report["override"]["measured"] == budget * 1.2 and report["override"]["figure"] == "max relative error"


# --------------------------------------------------------------------------- margins


def test_bf16_gates_report_their_margins():
    rng = np.random.default_rng(0)
    ref = {"cp": rng.uniform(0.3, 0.95, 1200), "pf": rng.uniform(0, 0.2, 1200)}
    test = {"cp": ref["cp"] - 5e-4, "pf": ref["pf"] + 3e-3}
    g = cpp.gate_figures(ref, test)["gates"]
    assert g["max_abs_dcp"]["margin"] == pytest.approx(
        tol.FIDELITY_MAX_ABS_DELTA - 5e-4, abs=tol.FLOAT64_SAME_FORMULA_TOL
    )
    assert g["max_abs_dpf"]["margin"] == pytest.approx(
        tol.FIDELITY_MAX_ABS_DELTA - 3e-3, abs=tol.FLOAT64_SAME_FORMULA_TOL
    )
    assert g["max_abs_dpf"]["margin"] < 0 and not g["max_abs_dpf"]["pass"]
    assert g["spearman_cp"]["margin"] == pytest.approx(1 - tol.FIDELITY_MIN_SPEARMAN, abs=tol.FLOAT64_SAME_FORMULA_TOL)
    line = cpp._fmt(cpp.gate_figures(ref, test))
    assert f"[margin {tol.FIDELITY_MAX_ABS_DELTA - 5e-4:+.2e}]" in line and "[margin -1.00e-03]" in line


def test_int8_report_shows_margins_and_the_refusal_names_them():
    from masc_engine.jobs.int8_gate import format_gates, gate_report

    rng = np.random.default_rng(1)
    cp, pf = rng.uniform(0.3, 0.95, 500), rng.uniform(0, 0.2, 500)
    pf8 = pf.copy()
    pf8[:40] = pf8[:40][::-1]  # PF ranks moved: Spearman PF below its gate
    r = gate_report(cp, pf, cp + 4e-3, pf8)
    assert not r["passed"]
    assert r["margins"]["max_abs_dcp"] == pytest.approx(tol.INT8_MAX_ABS_DCP - 4e-3, abs=tol.FLOAT64_SAME_FORMULA_TOL)
    assert (
        r["margins"]["spearman_pf"]
        == pytest.approx(r["spearman_pf"] - tol.INT8_MIN_SPEARMAN, abs=tol.FLOAT64_SAME_FORMULA_TOL)
        and r["margins"]["spearman_pf"] < 0
    )
    line = format_gates(r)
    assert f"margin {r['margins']['spearman_pf']:+.4f}" in line and "tolerances.INT8_MAX_ABS_DCP" in line
    assert (
        f"(gate <= {tol.INT8_MAX_ABS_DCP:g}, margin" in line and f"(gate >= {tol.INT8_MIN_SPEARMAN:g}, margin" in line
    )
    ok = gate_report(cp, pf, cp + 4e-3, pf)
    assert ok["passed"] and ok["margins"]["spearman_pf"] == pytest.approx(
        1 - tol.INT8_MIN_SPEARMAN, abs=tol.FLOAT64_SAME_FORMULA_TOL
    )


# --------------------------------------------------------------------------- masc-export


#: A pool budget no export meets (the check is past it whatever the weights), and an override far
#: above any fp32 export's error.
NO_EXPORT_MEETS, OVERRIDE = 1e-12, 1e-3


def _export_cli(naflex_bundle, tmp_path, monkeypatch, *extra):
    """``masc-export --model random:tiny-naflex`` under a pool budget no export meets. The graphs
    are those the run's command export traced from the same checkpoint (tests/doubles
    ``graphs_from``): the PyTorch references, the validation and its refusal or override run as
    usual, without tracing the four graphs again."""
    pytest.importorskip("torch", reason="masc-export needs the export extra (torch)")
    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main

    # a pool budget no export meets: the check is past it whatever the weights
    monkeypatch.setitem(tol.EXPORT_VALIDATION_RTOL_BUDGETS["tiny"], "pool", NO_EXPORT_MEETS)
    out = tmp_path / "bundle"
    with graphs_from(naflex_bundle):
        return out, CliRunner().invoke(main, ["--model", "random:tiny-naflex", "--out", str(out), *extra])


@pytest.mark.slow
def test_masc_export_accepts_past_budget_with_the_override_and_records_it(naflex_bundle, tmp_path, monkeypatch):
    import json

    out, res = _export_cli(naflex_bundle, tmp_path, monkeypatch, "--accept-validation-error", str(OVERRIDE))
    assert res.exit_code == 0, res.output
    pool = json.loads((out / "manifest.json").read_text())["validation"]["pool"]
    o = pool["override"]
    assert o["accept_validation_error"] == OVERRIDE and o["budget"] == NO_EXPORT_MEETS
    assert o["figure"] == "max relative error" and o["measured"] == pool["max_rel"]
    assert NO_EXPORT_MEETS < o["measured"] <= OVERRIDE
    assert "EXPORT_VALIDATION_RTOL_BUDGETS['tiny']['pool']" in o["budget_from"]
    assert "override" not in json.loads((out / "manifest.json").read_text())["validation"]["vision"]


@pytest.mark.slow
def test_masc_export_refusal_names_the_way_out(naflex_bundle, tmp_path, monkeypatch):
    out, res = _export_cli(naflex_bundle, tmp_path, monkeypatch)
    assert res.exit_code == 1 and not out.exists()
    err = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and "graph 'pool' differs from PyTorch: max relative error" in err[0]
    assert "> budget 1e-12 (tolerances.EXPORT_VALIDATION_RTOL_BUDGETS['tiny']['pool']" in err[0]
    assert "--accept-validation-error" in err[0] and "Traceback" not in res.output
