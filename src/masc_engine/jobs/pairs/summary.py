"""What a pairs run did, for the console and the sidecar's ``counts``."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from ...runtime.pair_metrics import headline_metrics
from ..results import MASK_COUNTERS


#: The embedders' counters a job reports (jobs/pairs/job.py ``PairsJob.stats``).
EMBEDDING_COUNTERS = ("images_embedded", "texts_embedded", "embedding_cache_hits")


def _method_stats() -> dict:
    return {"n": 0}


def table_columns(metrics) -> tuple[str, ...]:
    """The score columns the per-method table shows for ``metrics`` (PairMetrics), in order: the
    value column of each metric that writes one (CP, PF, the classic metrics, cp_global), and of a
    metric writing several the one named like it (cp_mnn, not cp_mnn_frac); a family of variants
    without such a column (pf_pooling's six) is left to the output file."""
    return tuple(c for m in metrics for c in m.columns if len(m.columns) == 1 or c == m.name)


def _headline_columns() -> tuple[str, ...]:
    return table_columns(headline_metrics())


@dataclass
class Summary:
    """What a run did: row and status counts, per-method means, duplicates, counters, time."""

    rows: int = 0
    ok: int = 0
    resumed: int = 0
    statuses: Counter = field(default_factory=Counter)
    by_method: dict = field(default_factory=lambda: defaultdict(_method_stats))
    duplicates: list = field(default_factory=list)
    seconds: float = 0.0
    images_encoded: int = 0
    cache_hits: int = 0
    lost_workers: int = 0
    journal_repaired: bool = False
    #: The segmenter's counters (jobs/mask_source.py), when the run had one.
    masks: dict = field(default_factory=dict)
    #: The embedders' counters (``images_embedded``, ``texts_embedded``, ``embedding_cache_hits``),
    #: when the run had embedders (the classic metrics).
    embeddings: dict = field(default_factory=dict)
    #: The score columns the per-method table shows, in order (:func:`table_columns` of the run's
    #: metrics: CP and PF, and those a run adds with --metrics or --baselines).
    score_columns: tuple = field(default_factory=_headline_columns)

    def add(self, row: dict, method: str | None) -> None:
        """Count one output row (``method``: its method column's value, or None)."""
        self.rows += 1
        self.statuses[row["status"]] += 1
        self.ok += row["status"] == "ok"
        if method is not None:
            m = self.by_method[method]
            m["n"] += 1
            for k in self.score_columns:
                v = row.get(k)
                if isinstance(v, (int, float)) and not math.isnan(v):
                    m.setdefault(k, []).append(float(v))

    def lines(self) -> list[str]:
        """The console summary, one line per item."""
        out = [
            f"rows: {self.rows}  ok: {self.ok}  not ok: {self.rows - self.ok}  resumed: {self.resumed}  "
            f"({self.seconds:.1f}s, {self.images_encoded} images encoded, {self.cache_hits} cache hits)"
        ]
        for status, n in sorted(self.statuses.items()):
            if status != "ok":
                out.append(f"  {status}: {n}")
        if self.duplicates:
            shown = ", ".join(f"{a}={b}" for a, b in self.duplicates[:5])
            out.append(f"  duplicate input rows: {len(self.duplicates)} (row=first seen: {shown})")
        if self.masks:
            m = self.masks
            out.append(
                f"  masks: {m.get('masks_segmented', 0)} segmented ({m.get('segmenter_images_encoded', 0)} images "
                f"through the segmenter), {m.get('mask_cache_hits', 0)} from the cache"
            )
        if self.embeddings:
            e = self.embeddings
            out.append(
                f"  embeddings: {e.get('images_embedded', 0)} images and {e.get('texts_embedded', 0)} prompts "
                f"through the embedders, {e.get('embedding_cache_hits', 0)} from the cache"
            )
        if self.journal_repaired:
            out.append("  a torn last line of the previous run's journal was repaired")
        if self.lost_workers:
            out.append(f"  {self.lost_workers} Ray worker(s) lost; their chunks were scored again by the others")
        if self.by_method:
            out.extend(self._method_table())
        return out

    def _method_table(self) -> list[str]:
        """Rows and, per score column of the run (:attr:`score_columns`), its count and mean, one line per method."""
        names = self.score_columns
        w = {n: max(6, len(n) + 4) for n in names}  # two spaces at least between "mean PF" and "n CLIP_I"
        head = "".join(f" {'n ' + n.upper():>{w[n]}} {'mean ' + n.upper():>{w[n] + 3}}" for n in names)
        lines = [f"{'method':<28} {'rows':>6}{head}"]
        for method, st in sorted(self.by_method.items()):
            cells = "".join(
                f" {len(st.get(n, ())):>{w[n]}} {(f'{np.mean(st[n]):.4f}' if st.get(n) else '-'):>{w[n] + 3}}"
                for n in names
            )
            lines.append(f"{method:<28} {st['n']:>6}{cells}")
        return lines

    def take_stats(self, stats: dict) -> None:
        """Take an executor's counters (``stats()``) into the summary."""
        self.images_encoded, self.cache_hits = stats.get("images_encoded", 0), stats.get("cache_hits", 0)
        self.lost_workers = stats.get("lost_workers", 0)
        self.masks = {k: stats[k] for k in MASK_COUNTERS if k in stats}
        self.embeddings = {k: stats[k] for k in EMBEDDING_COUNTERS if k in stats}

    def counts(self) -> dict:
        """The counts recorded in ``<out>.meta.json``."""
        return {
            "rows": self.rows,
            "ok": self.ok,
            "resumed": self.resumed,
            "statuses": dict(self.statuses),
            "duplicate_rows": len(self.duplicates),
            "images_encoded": self.images_encoded,
            "cache_hits": self.cache_hits,
            **({"embeddings": dict(self.embeddings)} if self.embeddings else {}),
        }
