"""The pair-metric registry: a metric added as docs/architecture.md shows appears in masc-run,
masc-serve, masc-report and masc-eval with no other edit, and the built-in registry keeps the
result schema (and so every existing output's resume fingerprint) of before."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from masc_engine.errors import InputError
from masc_engine.jobs.items import DecodedPair
from masc_engine.jobs.pairs import RESULT_COLUMNS, RowOutcome
from masc_engine.jobs.pairs.columns import BUILTIN_METRICS, result_schema, schema_identity
from masc_engine.runtime import pair_metrics as pm

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "dreambooth"


def _doc_metric() -> str:
    """The worked example of docs/architecture.md, importable from outside the package."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    code = re.search(r"```python\n(# src/masc_engine/runtime/pair_metrics/cp_mean.py\n.*?)```", doc, re.S).group(1)
    return code.replace("from .base import", "from masc_engine.runtime.pair_metrics.base import")


def test_the_builtin_registry_is_result_schema_one():
    """Outputs written before the schema was recorded keep their fingerprint: the built-in metrics
    are schema 1 exactly, which adds nothing to the fingerprint."""
    assert [m.name for m in pm.registered()] == [
        "cp",
        "pf",
        "cp_global",
        "cp_mnn",
        "pf_pooling",
        "clip_i",
        "clip_t",
        "dino",
        "dino_s8",
        "dinov2",
        "clip_score_tm",
    ]
    assert result_schema() == {"version": 1, "metrics": list(BUILTIN_METRICS)}
    assert schema_identity() == {}
    assert schema_identity(pm.metrics_for({"baselines"})) == {}
    assert RESULT_COLUMNS[:8] == (
        "row_index",
        "row_key",
        "cp",
        "pf",
        "status",
        "status_detail",
        "cp_status",
        "pf_status",
    )


def test_metrics_asked_for_by_name_enter_the_schema_only_in_runs_that_compute_them():
    """A run computing clip_i has another schema (and so another fingerprint) than one without it;
    runs without by-name metrics keep schema 1 and their fingerprint."""
    from masc_engine.jobs.pairs import RunSettings

    plain, classic = RunSettings(), RunSettings(metrics=("clip_i", "dino"))
    assert schema_identity(plain.run_metrics()) == {}
    got = schema_identity(classic.run_metrics())["result_schema"]["metrics"]
    assert [m["name"] for m in got] == [m["name"] for m in BUILTIN_METRICS] + ["clip_i", "dino"]
    assert "metrics" not in plain.as_dict() and classic.as_dict()["metrics"] == ("clip_i", "dino")
    assert [m.name for m in classic.run_metrics()] == ["cp", "pf", "clip_i", "dino"]
    assert classic.embedders_needed() == ("clip", "dino")
    assert classic.result_columns()[-4:] == ("clip_i", "clip_i_status", "dino", "dino_status")
    assert plain.result_columns() == RESULT_COLUMNS
    assert RunSettings(metrics=("cp", "pf")) == plain and RunSettings(metrics=("pf", "dino", "clip_i")).metrics == (
        "clip_i",
        "dino",
    )
    with pytest.raises(ValueError, match="--metrics: unknown metric"):
        RunSettings(metrics=("clip_x",))


def test_register_refuses_a_taken_name_or_column_and_a_misnamed_status():
    with pytest.raises(ValueError, match="registered already"):
        pm.register(pm.PairMetric(name="cp", columns=("cp2",), description="", compute=lambda b: []))
    with pytest.raises(ValueError, match="belong to another metric"):
        pm.register(pm.PairMetric(name="cp2", columns=("pf",), description="", compute=lambda b: []))
    with pytest.raises(ValueError, match="cp2_status"):
        pm.PairMetric(name="cp2", columns=("cp2",), status_column="cp2_state", description="", compute=lambda b: [])
    assert "cp2" not in [m.name for m in pm.registered()]


def _outcome() -> RowOutcome:
    e = InputError("x", "y")
    return RowOutcome(DecodedPair(e, e, e, e, "p", "o", row_index=3, cells={}), pm.metrics_for())


