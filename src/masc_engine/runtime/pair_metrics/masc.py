"""MaSC's two scores as registered pair metrics (arXiv 2605.22469, Sec. 3; masc-metric 0.3.0).

The values come from the scorer's fused pass (``Scorer.score_encoded``: CP by ``masked_maxcos``
on the host or the CP graph, PF by the attention-pooling head with the foreground hidden through
its ``key_padding_mask``); these metrics give each its column, its status and the note that says
why a value is undefined.
"""

from __future__ import annotations

import math
from typing import Any

from .base import MetricBatch, PairMetric, register

__all__ = ["CP", "PF"]


def _cp(batch: MetricBatch) -> list[dict[str, Any]]:
    out = []
    for i, (it, res) in enumerate(zip(batch.items, batch.results)):
        row = {"cp": res.cp, "status": "ok"}
        if math.isnan(res.cp):
            name = batch.ref_mask_names[i] if batch.ref_mask_names else "the reference mask"
            if batch.ref_any_foreground and not batch.ref_any_foreground[i]:
                row.update(
                    status="empty_reference_mask", note=f"{name} has no foreground pixel: CP undefined, PF scored"
                )
            else:
                g = it.ref_enc.grid
                row.update(
                    status="reference_mask_below_threshold",
                    note=f"{name}: no patch of the {g[0]}x{g[1]} grid has mask weight > "
                    f"{batch.fg_threshold}: CP undefined, PF scored",
                )
        out.append(row)
    return out


def _pf(batch: MetricBatch) -> list[dict[str, Any]]:
    out = []
    for res in batch.results:
        row = {"pf": res.pf, "status": "ok"}
        if math.isnan(res.pf):
            row.update(status="no_background", note="the output mask hides every patch: PF undefined, CP scored")
        out.append(row)
    return out


CP = register(
    PairMetric(
        name="cp",
        columns=("cp",),
        compute=_cp,
        status_column="cp_status",
        headline=True,
        statuses=("empty_reference_mask", "reference_mask_below_threshold"),
        encoders=("siglip2.vision",),
        label="CP (concept preservation)",
        description="Concept Preservation (masked_maxcos): mean over reference foreground patches of the best "
        "cosine to any output patch, [-1, 1]; NaN when no reference patch is foreground",
        reference="arXiv 2605.22469 Sec. 3.1; masc-metric 0.3.0 masc/metric.py",
    )
)

PF = register(
    PairMetric(
        name="pf",
        columns=("pf",),
        compute=_pf,
        status_column="pf_status",
        headline=True,
        statuses=("no_background",),
        encoders=("siglip2.vision", "siglip2.text"),
        label="PF (prompt following)",
        description="Prompt Following: cosine of the attention-pooled output background (foreground patches in the "
        "key_padding_mask) and the subject-stripped prompt's text embedding, [-1, 1]; NaN when the "
        "output mask hides every patch",
        reference="arXiv 2605.22469 Sec. 3.2; masc-metric 0.3.0 masc/metric.py",
    )
)
