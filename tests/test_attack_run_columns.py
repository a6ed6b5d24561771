"""The pairs run's settings, summary and cell reading pinned by values: the lenient score reading,
the result schema in the fingerprint and the rerun identity, the opt-in columns' order and the
per-method table."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from masc_engine.jobs.pairs.columns import BUILTIN_METRICS, RESULT_COLUMNS, schema_identity
from masc_engine.jobs.pairs.settings import RunSettings
from masc_engine.jobs.pairs.summary import Summary
from masc_engine.jobs.tables import number_or_nan
from masc_engine.runtime import pair_metrics as pm


@pytest.mark.parametrize("cell", [None, "", "nan", "NA", "null", "abc", True, "inf", float("inf"), [1]])
def test_number_or_nan_is_nan_where_a_cell_has_no_number(cell):
    assert math.isnan(number_or_nan(cell))


@pytest.mark.parametrize("cell, value", [("0.25", 0.25), (" -1 ", -1.0), (3, 3.0), (0.0, 0.0), ("1e-3", 0.001)])
def test_number_or_nan_reads_numbers(cell, value):
    assert number_or_nan(cell) == value


def _scorer():
    cfg = SimpleNamespace(identity=lambda: {"cfg": 1}, option_identity=lambda: {"--cfg": 1})
    return SimpleNamespace(bundle=SimpleNamespace(fingerprint="abc"), config=cfg)


@pytest.fixture
def extra_metric():
    m = pm.register(
        pm.PairMetric(name="zz_extra", columns=("zz_extra",), description="d", compute=lambda b: [], version=2)
    )
    yield m
    pm.base._REGISTRY.pop("zz_extra", None)


def test_a_registered_metric_changes_the_fingerprint_and_names_the_schema(extra_metric):
    s = RunSettings()
    assert schema_identity()["result_schema"]["metrics"][-1] == {
        "name": "zz_extra",
        "version": 2,
        "columns": ["zz_extra"],
    }
    ident = s.identity(_scorer())
    assert ident["result schema"] == "v1: cp, pf, cp_global, cp_mnn, pf_pooling, zz_extra v2"
    with_extra = s.fingerprint(_scorer())
    pm.base._REGISTRY.pop("zz_extra")
    assert "result schema" not in s.identity(_scorer())
    assert s.fingerprint(_scorer()) != with_extra
    pm.register(extra_metric)


def test_the_builtin_fingerprint_has_no_schema_and_depends_on_the_settings():
    s = RunSettings()
    assert schema_identity() == {} and len(s.fingerprint(_scorer())) == 16
    assert s.fingerprint(_scorer()) != RunSettings(baselines=True).fingerprint(_scorer())
    assert s.metric_options() == frozenset() and RunSettings(baselines=True).metric_options() == {"baselines"}


def test_result_columns_put_the_opt_in_columns_after_the_base_and_mask_sources():
    assert RunSettings().result_columns() == RESULT_COLUMNS
    cols = RunSettings(baselines=True, save_maps="m").result_columns(segmenter=True)
    base = len(RESULT_COLUMNS)
    assert cols[:base] == RESULT_COLUMNS
    assert cols[base : base + 2] == ("ref_mask_source", "out_mask_source")
    assert cols[base + 2 : -2] == ("cp_global", "cp_mnn", "cp_mnn_frac", *BUILTIN_METRICS[4]["columns"])
    assert cols[-2:] == ("cp_map", "pf_map")


def test_summary_counts_and_means_per_method():
    s = Summary()
    s.add({"status": "ok", "cp": 0.5, "pf": 0.25}, "a")
    s.add({"status": "ok", "cp": 0.7, "pf": float("nan")}, "a")
    s.add({"status": "no_background", "cp": float("nan"), "pf": None}, "b")
    s.add({"status": "ok", "cp": 1.0, "pf": 1.0}, None)
    s.add({"status": "ok", "cp": 1.0, "pf": "0.5"}, "a")
    assert (s.rows, s.ok) == (5, 4) and s.counts()["statuses"] == {"ok": 4, "no_background": 1}
    lines = s.lines()
    assert lines[1] == "  no_background: 1" and not any(x.strip().startswith("ok:") for x in lines)
    assert lines[-3].split() == ["method", "rows", "n", "CP", "mean", "CP", "n", "PF", "mean", "PF"]
    assert lines[-2].split() == ["a", "3", "3", "0.7333", "1", "0.2500"]
    assert lines[-1].split() == ["b", "1", "0", "-", "0", "-"]


def test_summary_table_has_each_score_column_of_the_run_aligned():
    """The per-method table of a run with --metrics and --baselines: CP, PF, the classic metric and
    each baseline's own column (cp_global, cp_mnn; pf_pooling's six variants are left to the file),
    counted and averaged from the row's cells under those names, NaN skipped, every line as wide as
    the header whatever the column name's length."""
    from masc_engine.jobs.pairs.summary import table_columns

    metrics = [pm.get_metric(n) for n in ("cp", "pf", "clip_i", "cp_global", "cp_mnn", "pf_pooling")]
    cols = table_columns(metrics)
    assert cols == ("cp", "pf", "clip_i", "cp_global", "cp_mnn")
    s = Summary(score_columns=cols)
    s.add({"status": "ok", "cp": 0.5, "pf": 0.1, "clip_i": 80.0, "cp_global": 0.2, "cp_mnn": 0.3}, "method_a")
    s.add({"status": "ok", "cp": 0.7, "pf": 0.3, "clip_i": float("nan"), "cp_global": 0.4, "cp_mnn": 0.5}, "method_a")
    table = s.lines()[-2:]
    head = [w for w in table[0].split() if w.isupper()]
    assert head == [w for c in cols for w in (c.upper(), c.upper())]
    assert table[1].split() == [
        "method_a",
        "2",
        "2",
        "0.6000",
        "2",
        "0.2000",
        "1",
        "80.0000",
        "2",
        "0.3000",
        "2",
        "0.4000",
    ]
    assert len({len(line) for line in table}) == 1
