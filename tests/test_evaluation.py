"""The evaluation tables masc-eval and masc-report share (jobs/evaluation.py) and the one table
writer (jobs/tables.py): the same score file through both commands gives the same AUC rows, the
same method order and the same pooled label; every output table writes NaN one way."""

from __future__ import annotations

import csv
import json
import math
import re

import numpy as np
import pytest
from click.testing import CliRunner

from masc_engine import report as rp
from masc_engine.cli.eval_cmd import main as eval_main
from masc_engine.jobs import evaluation as ev
from masc_engine.jobs.rank import RankReport, write_rank_outputs
from masc_engine.jobs.results import write_output
from masc_engine.jobs.tables import CSV_NAN, parse_number, read_table, write_table
from masc_engine.metrics import agreement as ag

NAN = float("nan")
METHODS = ("zeta_method", "alpha_method", "mid_method")  # first-appearance order, not sorted


# ---------------------------------------------------------------- the one writer


ROWS = [
    {"name": "a", "x": 0.25, "y": NAN, "n": None, "k": 3},
    {"name": "b", "x": np.float64(0.1), "y": 1.5, "n": 2, "k": None},
]
COLS = ["name", "x", "y", "n", "k"]


def test_write_table_one_missing_value_convention(tmp_path):
    csv_path = write_table(tmp_path / "t.csv", ROWS, COLS)
    assert csv_path.read_text().splitlines() == ["name,x,y,n,k", f"a,0.25,{CSV_NAN},,3", "b,0.1,1.5,2,"]
    assert CSV_NAN == "nan"
    tsv = write_table(tmp_path / "t.tsv", ROWS, COLS).read_text().splitlines()
    assert tsv[1] == f"a\t0.25\t{CSV_NAN}\t\t3"
    for name in ("t.jsonl", "t.ndjson"):
        recs = [json.loads(x) for x in write_table(tmp_path / name, ROWS, COLS).read_text().splitlines()]
        assert recs[0] == {"name": "a", "x": 0.25, "y": None, "n": None, "k": 3} and recs[1]["x"] == 0.1
    doc = json.loads(write_table(tmp_path / "t.json", ROWS, COLS, meta={"command": "x"}).read_text())
    assert doc["command"] == "x" and doc["rows"][0]["y"] is None
    assert json.loads(write_table(tmp_path / "a.json", ROWS, COLS).read_text())[0]["y"] is None
    # read back by the one reader: every spelling of a missing value is missing
    for name in ("t.csv", "t.tsv", "t.jsonl", "a.json"):
        rows = read_table(tmp_path / name).rows
        assert parse_number(rows[0]["y"]) is None and parse_number(rows[0]["n"]) is None, name
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(ValueError, match="cannot write"):
        write_table(tmp_path / "t.xlsx", ROWS, COLS)


