"""What every command does alike (docs/commands.md, "Conventions"): one exit status per kind of
outcome (usage errors 2 as click gives them, every runtime error 1 with one ``Error:`` line, a
missing extra included), progress bars only on a terminal, the random-weights fact as one line,
and ``--help`` naming what the code accepts."""

from __future__ import annotations

import io
import sys

import pytest
from click.testing import CliRunner

from support import EXAMPLES
from masc_engine.cli.eval_cmd import main as eval_main
from masc_engine.cli.export_cmd import main as export_main
from masc_engine.cli.rank_cmd import main as rank_main
from masc_engine.cli.report_cmd import main as report_main
from masc_engine.cli.run_cmd import main as run_main
from masc_engine.cli.serve_cmd import main as serve_main

COMMANDS = {
    "masc-export": export_main,
    "masc-run": run_main,
    "masc-rank": rank_main,
    "masc-report": report_main,
    "masc-eval": eval_main,
    "masc-serve": serve_main,
}


def _runtime_error(res) -> str:
    """Exit status 1 with exactly one ``Error:`` line and no traceback; returns that line."""
    assert res.exit_code == 1, (res.exit_code, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_usage_errors_exit_2(name):
    res = CliRunner().invoke(COMMANDS[name], ["--no-such-option"])
    assert res.exit_code == 2 and "No such option" in res.output, res.output


@pytest.mark.parametrize(
    "args",
    [
        ["masc-run", "{missing}", "--bundle", "{empty}"],
        ["masc-run", "{pairs}", "--bundle", "{missing}"],
        ["masc-run", "{pairs}", "--bundle", "{empty}", "--batch-size", "0"],
        ["masc-rank", "--oracle", "--gallery", "{missing}", "--bundle", "{empty}"],
        ["masc-report", "{missing}"],
        ["masc-eval", "auc", "{missing}", "--within-column", "x"],
        ["masc-serve", "--bundle", "{missing}"],
        ["masc-export", "--out", "{empty}", "--max-batch", "0"],
    ],
)
def test_paths_that_do_not_exist_and_bad_values_are_usage_errors(args, tmp_path):
    """A path named on the command line that does not exist is checked by click before any work,
    in every command alike (status 2), as is a value outside its range."""
    (tmp_path / "empty").mkdir()
    fill = {
        "{missing}": str(tmp_path / "nope"),
        "{empty}": str(tmp_path / "empty"),
        "{pairs}": str(EXAMPLES / "pairs.csv"),
    }
    res = CliRunner().invoke(COMMANDS[args[0]], [fill.get(a, a) for a in args[1:]])
    assert res.exit_code == 2, res.output


def test_runtime_errors_exit_1_in_every_command(tmp_path, monkeypatch):
    empty = tmp_path / "not-a-bundle"
    empty.mkdir()
    junk = tmp_path / "scores.csv"
    junk.write_text("a,b\n1,2\n", encoding="utf-8")
    run = CliRunner().invoke(
        run_main,
        [str(EXAMPLES / "pairs.csv"), "--bundle", str(empty), "--out", str(tmp_path / "s.csv"), "--no-progress"],
    )
    assert "manifest" in _runtime_error(run)
    rank = CliRunner().invoke(
        rank_main,
        [
            "--oracle",
            "--gallery",
            str(EXAMPLES / "gallery.csv"),
            "--bundle",
            str(empty),
            "--out",
            str(tmp_path / "r.csv"),
            "--no-progress",
        ],
    )
    assert "manifest" in _runtime_error(rank)
    pytest.importorskip("matplotlib", reason="masc-report needs the report extra")
    report = CliRunner().invoke(report_main, [str(junk), "--out", str(tmp_path / "r.html")])
    assert "cp" in _runtime_error(report)
    pytest.importorskip("scipy", reason="masc-eval needs the eval extra")
    auc = CliRunner().invoke(eval_main, ["auc", str(junk), "--within-column", "a"])
    _runtime_error(auc)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # as on a machine without TensorRT
    export = CliRunner().invoke(export_main, ["--out", str(empty), "--backend", "tensorrt", "--engines-only"])
    assert "tensorrt" in _runtime_error(export).lower()


@pytest.mark.parametrize(
    "name, args, module, extra",
    [
        ("masc-serve", ["--bundle", "{bundle}"], "uvicorn", "[serve]"),
        ("masc-serve", ["--bundle", "{bundle}"], "fastapi", "[serve]"),
        (
            "masc-eval",
            ["agreement", "{scores}", "--ratings", "{ratings}", "--key", "a", "--rating-column", "r"],
            "krippendorff",
            "[eval]",
        ),
        ("masc-report", ["{scores}", "--out", "{html}"], "matplotlib", "[report]"),
    ],
)  # masc-run's (pyarrow, ray, spacy) are in test_cli_errors.py, on a real bundle
def test_a_missing_extra_exits_1_in_every_command(name, args, module, extra, tmp_path, monkeypatch):
    """The same kind of error, the same status: a missing optional package is a runtime error."""
    (tmp_path / "b").mkdir()
    (tmp_path / "s.csv").write_text("a,cp\n1,0.5\n2,0.7\n3,0.1\n", encoding="utf-8")
    (tmp_path / "h.csv").write_text("a,r\n1,1\n2,3\n3,0\n", encoding="utf-8")
    fill = {
        "{bundle}": str(tmp_path / "b"),
        "{scores}": str(tmp_path / "s.csv"),
        "{html}": str(tmp_path / "r.html"),
        "{ratings}": str(tmp_path / "h.csv"),
    }
    for m in [m for m in sys.modules if m == module or m.startswith((module + ".", "masc_engine.serve"))]:
        monkeypatch.delitem(sys.modules, m)  # imported again (and failing) by the command
    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    res = CliRunner().invoke(COMMANDS[name], [fill.get(a, a) for a in args])
    line = _runtime_error(res)
    assert extra in line and "pip install" in line, line


# ---------------------------------------------------------------------------------- progress bars


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_pairs(bundle, out, stderr, monkeypatch):
    from masc_engine.jobs.pairs import RunOptions, run_pairs
    from masc_engine.runtime.scorer import Scorer

    monkeypatch.setattr(sys, "stderr", stderr)
    run_pairs(str(EXAMPLES / "pairs.csv"), Scorer(str(bundle)), str(out), options=RunOptions(progress=True))
    return stderr.getvalue()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_masc_run_draws_progress_only_on_a_terminal(naflex_bundle, tmp_path, monkeypatch):
    res = CliRunner().invoke(
        run_main, [str(EXAMPLES / "pairs.csv"), "--bundle", str(naflex_bundle), "--out", str(tmp_path / "cli.csv")]
    )
    assert res.exit_code == 0, res.output
    assert "pair/s" not in res.stderr and "\r" not in res.stderr, res.stderr  # not a terminal: no bar
    assert "pair/s" not in _run_pairs(naflex_bundle, tmp_path / "pipe.csv", io.StringIO(), monkeypatch)
    assert "masc-run: 100%" in _run_pairs(naflex_bundle, tmp_path / "tty.csv", _Terminal(), monkeypatch)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_masc_rank_draws_progress_only_on_a_terminal(naflex_bundle, tmp_path, monkeypatch):
    from masc_engine.jobs.rank import run_rank
    from masc_engine.jobs.rank_encoders import EngineEncoder
    from masc_engine.runtime.scorer import Scorer

    res = CliRunner().invoke(
        rank_main,
        [
            "--oracle",
            "--gallery",
            str(EXAMPLES / "gallery.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(tmp_path / "r.csv"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "image/s" not in res.stderr and "\r" not in res.stderr, res.stderr
    encoder = EngineEncoder(Scorer(str(naflex_bundle)))
    for stream, drawn in ((io.StringIO(), False), (_Terminal(), True)):
        monkeypatch.setattr(sys, "stderr", stream)
        run_rank(str(EXAMPLES / "gallery.csv"), encoder, oracle=True, progress=True)
        assert ("masc-rank: 100%" in stream.getvalue()) is drawn, stream.getvalue()


# ------------------------------------------------------------------------ one line, one source


def test_random_weights_are_one_warning_line(naflex_bundle, tmp_path):
    """masc-run and masc-rank say it once, as one line, not as a Python warning into the library."""
    runs = {
        "masc-run": CliRunner().invoke(
            run_main, [str(EXAMPLES / "pairs.csv"), "--bundle", str(naflex_bundle), "--out", str(tmp_path / "s.csv")]
        ),
        "masc-rank": CliRunner().invoke(
            rank_main,
            [
                "--oracle",
                "--gallery",
                str(EXAMPLES / "gallery.csv"),
                "--bundle",
                str(naflex_bundle),
                "--out",
                str(tmp_path / "r.csv"),
            ],
        ),
    }
    for name, res in runs.items():
        assert res.exit_code == 0, res.output
        lines = [ln for ln in res.stderr.splitlines() if "random weights" in ln]
        assert len(lines) == 1 and lines[0].startswith(
            f"WARNING: bundle {naflex_bundle} was exported from random weights (random:tiny-naflex)"
        ), (name, res.stderr)
        assert "RandomWeightsWarning" not in res.stderr and ".py:" not in res.stderr, (name, res.stderr)


def test_masc_run_help_names_every_output_format():
    from masc_engine.jobs.results import FORMATS

    help_text = " ".join(CliRunner().invoke(run_main, ["--help"]).output.split())
    for suffix in FORMATS:
        assert suffix in help_text, suffix


def test_masc_export_ends_with_the_same_line(naflex_bundle, capsys):
    from masc_engine.cli import export_cmd

    export_cmd._warn_random_weights(str(naflex_bundle))
    assert capsys.readouterr().err == (
        f"WARNING: bundle {naflex_bundle} was exported from random weights "
        "(random:tiny-naflex): its scores only test the pipeline\n"
    )


def test_the_api_warning_names_the_callers_line(naflex_bundle):
    """``MaSC(bundle)`` warns as a library should: a RandomWeightsWarning at the caller's line, not
    at the line inside masc_engine that loads the bundle."""
    from masc_engine import MaSC
    from masc_engine.engine.bundle import RandomWeightsWarning

    with pytest.warns(RandomWeightsWarning) as caught:
        MaSC(str(naflex_bundle))
    assert [w.filename for w in caught] == [__file__]
