"""The pair-metric registry's rules, each pinned by its values: the status-column name, the
option filter, the per-batch memo, compute_all's status column, labels, outcome records and the
result column layout."""

from __future__ import annotations

import math

import numpy as np
import pytest

from masc_engine.errors import InputError
from masc_engine.jobs.items import DecodedPair
from masc_engine.jobs.pairs import RowOutcome
from masc_engine.jobs.pairs.columns import (
    BUILTIN_METRICS,
    option_columns,
    result_columns,
    schema_label,
)
from masc_engine.runtime import pair_metrics as pm


def _metric(name="m", columns=("m",), status_column=None, compute=None, **kw):
    return pm.PairMetric(
        name=name, columns=columns, description="", compute=compute or (lambda b: []), status_column=status_column, **kw
    )


def test_the_status_column_is_named_after_the_first_column_only():
    assert _metric(columns=("a", "b"), status_column="a_status").status_column == "a_status"
    with pytest.raises(ValueError, match="a_status"):
        _metric(columns=("a", "b"), status_column="b_status")


def test_a_metric_without_columns_is_refused():
    with pytest.raises(ValueError, match="declares no column"):
        _metric(columns=())


def test_metrics_for_adds_the_metrics_of_the_options_asked():
    assert [m.name for m in pm.metrics_for()] == ["cp", "pf"]
    assert [m.name for m in pm.score_metrics()] == ["cp", "pf"]
    assert [m.name for m in pm.metrics_for({"baselines"})] == ["cp", "pf", "cp_global", "cp_mnn", "pf_pooling"]
    assert [m.name for m in pm.metrics_for({"other"})] == ["cp", "pf"]


def test_shared_runs_make_once_per_key():
    calls = []
    b = pm.MetricBatch(items=(), results=(), host_tokens=lambda e: e, fg_threshold=0.5)

    def make(batch):
        calls.append(1)
        return len(calls)

    assert b.shared("k", make) == 1 and b.shared("k", make) == 1 and len(calls) == 1
    assert b.shared("other", make) == 2


def test_host_tokens_copies_each_encoding_once():
    class Enc:
        def __init__(self, t):
            self.tokens = t

    calls = []
    e1, e2 = object(), object()

    def to_host(e):
        calls.append(e)
        return Enc(np.full((2, 2), len(calls), np.float32))

    ht = pm.HostTokens(to_host)
    first = ht(e1)
    assert ht(e1) is first and ht(e2)[0, 0] == 2 and calls == [e1, e2]


def test_compute_all_writes_each_status_and_leaves_notes_out():
    m = _metric(
        name="zz",
        columns=("zz", "zz_n"),
        status_column="zz_status",
        compute=lambda b: [{"zz": 1.0, "zz_n": 2.0, "status": "bad", "note": "why"}, {"zz": 3.0, "zz_n": 4.0}],
    )
    plain = _metric(name="yy", columns=("yy",), compute=lambda b: [{"yy": 5.0, "status": "x"}, {"yy": 6.0}])
    b = pm.MetricBatch(items=(0, 1), results=(), host_tokens=lambda e: e, fg_threshold=0.5)
    assert pm.compute_all([m, plain], b) == [
        {"zz": 1.0, "zz_n": 2.0, "zz_status": "bad", "yy": 5.0},
        {"zz": 3.0, "zz_n": 4.0, "zz_status": "ok", "yy": 6.0},
    ]


def test_axis_labels():
    assert pm.get_metric("cp").axis_label == "CP (concept preservation)"
    assert pm.get_metric("cp_mnn").axis_label == "CP_MNN"
    assert pm.get_metric("cp_mnn").score_column == "cp_mnn"
    with pytest.raises(KeyError, match="registered: cp, pf, cp_global, cp_mnn, pf_pooling"):
        pm.get_metric("nope")


def test_output_columns_and_columns_of():
    cp, mnn = pm.get_metric("cp"), pm.get_metric("cp_mnn")
    assert cp.output_columns() == ("cp", "cp_status") and mnn.output_columns() == ("cp_mnn", "cp_mnn_frac")
    assert pm.columns_of((mnn, cp)) == ("cp_mnn", "cp_mnn_frac", "cp", "cp_status")
    assert [m.name for m in pm.headline_metrics()] == ["cp", "pf"]


def _outcome(metrics) -> RowOutcome:
    e = InputError("x", "y")
    return RowOutcome(DecodedPair(e, e, e, e, "p", "o", row_index=3, cells={"a": 1}), metrics)


def test_outcome_headline_scores_start_nan_and_others_go_to_values():
    o = _outcome(pm.metrics_for({"baselines"}))
    assert set(o.scores) == {"cp", "pf"} and all(math.isnan(v) for v in o.scores.values())
    assert o.statuses == {"cp_status": "ok", "pf_status": "ok"}
    o.take(pm.get_metric("cp"), {"cp": 0.5, "status": "ok"})
    o.take(pm.get_metric("cp_mnn"), {"cp_mnn": 0.25, "cp_mnn_frac": 0.75, "note": "first"})
    o.take(pm.get_metric("pf"), {"pf": float("nan"), "status": "no_background", "note": "second"})
    assert o.scores["cp"] == 0.5 and "cp_mnn" not in o.scores
    assert o.values == {"cp_mnn": 0.25, "cp_mnn_frac": 0.75}
    rec = o.record()
    assert rec["status"] == "no_background" and rec["status_detail"] == "first; second"
    assert (rec["a"], rec["row_index"], rec["cp"], rec["cp_mnn"]) == (1, 3, 0.5, 0.25)
    assert list(rec)[:5] == ["a", "row_index", "cp", "pf", "status"]


def test_outcome_fail_gives_every_status_the_reason_and_the_detail():
    o = _outcome(pm.metrics_for())
    o.take(pm.get_metric("cp"), {"cp": float("nan"), "status": "empty_reference_mask", "note": "n"})
    o.fail(InputError("missing_file", "ref_image: gone"))
    rec = o.record()
    assert (rec["status"], rec["cp_status"], rec["pf_status"], rec["status_detail"]) == (
        "missing_file",
        "missing_file",
        "missing_file",
        "ref_image: gone",
    )


def test_outcome_status_is_the_first_in_metric_order():
    o = _outcome(pm.metrics_for())
    o.take(pm.get_metric("pf"), {"pf": float("nan"), "status": "no_background"})
    o.take(pm.get_metric("cp"), {"cp": float("nan"), "status": "reference_mask_below_threshold"})
    assert o.status == "reference_mask_below_threshold"


def test_result_columns_leave_opt_in_metrics_to_option_columns():
    cols = result_columns(pm.metrics_for({"baselines"}))
    assert cols == result_columns(pm.metrics_for())
    assert "cp_global" not in cols and cols[-2:] == ("ref_mask_coverage", "out_mask_coverage")
    assert option_columns("baselines") == ("cp_global", "cp_mnn", "cp_mnn_frac", *BUILTIN_METRICS[4]["columns"])
    assert option_columns("other") == ()


def test_schema_label_names_versions_other_than_one():
    assert schema_label({}) == "v1: cp, pf, cp_global, cp_mnn, pf_pooling"
    other = {"result_schema": {"version": 2, "metrics": [{"name": "cp", "version": 1}, {"name": "x", "version": 3}]}}
    assert schema_label(other) == "v2: cp, x v3"