def test_write_table_parquet_nulls(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet needs the parquet extra")
    t = pq.read_table(write_table(tmp_path / "t.parquet", ROWS, COLS)).to_pylist()
    assert t[0]["y"] is None and t[0]["n"] is None and t[1]["x"] == 0.1


def test_masc_run_and_masc_rank_outputs_use_the_one_writer(tmp_path):
    """masc-run's CSV (write_output) and masc-rank's CSVs spell NaN and None as write_table does."""
    write_output(tmp_path / "run.csv", ROWS, COLS)
    write_table(tmp_path / "same.csv", ROWS, COLS)
    assert (tmp_path / "run.csv").read_bytes() == (tmp_path / "same.csv").read_bytes()
    row = {
        "query_index": 1,
        "query": "q.jpg",
        "identity": "cat",
        "method": "m",
        "class": "",
        "status": "missing_file",
        "status_detail": "",
        "ap": NAN,
        "first_rank": None,
        "top1_score": NAN,
    }
    summary = {
        "method": "*",
        "class": "*",
        "n_queries": 1,
        "n_scored": 0,
        "n_undefined": 0,
        "n_failed": 1,
        "mAP": NAN,
        "top1": NAN,
        "top5": NAN,
    }
    rep = RankReport(rows=[row], summary=[summary], gallery_size=1)
    write_rank_outputs(rep, tmp_path / "r.csv", tmp_path / "r.summary.csv")
    got = next(csv.DictReader(open(tmp_path / "r.csv", encoding="utf-8")))
    assert (got["ap"], got["first_rank"], got["top1_score"]) == (CSV_NAN, "", CSV_NAN)
    got = next(csv.DictReader(open(tmp_path / "r.summary.csv", encoding="utf-8")))
    assert (got["mAP"], got["n_failed"]) == (CSV_NAN, "1")


# ---------------------------------------------------------------- masc-eval vs masc-report


@pytest.fixture()
def run_like(tmp_path):
    """A masc-run-format score file (cp_status / pf_status as masc-run writes them), a method with
    one class only, a failed row, a no_background row, a row without a method, and ratings."""
    rng = np.random.default_rng(5)
    rows, ratings = [], []
    for i in range(36):
        method = METHODS[i % 3]
        within = i % 4 != 0 if method != "mid_method" else True  # mid_method: within-subject only
        cp = float(np.clip(rng.normal(0.75 if within else 0.5, 0.12), 0, 1))
        pf = float(rng.normal(0.1, 0.03))
        rows.append(
            {
                "key": f"k{i:02d}",
                "method": method,
                "same_subject": "true" if within else "false",
                "ref_image": "r.png",
                "out_image": "o.png",
                "prompt": "a photo",
                "row_index": i + 1,
                "cp": cp,
                "pf": pf,
                "status": "ok",
                "status_detail": "",
                "cp_status": "ok",
                "pf_status": "ok",
            }
        )
        ratings.append(
            {
                "key": f"k{i:02d}",
                "g1": int(np.clip(round(cp * 5 - 0.5 + rng.normal(0, 0.7)), 0, 4)),
                "g2": int(np.clip(round(cp * 5 - 0.5 + rng.normal(0, 0.7)), 0, 4)),
            }
        )
    rows[3].update(cp=NAN, pf=NAN, status="missing_file", cp_status="missing_file", pf_status="missing_file")
    rows[7].update(pf=NAN, status="no_background", pf_status="no_background")
    rows[10].update(method="")
    path = tmp_path / "scores.csv"
    write_output(path, rows, list(rows[0]))
    rpath = tmp_path / "human.csv"
    write_table(rpath, ratings, ["key", "g1", "g2"])
    return path, rpath


def _eval(args, out):
    res = CliRunner().invoke(eval_main, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["rows"]


def test_masc_eval_and_masc_report_give_the_same_rows(run_like, tmp_path):
    pytest.importorskip("sklearn", reason="masc-eval needs the eval extra")
    pytest.importorskip("krippendorff", reason="masc-eval needs the eval extra")
    scores, ratings = run_like
    opts = rp.ReportOptions(within_column="same_subject", n_resamples=150, seed=4)
    rows, meta = rp.load_scores(scores)
    text = rp.build_report(rows, meta, scores_path=scores, options=opts)
    prepared = rp.prepare_rows(rows)
    for m in ("cp", "pf"):
        got = _eval(
            [
                "auc",
                str(scores),
                "--score-column",
                m,
                "--within-column",
                "same_subject",
                "--n-resamples",
                "150",
                "--seed",
                "4",
            ],
            tmp_path / f"auc_{m}.json",
        )
        pooled = got[-1]
        mine = rp.within_cross(prepared, m, opts).pooled
        for k in ("scope", "group", "n", "n_within", "n_cross", "auc", "auc_low", "auc_high"):
            assert mine[k] == pooled[k], (m, k)
        shown = float(re.search(rf'data-metric="{m}" data-auc="([^"]+)"', text).group(1))
        assert shown == pooled["auc"]
    # grouping: methods in order of first appearance (not sorted), the row without a method only
    # in the pooled row, one pooled label; the same in masc-eval agreement, masc-eval auc, the report
    agreement = _eval(
        [
            str(scores),
            "--ratings",
            str(ratings),
            "--rating-column",
            "g1",
            "--rating-column",
            "g2",
            "--scale",
            "0-4",
            "--n-resamples",
            "50",
        ],
        tmp_path / "agr.json",
    )
    auc = _eval(
        ["auc", str(scores), "--within-column", "same_subject", "--group-column", "method", "--n-resamples", "50"],
        tmp_path / "auc_groups.json",
    )
    report_rows = re.findall(r'<tr(?: class="pooled")? data-method="([^"]*)">', text)
    expected = [*METHODS, ag.POOLED]
    assert [r["method"] for r in agreement] == [r["group"] for r in auc] == report_rows == expected
    assert [r["scope"] for r in agreement][-1] == [r["scope"] for r in auc][-1] == "pooled" == rp.POOLED
    assert [s["method"] for s in rp.method_stats(prepared, opts)] == expected
    # the unlabelled row counts in pooled only
    assert agreement[-1]["n"] == sum(r["n"] for r in agreement[:-1]) + 1
    # mid_method has within-subject pairs only: its AUC is undefined, and written as null in JSON
    mid = next(r for r in auc if r["group"] == "mid_method")
    assert mid["auc"] is None and "both classes" in mid["note"]


def test_masc_eval_csv_writes_nan_as_masc_run_does(run_like, tmp_path):
    pytest.importorskip("sklearn", reason="masc-eval needs the eval extra")
    scores, _ = run_like
    for suffix, delim in ((".csv", ","), (".tsv", "\t")):
        out = tmp_path / f"auc{suffix}"
        res = CliRunner().invoke(
            eval_main,
            [
                "auc",
                str(scores),
                "--within-column",
                "same_subject",
                "--group-column",
                "method",
                "--n-resamples",
                "50",
                "--out",
                str(out),
            ],
        )
        assert res.exit_code == 0, res.output
        mid = next(
            r for r in csv.DictReader(open(out, encoding="utf-8"), delimiter=delim) if r["group"] == "mid_method"
        )
        assert (mid["auc"], mid["auc_low"], mid["auc_high"]) == (CSV_NAN,) * 3
    # masc-run's own file spells its NaN scores the same way
    failed = next(r for r in csv.DictReader(open(scores, encoding="utf-8")) if r["status"] == "missing_file")
    assert failed["cp"] == CSV_NAN


def test_masc_eval_auc_within_value_and_rows_without_status(tmp_path):
    pytest.importorskip("sklearn", reason="masc-eval needs the eval extra")
    path = tmp_path / "s.csv"
    path.write_text("key,cp,kind\np0,0.9,same\np1,0.5,same\np2,0.5,other\np3,0.1,other\np4,,other\n")
    out = tmp_path / "auc.json"
    res = CliRunner().invoke(
        eval_main,
        [
            "auc",
            str(path),
            "--within-column",
            "kind",
            "--within-value",
            "same",
            "--n-resamples",
            "50",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "1 without a score" in res.output
    doc = json.loads(out.read_text())
    assert (doc["rows"][0]["n"], doc["rows"][0]["auc"]) == (4, 0.875)
    assert doc["within_value"] == "same" and doc["skipped_missing_score"] == 1
    res = CliRunner().invoke(eval_main, ["auc", str(path), "--within-column", "kind"])  # not a boolean column
    assert res.exit_code == 1 and f"{path}, line 4: column 'kind': 'other' is not a boolean" in res.output


def test_options_dataclasses_normalise():
    o = ev.AgreementOptions(rating_columns=["g1"], scale=range(3), method_column="", levels=(), ok_statuses="ok")
    assert o.rating_columns == ("g1",) and o.scale == (0.0, 1.0, 2.0) and o.method_column is None
    assert o.levels == ("interval", "ordinal") and o.ok_statuses == ("ok",) and o.raters == ("g1",)
    assert ev.AgreementOptions().raters == ("cp",)
    with pytest.raises(AttributeError):
        o.key = "x"  # frozen
    a = ev.AucOptions(within_column="w", group_column="", status_column="")
    assert a.group_column is None and a.status_column is None
    assert math.isclose(a.confidence, 0.95)
