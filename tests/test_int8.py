"""int8 on CPU is opt-in and gated against fp32."""

from __future__ import annotations

import json

import numpy as np
import pytest

from support import EXAMPLES
from masc_engine.jobs.int8_gate import Int8GateError, gate_report, quantize_bundle
from masc_engine.metrics.certification import GateSet
from masc_engine.tolerances import INT8_MAX_ABS_DCP, INT8_MIN_SPEARMAN


def test_gate_report_known_values():
    rng = np.random.default_rng(0)
    cp, pf = rng.random(200), rng.random(200)
    same = gate_report(cp, pf, cp, pf)
    assert same["passed"] and same["max_abs_dcp"] == 0.0 and same["spearman_cp"] == pytest.approx(1.0)
    shifted = gate_report(cp, pf, cp + 0.02, pf)  # monotone shift: ranks kept, |dCP| too large
    assert not shifted["passed"] and shifted["max_abs_dcp"] == pytest.approx(0.02)
    assert shifted["spearman_cp"] == pytest.approx(1.0)
    shuffled = gate_report(cp, pf, cp, rng.permutation(pf))
    assert not shuffled["passed"] and shuffled["spearman_pf"] < 0.5
    nan = gate_report(np.r_[cp, np.nan], np.r_[pf, 0.1], np.r_[cp, 0.3], np.r_[pf, 0.1])
    assert nan["pairs"] == 200  # NaN pairs are dropped pairwise, not compared


def test_quantize_bundle_is_gated(naflex_bundle, tmp_path, caplog):
    pytest.importorskip("onnx")
    out = tmp_path / "int8"
    caplog.set_level("INFO", logger="masc_engine")
    try:
        report = quantize_bundle(naflex_bundle, out, EXAMPLES / "pairs.csv", keep_refused_at=tmp_path / "refused")
    except Int8GateError as e:
        # Refused: nothing written, and the message carries the measured figures.
        assert not out.exists()
        out = tmp_path / "refused"  # kept for benchmarks only: checked below like an accepted one
        r = e.report
        assert not r["passed"] and r["pairs"] == 20
        assert f"{r['max_abs_dcp']:.4f}" in str(e) and f"{r['spearman_pf']:.4f}" in str(e)
        assert r["max_abs_dcp"] > INT8_MAX_ABS_DCP or min(r["spearman_cp"], r["spearman_pf"]) < INT8_MIN_SPEARMAN
    else:
        m = json.loads((out / "manifest.json").read_text())
        assert m["precision"]["mode"] == "int8-dynamic" and m["precision"]["gate_report"] == report
        assert report["passed"] and report["max_abs_dcp"] <= INT8_MAX_ABS_DCP
    assert any(r.getMessage().startswith("int8 gates vs fp32: ") for r in caplog.records)
    # The fp32 bundle's fused ort-cpu graphs are dropped: CPU runs of the int8 bundle use int8.
    from masc_engine.runtime.scorer import Scorer

    m = json.loads((out / "manifest.json").read_text())
    assert "variants" not in m and m["precision"]["dropped_variants"] == ["ort-cpu"]
    assert not list(out.glob("*.ort-cpu.*")) and not any("variants" in g for g in m["graphs"].values())
    assert not any(".ort-cpu." in f for f in m["files"])
    assert Scorer(out).graph_variant == "portable"


@pytest.mark.parametrize("outcome", ["kept", "refused"])
def test_masc_export_int8_cli(naflex_bundle, tmp_path, monkeypatch, outcome):
    """Both outcomes of the gate, each forced by moving the gate (the tiny bundle's own figures sit
    wherever its random weights put them): kept writes the bundle with its passed report; refused
    writes nothing and names the figure."""
    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main
    from masc_engine.jobs import int8_gate

    out = tmp_path / "int8"
    res = CliRunner().invoke(main, ["--out", str(out), "--precision", "int8"])
    assert res.exit_code == 2 and "--gate-pairs" in res.output
    monkeypatch.setattr(int8_gate, "INT8_GATES", GateSet(2.0, None, -1.0 if outcome == "kept" else 1.01, "drop"))
    res = CliRunner().invoke(
        main,
        [
            "--out",
            str(out),
            "--precision",
            "int8",
            "--fp32-bundle",
            str(naflex_bundle),
            "--gate-pairs",
            str(EXAMPLES / "pairs.csv"),
        ],
    )
    if outcome == "kept":
        assert res.exit_code == 0, res.output
        assert json.loads((out / "manifest.json").read_text())["precision"]["gate_report"]["passed"] is True
    else:
        assert res.exit_code == 1, res.output
        assert "int8 refused" in res.output and "Spearman" in res.output and not out.exists()


def test_masc_export_int8_runs_without_scipy(naflex_bundle, tmp_path, monkeypatch):
    """The int8 gate's Spearman's rho is numpy's (metrics/ranked.py): with only the [export]
    extra (no scipy) --precision int8 quantizes, gates and writes the bundle."""
    import sys

    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main
    from masc_engine.jobs import int8_gate

    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy -> ImportError; find_spec -> None
    monkeypatch.setattr(int8_gate, "INT8_GATES", GateSet(2.0, None, -1.0, "drop"))  # the tiny model's figures vary
    out = tmp_path / "int8"
    res = CliRunner().invoke(
        main,
        [
            "--out",
            str(out),
            "--precision",
            "int8",
            "--gate-pairs",
            str(EXAMPLES / "pairs.csv"),
            "--fp32-bundle",
            str(naflex_bundle),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "scipy" not in res.output
    assert json.loads((out / "manifest.json").read_text())["precision"]["gate_report"]["pass"] is True


@pytest.mark.parametrize("fp32_bundle", [True, False])
def test_masc_export_int8_without_onnx_refuses_in_one_line_before_any_work(
    naflex_bundle, tmp_path, monkeypatch, fp32_bundle
):
    """Without onnx (the quantizer's graph I/O), --precision int8 stops in one line naming onnx and
    the extra that brings it, before exporting or quantizing."""
    import sys

    from click.testing import CliRunner

    from masc_engine.cli.export_cmd import main

    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx -> ImportError; find_spec -> None
    out = tmp_path / "int8"
    argv = ["--out", str(out), "--precision", "int8", "--gate-pairs", str(EXAMPLES / "pairs.csv")]
    argv += ["--fp32-bundle", str(naflex_bundle)] if fp32_bundle else ["--model", "random:tiny-naflex"]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 1 and (res.exception is None or isinstance(res.exception, SystemExit))
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: quantizing to int8") and "needs onnx" in lines[0]
    assert "Traceback" not in res.output
    assert not out.exists() and list(tmp_path.iterdir()) == []
