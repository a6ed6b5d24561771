"""The report's page: report/data.py's sections laid out by the Jinja2 template
``templates/report.html.j2``, with autoescape.

Every value the template prints goes through Jinja2's autoescape (``select_autoescape`` on the
``.html`` / ``.j2`` templates), so text from the data (prompts, keys, paths, metadata) is never
read as markup; the only values the template marks ``safe`` are the plots, SVG written by
matplotlib (report/plots.py), whose text matplotlib's SVG writer escapes. Jinja2 is imported when
the page is rendered (the ``[report]`` extra). The page makes no request of its own: the plots are inlined, images are
downscaled JPEG data URIs (report/thumbs.py), the CSS (``templates/report.css``) is included
by the template into the page's ``<style>``, and a Content-Security-Policy (``default-src 'none'``)
tells the browser to refuse anything else: the report is one self-contained HTML file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import data as dt
from .plots import CROSS_COLOR, STRIP_MAX_POINTS, WITHIN_COLOR, svg_box_strip, svg_histograms
from .thumbs import Thumbnails, row_figures

if TYPE_CHECKING:
    from jinja2 import Environment

#: The folder of the page's template and style sheet (shipped as package data).
TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE = "report.html.j2"


def _finalize(v: Any) -> Any:
    """What ``{{ v }}`` prints before escaping: None and NaN as empty text (a missing cell)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return v


def _full(x: float | None) -> str:
    """A number at full precision (``repr``) for ``data-*`` attributes; ``""`` for None / NaN."""
    return "" if x is None or math.isnan(x) else repr(float(x))


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The page's Jinja2 environment: the package's ``templates`` folder, autoescape on HTML
    templates, undefined names an error (a misspelt field fails the report, not silently).

    Raises:
        MissingDependencyError: Jinja2 (the ``[report]`` extra) is not installed.
    """
    from .. import extras

    jinja2 = extras.require("jinja2", "masc-report (its page)", extra="report")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = dt.fmt_num
    env.filters["full"] = _full
    return env


def _distributions(rows: list[dict], opts: dt.ReportOptions, metrics: Sequence[str]) -> list[str]:
    """Per score, the box + strip plot of its methods (SVG: the template prints it as markup)."""
    return [svg_box_strip(dt.distribution_groups(rows, m, opts), dt.metric_label(m), seed=opts.seed) for m in metrics]


def _within(
    rows: list[dict], opts: dt.ReportOptions, columns: Sequence[str], source: str, metrics: Sequence[str]
) -> dict | None:
    """Per score: its AUC row (``auc``) and its within / cross histograms (``plot``, SVG: the
    template prints it as markup); None when no within column was given."""
    if not opts.within_column:
        return None
    scores = []
    for m in metrics:
        t = dt.within_cross(rows, m, opts, columns, source)
        a, s, lab = t.pooled, t.units.scores, t.units.within
        svg = svg_histograms(
            [("within", s[lab], WITHIN_COLOR), ("cross", s[~lab], CROSS_COLOR)],
            m.upper(),
            title=f"{m.upper()}: within vs cross, {dt.auc_text(a)}",
        )
        scores.append({"metric": m, "auc": a, "plot": svg})
    return {"rule": dt.within_rule(opts), "scores": scores}


def render_page(
    rows: list[dict],
    meta: Mapping[str, Any] | None,
    opts: dt.ReportOptions,
    *,
    label: str,
    title: str,
    columns: Sequence[str],
    img_root: Path | None,
    map_root: Path | None,
    thumbs: Thumbnails,
) -> str:
    """The report of prepared rows (:func:`~masc_engine.report.data.prepare_rows`) as one HTML string.

    Args:
        rows: prepared rows, with every score of :func:`~masc_engine.report.data.file_metrics` of
            ``columns``.
        meta: the sidecar, or None.
        opts: what the report shows.
        label: the score file as shown; also named in errors.
        title: the page title.
        columns: the score file's columns (named in errors).
        img_root: the folder relative image paths are resolved against.
        map_root: the folder relative map and saved-mask paths are resolved against.
        thumbs: the thumbnail maker (its ``roots``: the folders images are read from).

    Raises:
        ValueError: a bad ``within_column`` (a :class:`~masc_engine.jobs.evaluation.DataError`).
    """
    metrics = dt.file_metrics(columns)
    extreme = dt.extreme_metrics(metrics)
    context = {
        "title": title,
        "n_rows": len(rows),
        "model": dt.model_name(meta),
        "opts": opts,
        "confidence_pct": round(100 * opts.confidence),
        "metrics": metrics,
        "extreme_metrics": extreme,
        "ok": dt.OK,
        "banner": dt.RANDOM_WEIGHTS_BANNER if dt.random_weights(meta) else None,
        "summary": dt.summary(label, rows, meta, img_root, thumbs.roots or ()),
        "stats": dt.method_stats(rows, opts, metrics),
        "distributions": _distributions(rows, opts, metrics),
        "strip_max_points": STRIP_MAX_POINTS,
        "within": _within(rows, opts, columns, label, metrics),
        "extremes": dt.extremes_tables(rows, opts, lambda r, m: row_figures(r, m, thumbs, img_root, map_root), extreme),
        "show_maps": any(dt.has_maps(rows, m) for m in extreme),
    }
    return environment().get_template(TEMPLATE).render(context)
