"""One-line CLI errors that name the fix: a missing optional package names the extra
and its pip command; a missing spaCy model names ``python -m spacy download``. No traceback."""

from __future__ import annotations

import sys

import pytest
from click.testing import CliRunner

from support import EXAMPLES
from masc_engine import extras
from masc_engine.cli.eval_cmd import main as eval_main
from masc_engine.cli.report_cmd import main as report_main
from masc_engine.cli.run_cmd import main as run_main
from masc_engine.errors import MissingDependencyError
from masc_engine.runtime import stripping


def _one_line_error(res) -> str:
    """The run failed with click's ``Error: ...`` and nothing else (no traceback)."""
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    return lines[0]


def test_extra_packages_come_from_the_project_metadata():
    assert extras.extra_packages("parquet") == ["pyarrow>=14"]
    assert set(extras.extra_packages("eval")) >= {"scipy>=1.11", "krippendorff>=0.8", "scikit-learn>=1.4"}
    assert extras.install_hint("parquet") == (
        "pip install 'pyarrow>=14' (masc-engine's [parquet] extra; in a checkout: pip install -e '.[parquet]')"
    )


def test_parquet_without_pyarrow_fails_before_scoring(naflex_bundle, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if pyarrow were not installed
    # (and its submodule too: an earlier test in the process may have imported it)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    out = tmp_path / "s.parquet"
    res = CliRunner().invoke(
        run_main, [str(EXAMPLES / "pairs.csv"), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress"]
    )
    line = _one_line_error(res)
    assert "Parquet needs pyarrow" in line and "pip install 'pyarrow>=14'" in line and "[parquet]" in line
    assert not out.exists() and not (tmp_path / "s.parquet.journal.jsonl").exists()
    with pytest.raises(MissingDependencyError, match=r"\[parquet\] extra"):
        extras.require("pyarrow.parquet", "reading Parquet")


def test_report_and_eval_on_parquet_without_pyarrow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    scores = tmp_path / "s.parquet"
    scores.write_bytes(b"PAR1")
    assert "pip install 'pyarrow>=14'" in _one_line_error(CliRunner().invoke(report_main, [str(scores)]))
    pytest.importorskip("scipy", reason="masc-eval needs the eval extra")
    ratings = tmp_path / "r.csv"
    ratings.write_text("key,r1\na,1\n")
    res = CliRunner().invoke(eval_main, ["agreement", str(scores), "--ratings", str(ratings), "--key", "key"])
    assert "pip install 'pyarrow>=14'" in _one_line_error(res)


def test_spacy_stripper_without_its_model(naflex_bundle, tmp_path, monkeypatch):
    """spacy.load raises OSError [E050] for a pipeline that is not installed: one line, the command."""
    spacy = pytest.importorskip(
        "spacy", reason="spaCy is not installed (the missing-package path is tested in test_stripping.py)"
    )

    def not_installed(name, **kw):
        raise OSError(
            f"[E050] Can't find model '{name}'. It doesn't seem to be a Python package or a valid "
            "path to a data directory."
        )

    monkeypatch.setattr(spacy, "load", not_installed)
    monkeypatch.setattr(stripping, "_PIPELINES", {})
    res = CliRunner().invoke(
        run_main,
        [
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(tmp_path / "s.csv"),
            "--stripper",
            "spacy",
            "--no-progress",
        ],
    )
    line = _one_line_error(res)
    assert line == "Error: spaCy model 'en_core_web_sm' is not installed: python -m spacy download en_core_web_sm"


def test_spacy_stripper_without_spacy(naflex_bundle, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    monkeypatch.setattr(stripping, "_PIPELINES", {})
    res = CliRunner().invoke(
        run_main,
        [
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(tmp_path / "s.csv"),
            "--stripper",
            "spacy",
            "--no-progress",
        ],
    )
    line = _one_line_error(res)
    assert "pip install 'spacy<4,>=3.8'" in line and "python -m spacy download en_core_web_sm" in line


def test_ray_executor_without_ray(naflex_bundle, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    res = CliRunner().invoke(
        run_main,
        [
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(tmp_path / "s.csv"),
            "--executor",
            "ray",
            "--no-progress",
        ],
    )
    line = _one_line_error(res)
    assert "needs Ray" in line and "pip install 'ray>=2.9'" in line and "[ray]" in line


def test_outputs_go_to_a_folder_that_does_not_exist_yet(naflex_bundle, tmp_path):
    """The README's commands write under out/, which a fresh checkout does not have."""
    out = tmp_path / "out" / "sub" / "scores.csv"
    res = CliRunner().invoke(
        run_main, [str(EXAMPLES / "pairs.csv"), "--bundle", str(naflex_bundle), "--out", str(out), "--no-progress"]
    )
    assert res.exit_code == 0, res.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 21
    page = tmp_path / "out2" / "report.html"
    res = CliRunner().invoke(report_main, [str(out), "--out", str(page)])
    assert res.exit_code == 0, res.output
    assert page.stat().st_size > 0
