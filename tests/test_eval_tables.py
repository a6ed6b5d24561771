"""The paper's score tables (jobs/eval_tables.py, jobs/eval_format.py, metrics/score_tables.py,
masc-eval table / compare, and agreement / auc over every metric column): means and intervals
against a direct numpy computation, the paired difference's sign and interval, n=1 groups without
an interval, the per-subject rows, rows averaged over references, LaTeX and Markdown escaping,
refusals in one line, and the random-weights note from the sidecar."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from masc_engine.cli.eval_cmd import main as eval_main
from masc_engine.jobs import eval_format as fm
from masc_engine.jobs import eval_tables as et
from masc_engine.jobs import evaluation as ev
from masc_engine.jobs.evaluation import DataError
from masc_engine.metrics.score_tables import MIN_CI_N, average_over, mean_ci, no_ci_note, paired_mean_diff
from masc_engine.runtime.pair_metrics import PairMetric
from masc_engine.tolerances import FLOAT64_SAME_FORMULA_TOL

NAN = float("nan")

# subject, method, prompt, ref, cp, pf, pf_status, status, clip_i, clip_i_status, same_subject
_ROWS = [
    ("cat", "ours", "p1", "r1", 0.80, 0.50, "ok", "ok", 70.0, "ok", "true"),
    ("cat", "ours", "p1", "r2", 0.60, 0.70, "ok", "ok", 72.0, "ok", "true"),
    ("dog", "ours", "p2", "r1", 0.50, 0.40, "ok", "ok", 60.0, "ok", "false"),
    ("dog", "ours", "p3", "r1", 0.30, NAN, "no_background", "no_background", 65.0, "ok", "true"),
    ("cat", "base_1", "p1", "r1", 0.70, 0.60, "ok", "ok", 68.0, "ok", "true"),
    ("cat", "base_1", "p1", "r2", 0.50, 0.60, "ok", "ok", 69.0, "ok", "false"),
    ("dog", "base_1", "p2", "r1", 0.20, 0.30, "ok", "ok", 50.0, "ok", "true"),
    ("dog", "base_1", "p3", "r1", 0.40, 0.50, "ok", "ok", 55.0, "ok", "false"),
    ("fox", "solo", "p9", "r1", 0.90, 0.10, "ok", "ok", 40.0, "ok", "true"),
]
COLUMNS = [
    "key",
    "subject",
    "method",
    "prompt",
    "ref_image",
    "cp",
    "cp_status",
    "pf",
    "pf_status",
    "status",
    "clip_i",
    "clip_i_status",
    "same_subject",
]


def _rows(rows=_ROWS) -> list[dict]:
    out = []
    for i, (s, m, p, r, cp, pf, pfs, st, ci, cis, within) in enumerate(rows):
        out.append(
            {
                "key": f"k{i}",
                "subject": s,
                "method": m,
                "prompt": p,
                "ref_image": r,
                "cp": cp,
                "cp_status": "ok",
                "pf": pf,
                "pf_status": pfs,
                "status": st,
                "clip_i": ci,
                "clip_i_status": cis,
                "same_subject": within,
            }
        )
    return out


def _write_csv(path, rows, columns=COLUMNS) -> str:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items() if k in columns})
    return str(path)


def _numpy_bootstrap_mean(x, n_resamples, confidence, seed):
    """The percentile bootstrap of a mean, written out: the index stream of numpy's default_rng."""
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = [x[rng.integers(0, x.size, size=x.size)].mean() for _ in range(n_resamples)]
    a = 1 - confidence
    return np.quantile(means, [a / 2, 1 - a / 2])


# ---------------------------------------------------------------- metrics/score_tables.py


def test_mean_ci_equals_a_direct_numpy_bootstrap():
    x = np.array([0.8, 0.6, 0.5, NAN, 0.3, 0.9, 0.1])
    ci = mean_ci(x, n_resamples=500, confidence=0.9, seed=7)
    lo, hi = _numpy_bootstrap_mean(x[~np.isnan(x)], 500, 0.9, 7)
    assert ci.n == 6 and ci.value == pytest.approx(np.nanmean(x), abs=FLOAT64_SAME_FORMULA_TOL)
    assert (ci.low, ci.high) == (
        pytest.approx(lo, abs=FLOAT64_SAME_FORMULA_TOL),
        pytest.approx(hi, abs=FLOAT64_SAME_FORMULA_TOL),
    )
    assert ci.note is None


