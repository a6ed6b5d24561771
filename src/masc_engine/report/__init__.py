"""``masc-report``: the self-contained HTML report of a masc-run score file.

:mod:`.page` is the entry point (:func:`build_report`, :func:`write_report`); :mod:`.data` reads
the score file and computes what the page shows; :mod:`.thumbs` makes the thumbnails (and decides
which files may be read); :mod:`.plots` draws the plots with matplotlib's SVG backend, inlined;
:mod:`.render` lays the page out with the Jinja2 template ``templates/report.html.j2``.
Everything public is re-exported here.
"""

from .data import METRICS, extreme_metrics, file_metrics, metric_label
from .page import (
    OUTSIDE,
    POOLED,
    RANDOM_WEIGHTS_BANNER,
    ReportOptions,
    Thumbnails,
    allowed_roots,
    build_report,
    confined,
    extremes,
    image_root,
    load_scores,
    mask_sources,
    method_groups,
    method_stats,
    pixel_limit,
    prepare_rows,
    random_weights,
    status_counts,
    within_cross,
    write_report,
)
from .plots import svg_box_strip, svg_histograms

__all__ = [
    "POOLED",
    "RANDOM_WEIGHTS_BANNER",
    "METRICS",
    "ReportOptions",
    "load_scores",
    "prepare_rows",
    "status_counts",
    "method_groups",
    "method_stats",
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
    "file_metrics",
    "extreme_metrics",
    "metric_label",
]
