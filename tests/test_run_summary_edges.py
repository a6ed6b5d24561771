"""masc-run's console summary and sidecar counts, pinned line by line (jobs/pairs/summary.py).

What these pin: every line of a run that had everything to report (not-ok statuses, the first
five of its duplicate rows, masks, embeddings, a repaired journal, lost workers) in that order;
the per-method table sorted by method whatever order the rows came in, an integer score counted
like a float, each column's count its own; no table when no row named a method; the sidecar's
counts, with ``embeddings`` only when the run had embedders.
"""

from __future__ import annotations

import re

from masc_engine.jobs.pairs.summary import Summary

STATS = {
    "images_encoded": 4,
    "cache_hits": 2,
    "lost_workers": 1,
    "masks_segmented": 3,
    "segmenter_images_encoded": 2,
    "mask_cache_hits": 1,
    "images_embedded": 5,
    "texts_embedded": 6,
    "embedding_cache_hits": 7,
}


def _run() -> Summary:
    s = Summary(score_columns=("cp", "pf"))
    s.add({"status": "ok", "cp": 1, "pf": 0.5}, "zeta")
    s.add({"status": "ok", "cp": 0.5, "pf": float("nan")}, "alpha")
    s.add({"status": "bad_image", "cp": None, "pf": None}, "alpha")
    s.resumed, s.seconds, s.journal_repaired = 1, 1.5, True
    s.duplicates = [(row, 1) for row in range(2, 8)]
    s.take_stats(STATS)
    return s


def test_every_line_of_a_run_with_everything_to_report():
    assert _run().lines() == [
        "rows: 3  ok: 2  not ok: 1  resumed: 1  (1.5s, 4 images encoded, 2 cache hits)",
        "  bad_image: 1",
        "  duplicate input rows: 6 (row=first seen: 2=1, 3=1, 4=1, 5=1, 6=1)",
        "  masks: 3 segmented (2 images through the segmenter), 1 from the cache",
        "  embeddings: 5 images and 6 prompts through the embedders, 7 from the cache",
        "  a torn last line of the previous run's journal was repaired",
        "  1 Ray worker(s) lost; their chunks were scored again by the others",
        "method                         rows   n CP   mean CP   n PF   mean PF",
        "alpha                             2      1    0.5000      0         -",
        "zeta                              1      1    1.0000      1    0.5000",
    ]


def test_a_run_without_methods_has_no_table():
    s = Summary(score_columns=("cp",))
    s.add({"status": "ok", "cp": 0.5}, None)
    assert s.lines() == ["rows: 1  ok: 1  not ok: 0  resumed: 0  (0.0s, 0 images encoded, 0 cache hits)"]


def test_the_sidecar_counts():
    assert _run().counts() == {
        "rows": 3,
        "ok": 2,
        "resumed": 1,
        "statuses": {"ok": 2, "bad_image": 1},
        "duplicate_rows": 6,
        "images_encoded": 4,
        "cache_hits": 2,
        "embeddings": {"images_embedded": 5, "texts_embedded": 6, "embedding_cache_hits": 7},
    }
    plain = Summary()
    plain.take_stats({"images_encoded": 1})
    assert "embeddings" not in plain.counts() and plain.counts()["images_encoded"] == 1


def test_long_metric_names_keep_their_columns_apart():
    """A classic column's labels are wider than CP's: each label and value keeps two spaces from
    its neighbour ("mean CP   n CLIP_I"), and every value sits under the end of its label."""
    s = Summary(score_columns=("cp", "clip_i", "dinov2"))
    s.add({"status": "ok", "cp": 0.5, "clip_i": 93.25, "dinov2": 71.5}, "m")
    head, row = s.lines()[-2:]
    assert (
        head == "method                         rows   n CP   mean CP   n CLIP_I   mean CLIP_I   n DINOV2   mean DINOV2"
    )
    label_ends = [m.end() for m in re.finditer(r"(?:n|mean) [A-Z0-9_]+", head)]
    assert [m.end() for m in re.finditer(r"\S+", row)][2:] == label_ends  # after the method and its rows