def test_groups_too_small_have_no_interval():
    assert MIN_CI_N == 2
    one = mean_ci([0.4, NAN])
    assert one.value == 0.4 and one.n == 1 and math.isnan(one.low) and math.isnan(one.high)
    assert one.note == "n=1: no CI" == no_ci_note(1)
    none = mean_ci([NAN])
    assert math.isnan(none.value) and none.note == "n=0: no value"
    two = mean_ci([0.4, 0.6])
    assert not math.isnan(two.low) and two.note is None
    assert fm.ci_cell(one.value, one.low, one.high, one.note) == "0.400 (n=1: no CI)"
    assert fm.ci_cell(none.value, none.low, none.high, none.note) == "n/a"


def test_paired_difference_sign_and_interval():
    rng = np.random.default_rng(3)
    b = rng.normal(size=40)
    a = b + 0.25  # a is better by exactly 0.25 on every unit: the paired interval is that point
    ci = paired_mean_diff(a, b, n_resamples=200, seed=1)
    assert ci.value == pytest.approx(0.25) and ci.low == pytest.approx(0.25) and ci.high == pytest.approx(0.25)
    back = paired_mean_diff(b, a, n_resamples=200, seed=1)
    assert back.value == pytest.approx(-0.25)
    # against a direct paired bootstrap: the same indices for both sides
    a2 = b + rng.normal(0.1, 0.5, size=40)
    a2[5] = NAN  # an incomplete pair is left out
    ci2 = paired_mean_diff(a2, b, n_resamples=300, confidence=0.95, seed=4)
    ok = ~np.isnan(a2)
    d = a2[ok] - b[ok]
    lo, hi = _numpy_bootstrap_mean(d, 300, 0.95, 4)
    assert ci2.n == 39 and ci2.value == pytest.approx(d.mean(), abs=FLOAT64_SAME_FORMULA_TOL)
    assert ci2.low == pytest.approx(lo, abs=FLOAT64_SAME_FORMULA_TOL) and ci2.high == pytest.approx(
        hi, abs=FLOAT64_SAME_FORMULA_TOL
    )
    # an unpaired bootstrap would be wider: pairing matters
    assert paired_mean_diff([1.0], [0.5]).note == "n=1: no CI"


def test_average_over_keys():
    keys, means, counts = average_over(
        ["a", "b", "a", "c", "a"], np.array([[1.0, NAN], [2.0, 5.0], [3.0, 4.0], [NAN, NAN], [5.0, 6.0]])
    )
    assert keys == ["a", "b", "c"] and counts.tolist() == [3, 1, 1]
    assert means[0].tolist() == [3.0, 5.0] and means[1].tolist() == [2.0, 5.0]
    assert np.isnan(means[2]).all()
    k1, m1, _ = average_over([1, 1], [2.0, 4.0])
    assert k1 == [1] and m1.tolist() == [3.0]


# ---------------------------------------------------------------- jobs/eval_tables.py


def test_metric_columns_follow_the_registry(monkeypatch):
    cols = ["key", "dino", "clip_t", "pf", "cp", "cp_global", "pf_bg_stripped", "clip_i", "other"]
    assert et.metric_columns(cols) == ("cp", "pf", "cp_global", "pf_bg_stripped", "clip_i", "clip_t", "dino")
    assert et.metric_columns(cols, ("other", "cp")) == ("other", "cp")
    with pytest.raises(DataError, match="no metric column 'nope'"):
        et.metric_columns(cols, ("nope",))
    with pytest.raises(DataError, match="no registered metric column"):
        et.metric_columns(["key", "other"])
    plug = PairMetric("myscore", ("my_score",), "a plug-in", lambda b: [])
    builtin = et.registered()
    monkeypatch.setattr(et, "registered", lambda: (*builtin, plug))  # a plug-in's metric, registered last
    assert et.metric_columns([*cols, "my_score"])[-1] == "my_score"


