"""``masc-report``: the self-contained HTML report of a masc-run score file.

:mod:`.page` lays out the page (sections, tables, thumbnails); :mod:`.plots` draws its plots with
matplotlib's SVG backend, inlined. Everything public is re-exported here.
"""

from .page import (OUTSIDE, POOLED, RANDOM_WEIGHTS_BANNER, ReportOptions, Thumbnails, allowed_roots, build_report,
                   confined, extremes, image_root, load_scores, method_groups, method_stats, pixel_limit, prepare_rows,
                   random_weights, status_counts, within_cross, write_report)
from .plots import svg_box_strip, svg_histograms

__all__ = ["POOLED", "RANDOM_WEIGHTS_BANNER", "ReportOptions", "load_scores", "prepare_rows", "status_counts",
           "method_groups", "method_stats", "within_cross", "random_weights", "extremes", "image_root",
           "allowed_roots", "confined", "pixel_limit", "OUTSIDE",
           "Thumbnails", "svg_box_strip", "svg_histograms", "build_report", "write_report"]
