"""Outputs written through a fixed temporary name (``<out>.partial``) never write through a link
planted there: the link is removed, the temporary created afresh (jobs/results.py
``write_text_atomic``), so a file outside the asked path is never overwritten. masc-report's
page, masc-eval's ``--out`` and masc-run's sidecar share the one writer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from masc_engine.cli.eval_tables_cmd import emit
from masc_engine.jobs.results import write_meta, write_text_atomic
from masc_engine.report import page


def _plant(folder: Path, out_name: str) -> Path:
    """A victim file outside the output and a link to it at the output's temporary name."""
    victim = folder / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, folder / f"{out_name}.partial")
    return victim


def _written(folder: Path, out_name: str, victim: Path, expected: str) -> None:
    out = folder / out_name
    assert victim.read_text() == "precious"
    assert not out.is_symlink() and out.read_text(encoding="utf-8") == expected
    assert not (folder / f"{out_name}.partial").exists() and not (folder / f"{out_name}.partial").is_symlink()


def test_the_atomic_writer_removes_a_planted_link(tmp_path):
    victim = _plant(tmp_path, "t.md")
    write_text_atomic(tmp_path / "t.md", "table ünï\n")
    _written(tmp_path, "t.md", victim, "table ünï\n")


def test_masc_eval_out_does_not_write_through_a_link(tmp_path, capsys):
    victim = _plant(tmp_path, "a.csv")
    emit("a,b\n1,2\n", str(tmp_path / "a.csv"))
    _written(tmp_path, "a.csv", victim, "a,b\n1,2\n")


def test_masc_report_page_does_not_write_through_a_link(tmp_path, monkeypatch):
    pytest.importorskip("jinja2")
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(page, "load_scores", lambda path, max_bytes: ([], {}))
    monkeypatch.setattr(page, "build_report", lambda rows, meta, **kw: "<!DOCTYPE html>\n")
    victim = _plant(tmp_path, "r.html")
    page.write_report(tmp_path / "s.csv", tmp_path / "r.html")
    _written(tmp_path, "r.html", victim, "<!DOCTYPE html>\n")


def test_the_sidecar_does_not_write_through_a_link(tmp_path):
    victim = _plant(tmp_path, "o.csv.meta.json")
    write_meta(tmp_path / "o.csv.meta.json", {"runs": []})
    assert victim.read_text() == "precious"
    assert (tmp_path / "o.csv.meta.json").read_text().startswith("{")