def test_means_table_by_hand():
    u = et.score_units(_rows(), et.TableOptions(n_resamples=400, seed=2))
    assert u.metrics == ("cp", "pf", "clip_i")
    assert u.skipped == {"cp": 0, "pf": 1, "clip_i": 0}  # pf_status no_background; clip_i keeps that row
    t = et.means_table(u)
    by = {r["method"]: r for r in t.rows}
    assert [r["method"] for r in t.rows] == ["ours", "base_1", "solo", "pooled"]
    assert by["ours"]["cp"] == pytest.approx((0.8 + 0.6 + 0.5 + 0.3) / 4)
    assert by["ours"]["pf"] == pytest.approx((0.5 + 0.7 + 0.4) / 3) and by["ours"]["pf_n"] == 3
    assert by["ours"]["clip_i"] == pytest.approx((70 + 72 + 60 + 65) / 4) and by["ours"]["clip_i_n"] == 4
    lo, hi = _numpy_bootstrap_mean([70.0, 72.0, 60.0, 65.0], 400, 0.95, 2)
    assert (by["ours"]["clip_i_low"], by["ours"]["clip_i_high"]) == (pytest.approx(lo), pytest.approx(hi))
    assert by["pooled"]["n"] == 9 and by["pooled"]["cp"] == pytest.approx(np.mean([r[4] for r in _ROWS]))
    solo = by["solo"]
    assert solo["n"] == 1 and solo["cp"] == 0.9 and math.isnan(solo["cp_low"]) and solo["cp_note"] == "n=1: no CI"
    headers, body, _ = fm.means_layout(t)
    assert headers == ["method", "n", "cp", "pf", "clip_i"]
    assert body[2] == ["solo", "1", "0.900 (n=1: no CI)", "0.100 (n=1: no CI)", "40.000 (n=1: no CI)"]
    assert body[0][3].endswith(" n=3")  # pf of 'ours' over 3 of its 4 rows


def test_per_subject_rows_and_averaged_references():
    o = et.TableOptions(metrics=("cp",), n_resamples=50)
    t = et.means_table(et.score_units(_rows(), o), by_subject=True)
    got = [(r["subject"], r["method"], r["n"], round(r["cp"], 10)) for r in t.rows]
    assert got == [
        ("cat", "ours", 2, 0.7),
        ("cat", "base_1", 2, 0.6),
        ("dog", "ours", 2, 0.4),
        ("dog", "base_1", 2, 0.3),
        ("fox", "solo", 1, 0.9),
    ]
    assert all(r["scope"] == "subject" for r in t.rows)
    # averaging: the two references of (cat, p1) are one unit per method
    ua = et.score_units(_rows(), et.TableOptions(metrics=("cp", "pf"), average_references=True, n_resamples=50))
    assert ua.values.shape == (7, 2) and ua.rows_per_unit.tolist() == [2, 1, 1, 2, 1, 1, 1]
    assert ua.values[0].tolist() == pytest.approx([0.7, 0.6]) and ua.values[3].tolist() == pytest.approx([0.6, 0.6])
    assert np.isnan(ua.values[2, 1])  # (dog, p3) of 'ours': its only pf row is not ok
    by = {r["method"]: r for r in et.means_table(ua).rows}
    assert by["ours"]["n"] == 3 and by["ours"]["cp"] == pytest.approx((0.7 + 0.5 + 0.3) / 3)
    with pytest.raises(DataError, match="subject column"):
        et.means_table(et.score_units(_rows(), et.TableOptions(subject_column="nope")), by_subject=True)


def test_compare_pairs_on_the_key_and_refuses_unpaired_rows():
    rows = [r for r in _rows() if r["method"] != "solo"]
    o = et.TableOptions(metrics=("cp", "pf", "clip_i"), average_references=True, n_resamples=300, seed=5)
    t = et.compare_table(et.score_units(rows, o), "ours", "base_1")
    by = {r["metric"]: r for r in t.rows}
    assert t.n_pairs == 3
    # units (cat,p1), (dog,p2), (dog,p3): ours cp 0.7, 0.5, 0.3; base_1 0.6, 0.2, 0.4
    d = np.array([0.7 - 0.6, 0.5 - 0.2, 0.3 - 0.4])
    assert by["cp"]["diff"] == pytest.approx(d.mean()) and by["cp"]["diff"] > 0
    lo, hi = _numpy_bootstrap_mean(d, 300, 0.95, 5)
    assert (by["cp"]["diff_low"], by["cp"]["diff_high"]) == (pytest.approx(lo), pytest.approx(hi))
    assert by["pf"]["n"] == 2  # (dog, p3) has no pf for 'ours'
    rev = et.compare_table(et.score_units(rows, o), "base_1", "ours")
    assert rev.rows[0]["diff"] == pytest.approx(-d.mean())
    # not averaged: (cat, p1) twice per method
    with pytest.raises(DataError, match=r"rows do not pair: 'ours' has key \(cat, p1\) more than once"):
        et.compare_table(et.score_units(rows, et.TableOptions()), "ours", "base_1")
    # a key one method lacks
    with pytest.raises(
        DataError,
        match=r"rows do not pair on \(subject, prompt\): 4 key\(s\) have one method only, "
        r"first \(fox, p9\) of 'solo'",
    ):
        et.compare_table(et.score_units(_rows(), o), "solo", "ours")
    with pytest.raises(DataError, match="methods: ours, base_1, solo"):
        et.compare_table(et.score_units(_rows(), o))
    auto = et.compare_table(et.score_units(rows, o))
    assert (auto.a, auto.b) == ("ours", "base_1")


