"""``masc-report``: the self-contained HTML report of a masc-run score file.

:mod:`.page` lays out the page (sections, tables, thumbnails); :mod:`.plots` draws its plots with
matplotlib's SVG backend, inlined. Everything public is re-exported here.
"""

from .page import (POOLED, ReportOptions, Thumbnails, build_report, extremes, image_root, load_scores,
                   method_stats, prepare_rows, status_counts, within_cross_auc, within_labels, write_report)
from .plots import svg_box_strip, svg_histograms

__all__ = ["POOLED", "ReportOptions", "load_scores", "prepare_rows", "status_counts", "method_stats",
           "within_labels", "within_cross_auc", "extremes", "image_root", "Thumbnails", "svg_box_strip",
           "svg_histograms", "build_report", "write_report"]