def test_row_status_is_the_first_undefined_score_in_registry_order():
    o = _outcome()
    assert o.record()["status"] == "ok" and o.statuses == {"cp_status": "ok", "pf_status": "ok"}
    o.take(pm.get_metric("pf"), {"pf": float("nan"), "status": "no_background", "note": "n"})
    assert o.status == "no_background" and o.notes == ["n"]
    o.take(pm.get_metric("cp"), {"cp": float("nan"), "status": "empty_reference_mask"})
    assert o.status == "empty_reference_mask"
    o.fail(InputError("missing_file", "gone"))
    rec = o.record()
    assert (rec["cp_status"], rec["pf_status"], rec["status_detail"]) == ("missing_file", "missing_file", "gone")


def test_an_entry_point_metric_is_loaded_after_the_builtins(monkeypatch, tmp_path):
    mod = tmp_path / "ep_metric.py"
    mod.write_text(
        "from masc_engine.runtime.pair_metrics.base import PairMetric, register\n"
        "M = register(PairMetric(name='ep_metric', columns=('ep_metric',), description='d', "
        "compute=lambda b: [{'ep_metric': 0.0} for _ in b.items]))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from importlib import metadata

    ep = metadata.EntryPoint(name="ep", value="ep_metric", group="masc_engine.pair_metrics")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [ep] if group == "masc_engine.pair_metrics" else [])
    try:
        pm._load_plugins()
        assert [m.name for m in pm.registered()][-1] == "ep_metric"
    finally:
        pm.base._REGISTRY.pop("ep_metric", None)


SCRIPT = """
import json, sys
sys.path.insert(0, {plugins!r})
import cp_mean  # registers, as the one import line in runtime/pair_metrics/__init__.py would
from click.testing import CliRunner
from masc_engine import Scorer
from masc_engine.jobs.results import SettingsChangedError
from masc_engine.jobs.pairs import RunOptions, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.serve.app import ServeConfig, create_app
from masc_engine.cli import eval_cmd, report_cmd

out = {out!r}
try:
    run_pairs({pairs!r}, Scorer({bundle!r}), {old!r}, options=RunOptions(progress=False))
    refused = None
except SettingsChangedError as e:
    refused = str(e)
summary = run_pairs({pairs!r}, Scorer({bundle!r}), out, options=RunOptions(progress=False))
rows = read_output(out)
doc = create_app(ServeConfig(bundle={bundle!r})).openapi()
props = doc["components"]["schemas"]["ScoreResult"]["properties"]
rep = CliRunner().invoke(report_cmd.main, [out, "--out", out + ".html", "--within-column", "same_subject"])
ev = CliRunner().invoke(eval_cmd.main, ["auc", out, "--within-column", "same_subject", "--score-column", "cp_mean"])
print(json.dumps({{"refused": refused, "columns": list(rows[0]), "row": rows[0], "props": sorted(props),
                   "report": rep.exit_code, "html": open(out + ".html").read() if rep.exit_code == 0 else rep.output,
                   "eval": ev.exit_code, "eval_out": ev.output}}))
"""


@pytest.mark.slow
def test_a_metric_added_as_documented_reaches_every_command(naflex_bundle, tmp_path):
    """docs/architecture.md's cp_mean, registered in a fresh process with no other edit: masc-run
    writes it (and a resume onto an output of the built-in schema refuses, naming the schema),
    masc-serve declares it, masc-report tables it and masc-eval scores with it."""
    from masc_engine import Scorer
    from masc_engine.jobs.pairs import RunOptions, run_pairs

    old = tmp_path / "old.csv"
    run_pairs(EXAMPLES / "pairs.csv", Scorer(naflex_bundle), old, options=RunOptions(progress=False))
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "cp_mean.py").write_text(_doc_metric())
    script = SCRIPT.format(
        plugins=str(plugins),
        out=str(tmp_path / "new.csv"),
        pairs=str(EXAMPLES / "pairs.csv"),
        bundle=str(naflex_bundle),
        old=str(old),
    )
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (
        got["refused"]
        and "result schema: unset -> v1: cp, pf, cp_global, cp_mnn, pf_pooling, cp_mean" in got["refused"]
    ), got["refused"]
    cols = got["columns"]
    assert cols[cols.index("out_mask_coverage") + 1 : cols.index("out_mask_coverage") + 3] == [
        "cp_mean",
        "cp_mean_status",
    ]
    assert -1.0 <= float(got["row"]["cp_mean"]) <= 1.0 and got["row"]["cp_mean_status"] == "ok"
    assert {"cp_mean", "cp_mean_status"} <= set(got["props"])
    assert got["report"] == 0 and "CP_MEAN" in got["html"], got["html"][-2000:]
    assert got["eval"] == 0 and "cp_mean" in got["eval_out"], got["eval_out"]