def test_agreement_and_auc_over_every_metric_column_equal_the_single_column_tables():
    rows = _rows()
    ratings = [{"key": r["key"], "h": float(i % 5)} for i, r in enumerate(rows)]
    o = ev.AgreementOptions(rating_columns=("h",), n_resamples=60, levels=("interval",))
    many = et.agreement_tables(rows, ratings, o)
    assert list(dict.fromkeys(r["metric"] for r in many)) == ["cp", "pf", "clip_i"]
    for m in ("cp", "pf", "clip_i"):
        one = ev.agreement_table(rows, ratings, ev.AgreementOptions(**{**o.__dict__, "score_column": m})).rows
        got = [{k: v for k, v in r.items() if k != "metric"} for r in many if r["metric"] == m]
        assert json.dumps(got, default=str) == json.dumps(one, default=str)
    a = ev.AucOptions(within_column="same_subject", group_column="method", n_resamples=60)
    auc = et.auc_tables(rows, a)
    for m in ("cp", "pf", "clip_i"):
        one = ev.auc_table(rows, ev.AucOptions(**{**a.__dict__, "score_column": m})).rows
        got = [{k: v for k, v in r.items() if k != "metric"} for r in auc if r["metric"] == m]
        assert json.dumps(got) == json.dumps(one)  # NaN != NaN: compared as text


# ---------------------------------------------------------------- formats


def test_latex_and_markdown_escape_method_names():
    assert fm.latex_escape("a_b & c% $x# {y} ~^\\") == (
        r"a\_b \& c\% \$x\# \{y\} \textasciitilde{}"
        r"\textasciicircum{}\textbackslash{}"
    )
    rows = _rows()
    for r in rows:
        r["method"] = {"ours": "our_method & co", "base_1": "base|50%", "solo": "solo"}[r["method"]]
    t = et.means_table(et.score_units(rows, et.TableOptions(metrics=("cp",), n_resamples=20)))
    headers, body, cols = fm.means_layout(t)
    tex = fm.render("latex", headers, body, caption="x_y", notes=["50% of it"])
    assert r"our\_method \& co & 4 & " in tex and r"base|50\% & 4" in tex and r"\caption{x\_y}" in tex
    assert r"\par\footnotesize 50\% of it" in tex and tex.count(r"\\") >= len(body) + 1
    md = fm.render("md", headers, body)
    assert "| base\\|50% | 4 |" in md and "| our_method & co |" in md
    text = fm.render("csv", headers, body, rows=t.rows, columns=cols)
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert parsed[0]["method"] == "our_method & co" and float(parsed[0]["cp"]) == pytest.approx(0.55)
    assert parsed[2]["cp_low"] == "nan" and parsed[2]["cp_note"] == "n=1: no CI"


# ---------------------------------------------------------------- the CLI


@pytest.fixture()
def scores_file(tmp_path):
    return _write_csv(tmp_path / "scores.csv", _rows())


