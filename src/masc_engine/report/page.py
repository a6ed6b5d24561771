"""``masc-report``: one self-contained HTML file from a ``masc-run`` score file.

The entry points: :func:`build_report` (rows to HTML) and :func:`write_report` (a score file to
an HTML file). The work is split along the page's seams:

- report/data.py: the score file and sidecar read, the rows prepared, the statistics and each
  section's content as plain Python data (no HTML);
- report/thumbs.py: the thumbnails, and which image files the report may read (the score file's
  folder and the ``--image-root`` folders, real paths; runtime/io.py's formats only);
- report/plots.py: the plots, matplotlib SVG inlined in the page;
- report/render.py with templates/report.html.j2 and templates/report.css: the page, laid out by
  a Jinja2 template with autoescape (every piece of text from the data is escaped), the CSS
  inlined, a Content-Security-Policy (``default-src 'none'``): the page makes no request.

The public names of those modules are re-exported here, as they were when this module held them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..jobs import evaluation as ev
from ..jobs.results import write_text_atomic
from .data import (
    METRICS,
    OK,
    POOLED,
    RANDOM_WEIGHTS_BANNER,
    ReportOptions,
    extremes,
    file_metrics,
    load_scores,
    mask_sources,
    method_groups,
    method_stats,
    prepare_rows,
    random_weights,
    status_counts,
    within_cross,
)
from .plots import svg_box_strip, svg_histograms
from .render import render_page
from .thumbs import OUTSIDE, Thumbnails, allowed_roots, confined, image_root, pixel_limit

logger = logging.getLogger(__name__)

__all__ = [
    "POOLED",
    "RANDOM_WEIGHTS_BANNER",
    "METRICS",
    "OK",
    "ReportOptions",
    "load_scores",
    "prepare_rows",
    "status_counts",
    "method_stats",
    "method_groups",
    "within_cross",
    "random_weights",
    "extremes",
    "mask_sources",
    "image_root",
    "allowed_roots",
    "confined",
    "pixel_limit",
    "OUTSIDE",
    "Thumbnails",
    "svg_box_strip",
    "svg_histograms",
    "build_report",
    "write_report",
]


def build_report(
    rows: Sequence[Mapping[str, Any]],
    meta: Mapping[str, Any] | None = None,
    *,
    scores_path: str | Path | None = None,
    options: ReportOptions = ReportOptions(),
    thumbnails: Thumbnails | None = None,
) -> str:
    """The report as one HTML string.

    Args:
        rows: the score file's rows (as :func:`load_scores` returns them; cells may be text).
        meta: the sidecar, or None.
        scores_path: the score file (shown, and the folder ``cp_map`` / ``pf_map`` and, failing
            the sidecar, image paths are resolved against).
        options: see :class:`ReportOptions`.
        thumbnails: a :class:`Thumbnails` (default: one of ``options.thumb_px``).

    Raises:
        ValueError: not a score file (no score column), or a bad ``within_column`` (a
            :class:`~masc_engine.jobs.evaluation.DataError`).
    """
    opts = options
    columns = list(ev.as_table(rows[:1], "scores").columns)
    rows = prepare_rows(rows, file_metrics(columns))
    roots = allowed_roots(scores_path, ([opts.image_root] if opts.image_root else []) + list(opts.image_roots))
    thumbs = thumbnails or Thumbnails(opts.thumb_px, roots=roots)
    if thumbs.roots is None:
        thumbs.roots = roots
    label = str(scores_path) if scores_path is not None else "(rows)"
    return render_page(
        rows,
        meta,
        opts,
        label=label,
        title=opts.title or f"MaSC report: {Path(label).name}",
        columns=columns,
        img_root=Path(opts.image_root) if opts.image_root else image_root(meta, scores_path),
        map_root=Path(scores_path).resolve().parent if scores_path is not None else None,
        thumbs=thumbs,
    )


def write_report(scores_path: str | Path, out: str | Path, options: ReportOptions = ReportOptions()) -> Path:
    """Read a score file (and its sidecar), build the report and write it (atomically).

    Raises:
        MissingDependencyError: matplotlib or Jinja2 (the ``[report]`` extra) is not installed;
            raised before the score file is read.
        TableError: the score file is missing, over ``options.max_scores_bytes`` or unparsable
            (file and line named).
    """
    from .. import extras

    extras.check("matplotlib", "masc-report (its plots)", extra="report")
    extras.check("jinja2", "masc-report (its page)", extra="report")
    rows, meta = load_scores(scores_path, options.max_scores_bytes)
    thumbs = Thumbnails(options.thumb_px)
    text = build_report(rows, meta, scores_path=scores_path, options=options, thumbnails=thumbs)
    out = Path(out)
    write_text_atomic(out, text)
    logger.info("report written to %s (%.0f KiB, %d rows)", out, len(text) / 1024, len(rows))
    if thumbs.outside:
        # The page says it per image; a console that says nothing reads as a complete report.
        logger.warning(
            "%d image or mask file(s) not shown: outside the allowed folders (the score file's folder and "
            "--image-root; add the folder holding them with --image-root)",
            len(thumbs.outside),
        )
    return out
