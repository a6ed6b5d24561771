"""masc-report's page is rendered by a Jinja2 template with autoescape: every piece of text from
the score file and its sidecar (method names, prompts, keys, statuses, paths, metadata, the title)
reaches the page as text, never as markup; the style sheet is the package's own file, inlined; and
the page's score columns come from one constant, report/data.py ``METRICS``.
"""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from masc_engine import report as rp
from masc_engine.report import data as report_data
from masc_engine.report import render

HOSTILE = "<script>alert(1)</script> \"double\" 'single' & more"


class _Page(HTMLParser):
    """The elements, attribute values and text of a page, as a browser's parser reads them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs

    def handle_data(self, data):
        self.text.append(data)


def _parse(text: str) -> _Page:
    p = _Page()
    p.feed(text)
    p.close()
    return p


def _rows(n: int = 4) -> list[dict]:
    return [
        {
            "key": f"{HOSTILE} key {i}",
            "subject": HOSTILE,
            "method": HOSTILE if i % 2 else "plain",
            "prompt": HOSTILE,
            "status": "ok" if i else HOSTILE,
            "within": "true" if i % 2 else "false",
            "ref_image": f"{HOSTILE}.png",
            "out_image": "",
            "cp": 0.5 + 0.1 * i,
            "pf": 0.1 * i,
        }
        for i in range(n)
    ]


def _page(tmp_path: Path) -> str:
    meta = {
        "source_model": HOSTILE,
        "bundle": HOSTILE,
        "input": str(tmp_path / "pairs.csv"),
        "settings": {HOSTILE: HOSTILE, "nested": {HOSTILE: HOSTILE}},
        "runtime_versions": {"masc_engine": HOSTILE},
    }
    opts = rp.ReportOptions(title=HOSTILE, within_column="within", top_k=2, n_resamples=20)
    return rp.build_report(_rows(), meta, scores_path=tmp_path / "scores.csv", options=opts)


def test_text_from_the_data_is_escaped_everywhere(tmp_path):
    text = _page(tmp_path)
    page = _parse(text)
    # no markup came from the data: the only script-like strings are escaped text
    assert "script" not in page.tags and "<script>" not in text
    assert HOSTILE not in text
    # and the parser reads the original strings back: as element text and as attribute values
    texts = "".join(page.text)
    for shown in (HOSTILE, f"{HOSTILE} key 1", f"{HOSTILE}={HOSTILE}"):
        assert shown in texts, shown
    assert ("data-method", HOSTILE) in page.attrs and ("data-status", HOSTILE) in page.attrs
    assert ("title", str(tmp_path / f"{HOSTILE}.png")) in page.attrs  # the image's path, on hover
    assert [html.unescape(t) for t in re.findall(r"<title>([^<>]*)</title>", text)] == [HOSTILE]
    # each of the markup characters is escaped in element text and in attribute values alike
    raw = re.findall(r'data-method="([^"]*)"', text)
    assert any(html.unescape(v) == HOSTILE for v in raw)
    for v in raw:
        assert not set(v) & set("<>\"'") and "& " not in v, v


def test_the_template_environment_autoescapes_html_templates():
    env = render.environment()
    assert env.autoescape(render.TEMPLATE) is True and env.autoescape("report.css") is False
    assert Path(env.get_template(render.TEMPLATE).filename).parent == render.TEMPLATES  # the package's folder


def test_the_style_sheet_is_the_packaged_file_inlined(tmp_path):
    text = _page(tmp_path)
    css = (render.TEMPLATES / "report.css").read_text(encoding="utf-8")
    style = re.findall(r"<style>(.*?)</style>", text, re.DOTALL)
    assert len(style) == 1 and style[0].strip() == css.strip()
    assert "<link" not in text and "@import" not in css


def test_the_score_columns_follow_metrics(tmp_path, monkeypatch):
    """Every table and plot of the page is drawn per score of ``file_metrics`` (METRICS, then the
    file's other metric columns): with one score, the other has no column, no mean, no AUC and no
    best / worst table."""
    both = _page(tmp_path)
    assert 'colspan="6"' in _page_without_rows(tmp_path)  # #, pair, CP, PF, prompt, images
    assert both.count("<h3>Best 2 by ") == 2 and 'data-metric="pf"' in both and '<th class="num">PF</th>' in both
    monkeypatch.setattr(report_data, "file_metrics", lambda columns: ("cp",))
    text = _page(tmp_path)
    assert 'data-metric="cp" data-value=' in text and 'data-metric="cp" data-auc=' in text
    assert 'data-metric="pf"' not in text and "mean PF" not in text and '<th class="num">PF</th>' not in text
    assert text.count("<h3>Best 2 by ") == 1 and text.count("<h3>Worst 2 by ") == 1
    assert 'colspan="5"' in _page_without_rows(tmp_path)


def _page_without_rows(tmp_path: Path) -> str:
    return rp.build_report(
        [{"cp": "", "pf": "", "status": "failed"}],
        None,
        scores_path=tmp_path / "s.csv",
        options=rp.ReportOptions(n_resamples=10),
    )


def test_not_a_score_file_names_the_metrics():
    with pytest.raises(ValueError, match="no cp/pf columns"):
        rp.prepare_rows([{"a": 1}])


def test_the_templates_ship_as_package_data():
    """A wheel holds the template and the style sheet: pyproject.toml's package data names every
    file of report/templates (checked from the pyproject: building a wheel takes too long here)."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    root = Path(__file__).resolve().parents[1]
    with open(root / "pyproject.toml", "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["masc_engine"]
    files = sorted(p.relative_to(root / "src" / "masc_engine").as_posix() for p in render.TEMPLATES.iterdir())
    assert {"report/templates/report.html.j2", "report/templates/report.css"} <= set(files)
    assert all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)


def test_without_jinja2_masc_report_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    import sys

    from click.testing import CliRunner

    from masc_engine.cli.report_cmd import main as report_main

    scores = tmp_path / "s.csv"
    scores.write_text("a,cp\n1,0.5\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "jinja2", None)  # as if it were not installed
    res = CliRunner().invoke(report_main, [str(scores), "--out", str(tmp_path / "r.html")])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert "jinja2" in lines[0] and "[report]" in lines[0] and "pip install" in lines[0]
    assert not (tmp_path / "r.html").exists()