def test_cli_table_formats_and_out(scores_file, tmp_path):
    r = CliRunner().invoke(eval_main, ["table", scores_file, "--n-resamples", "50"])
    assert r.exit_code == 0, r.output
    assert "| method | n | cp | pf | clip_i |" in r.output and "| solo | 1 | 0.900 (n=1: no CI) |" in r.output
    out = tmp_path / "t.tex"
    r = CliRunner().invoke(
        eval_main, ["table", scores_file, "--by-subject", "--metrics", "cp", "--out", str(out), "--n-resamples", "50"]
    )
    assert r.exit_code == 0, r.output
    tex = out.read_text()
    assert tex.startswith(r"\begin{table}") and r"cat & base\_1 & 2 & 0.600 [" in tex
    r = CliRunner().invoke(
        eval_main,
        [
            "table",
            scores_file,
            "--format",
            "csv",
            "--metrics",
            "cp,clip_i",
            "--average-references",
            "--n-resamples",
            "50",
        ],
    )
    parsed = list(csv.DictReader(io.StringIO(r.output)))
    assert [p["method"] for p in parsed] == ["ours", "base_1", "solo", "pooled"]
    assert float(parsed[0]["cp"]) == pytest.approx(0.5) and parsed[0]["n"] == "3"
    r = CliRunner().invoke(eval_main, ["table", scores_file, "--out", str(tmp_path / "t.xlsx")])
    assert r.exit_code == 2 and "--format" in r.output


def test_cli_compare_and_its_refusal(scores_file):
    r = CliRunner().invoke(
        eval_main,
        ["compare", scores_file, "--a", "ours", "--b", "base_1", "--average-references", "--n-resamples", "50"],
    )
    assert r.exit_code == 0, r.output
    assert "| metric | n | ours | base_1 | ours - base_1 [95% CI] |" in r.output
    assert "| cp | 3 | 0.500 | 0.400 | 0.100 [" in r.output
    r = CliRunner().invoke(eval_main, ["compare", scores_file, "--a", "ours", "--b", "solo", "--average-references"])
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "rows do not pair" in lines[0]


def test_cli_agreement_and_auc_every_metric(scores_file, tmp_path):
    ratings = tmp_path / "r.csv"
    ratings.write_text("key,h\n" + "".join(f"k{i},{i % 5}\n" for i in range(len(_ROWS))))
    out = tmp_path / "ag.csv"
    r = CliRunner().invoke(
        eval_main,
        [
            "agreement",
            scores_file,
            "--ratings",
            str(ratings),
            "--metrics",
            "all",
            "--rating-column",
            "h",
            "--n-resamples",
            "30",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    written = list(csv.DictReader(out.open()))
    assert [w["metric"] for w in written] == ["cp"] * 4 + ["pf"] * 4 + ["clip_i"] * 4
    assert "clip_i  pooled" in r.output
    r = CliRunner().invoke(
        eval_main, ["agreement", scores_file, "--ratings", str(ratings), "--metrics", "all", "--score-column", "cp"]
    )
    assert r.exit_code == 2 and "not both" in r.output
    r = CliRunner().invoke(
        eval_main,
        [
            "auc",
            scores_file,
            "--within-column",
            "same_subject",
            "--metrics",
            "all",
            "--group-column",
            "method",
            "--format",
            "md",
            "--n-resamples",
            "30",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (
        "| metric | group | n | within | cross | AUC [95% CI] |" in r.output and "| clip_i | pooled | 9 |" in r.output
    )


def test_random_weights_note_from_the_sidecar(scores_file, tmp_path):
    meta = {"bundle": "bundles/tiny", "source_model": {"model": "random:tiny-naflex", "random_weights": True}}
    (tmp_path / "scores.csv.meta.json").write_text(json.dumps(meta))
    assert et.random_weights(et.scores_sidecar(scores_file))
    line = et.random_weights_line(et.scores_sidecar(scores_file))
    assert line == (
        "bundle bundles/tiny was exported from random weights (random:tiny-naflex): its scores only test the pipeline"
    )
    r = CliRunner().invoke(eval_main, ["table", scores_file, "--metrics", "cp", "--n-resamples", "20"])
    assert r.exit_code == 0 and f"- WARNING: {line}" in r.output
    assert r.stderr.strip() == f"WARNING: {line}"
    (tmp_path / "scores.csv.meta.json").write_text(json.dumps({"source_model": {"model": "google/siglip2"}}))
    r = CliRunner().invoke(eval_main, ["table", scores_file, "--metrics", "cp", "--n-resamples", "20"])
    assert "WARNING" not in r.output and not r.stderr
    assert et.random_weights({"source_model": "random:x"}) and not et.random_weights(None)


def test_docs_examples_run_on_the_shipped_scores(tmp_path):
    """docs/evaluation.md's table and compare lines on examples/dreambooth/scores_illustrative.csv,
    their figures against the file read directly."""
    from support import EXAMPLES

    path = str(EXAMPLES / "scores_illustrative.csv")
    rows = list(csv.DictReader(open(path)))
    r = CliRunner().invoke(eval_main, ["table", path, "--average-references", "--n-resamples", "100"])
    assert r.exit_code == 0, r.output
    for method in ("method_a", "method_b"):
        units: dict = {}
        for row in rows:
            if row["method"] == method:
                units.setdefault((row["subject"], row["prompt"]), []).append(float(row["cp"]))
        mean = np.mean([np.mean(v) for v in units.values()])
        assert f"| {method} | {len(units)} | {mean:.3f} [" in r.output
    out = tmp_path / "sub" / "ab.tex"
    r = CliRunner().invoke(
        eval_main,
        ["compare", path, "--average-references", "--format", "latex", "--out", str(out), "--n-resamples", "100"],
    )
    assert r.exit_code == 0, r.output
    assert r"cp & 8 & " in out.read_text() and r"method\_a - method\_b" in out.read_text()


def test_table_shows_torchmetrics_clip_score_with_the_clamp_on_the_mean(tmp_path):
    """clip_score_tm's torchmetrics column is max(mean, 0) of the group's rows, by hand: a group
    whose mean is negative reports 0 (a per-row clamp would not), the plain mean stays unclamped;
    a row whose status is not ok is left out, as a sample torchmetrics was never given."""
    # method, clip_score_tm, its status
    cells = [("a", -20.0, "ok"), ("a", 50.0, "ok"), ("b", -30.0, "ok"), ("b", 10.0, "ok"), ("b", 90.0, "no_image")]
    rows = [
        {"subject": "cat", "method": m, "prompt": f"p{i}", "clip_score_tm": v, "clip_score_tm_status": st}
        for i, (m, v, st) in enumerate(cells)
    ]
    t = et.means_table(et.score_units(rows, et.TableOptions(n_resamples=50)))
    by = {r["method"]: r for r in t.rows}
    assert by["a"]["clip_score_tm_torchmetrics"] == pytest.approx((-20 + 50) / 2)  # 15: a per-row clamp says 25
    assert by["b"]["clip_score_tm"] == pytest.approx((-30 + 10) / 2)  # the plain mean, -10
    assert by["b"]["clip_score_tm_torchmetrics"] == 0.0  # max(-10, 0)
    assert by["pooled"]["clip_score_tm_torchmetrics"] == pytest.approx((-20 + 50 - 30 + 10) / 4)
    headers, body, cols = fm.means_layout(t)
    assert headers == ["method", "n", "clip_score_tm", "clip_score_tm [torchmetrics: max(mean, 0)]"]
    assert [r[3] for r in body] == ["15.000", "0.000", "2.500"]
    assert cols[-1] == "clip_score_tm_torchmetrics"
    path = _write_csv(tmp_path / "tm.csv", rows, columns=list(rows[0]))
    r = CliRunner().invoke(eval_main, ["table", path, "--n-resamples", "50"])
    assert r.exit_code == 0, r.output
    assert "| clip_score_tm [torchmetrics: max(mean, 0)] |" in r.output and "| 0.000 |" in r.output
    assert "clamped at 0 (the clamp is on the mean, not per row" in r.output
    r = CliRunner().invoke(eval_main, ["table", path, "--n-resamples", "50", "--format", "csv"])
    got = {row["method"]: row["clip_score_tm_torchmetrics"] for row in csv.DictReader(io.StringIO(r.output))}
    assert got == {"a": "15.0", "b": "0.0", "pooled": "2.5"}


def test_the_shipped_illustrative_scores_use_masc_runs_scales():
    """cp and pf are cosines in [-1, 1]; the classic metrics 100 x cosine in [-100, 100]
    (docs/metrics.md), as masc-run writes them: a column on another scale would make the tables
    built from the file disagree with a real run's."""
    from support import EXAMPLES

    rows = list(csv.DictReader(open(EXAMPLES / "scores_illustrative.csv")))
    for col, top in (("cp", 1.0), ("pf", 1.0), ("clip_i", 100.0), ("clip_t", 100.0), ("dino", 100.0)):
        values = np.array([float(r[col]) for r in rows if r[col] not in ("", "nan")])
        assert len(values) >= len(rows) - 2 and np.all(np.abs(values) <= top), col  # a failed row or two
        if top == 100.0:
            assert np.median(np.abs(values)) > 1.0, col  # not a cosine
