"""The paper's same-forward-pass baselines as opt-in pair metrics (``--baselines``).

Each reads the SigLIP2 encodings the scoring call already made (no second vision pass) and the
scorer's pooling head and text tower (``batch.scorer``):

- ``cp_global``: cosine of the global pooled embeddings (pooling head, nothing hidden) of
  reference and output: CP from SigLIP2's global embedding, same backbone (paper Table 4).
- ``cp_mnn``, ``cp_mnn_frac``: CP with a mutual-nearest-neighbour aggregator: a reference
  foreground patch counts with its best cosine only if its best output patch's best
  reference-foreground patch is itself, else 0; the mean over foreground patches, and the share
  of mutual matches. Our reading of Sec. 4.4; unverified against the paper's code.
- ``pf_{full,bg,fg}_{stripped,unstripped}``: PF with the pooling head over all patches, the
  background only (``pf_bg_stripped`` is PF itself) or the foreground only (background hidden),
  against the stripped or the original prompt (Sec. 4.4).

NaN where the pooled region or the reference foreground is empty; no status column of their own.
Intermediates two metrics share (the global pooling of each distinct image) are computed once per
batch (:meth:`MetricBatch.shared`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import heads
from ..masks import cp_keep
from ..pair import ImageEncoding
from .base import Compute, MetricBatch, PairMetric, register

__all__ = ["CP_GLOBAL", "CP_MNN", "PF_POOLING"]

BASELINES = "baselines"


def _global_pool(batch: MetricBatch) -> dict[int, np.ndarray]:
    """Each distinct image's pooled embedding with nothing hidden, by ``id(encoding)`` (in item
    order, reference then output, as one pooling call)."""
    encs: dict[int, ImageEncoding] = {}
    for it in batch.items:
        encs.setdefault(id(it.ref_enc), it.ref_enc)
        encs.setdefault(id(it.out_enc), it.out_enc)
    keys = list(encs)
    full, _ = batch.scorer.pool_background(
        [encs[k] for k in keys], [np.zeros(encs[k].tokens.shape[0], np.bool_) for k in keys]
    )
    return {k: full[j] for j, k in enumerate(keys)}


def _cp_global(batch: MetricBatch) -> list[dict[str, Any]]:
    full = batch.shared("global_pool", _global_pool)
    return [{"cp_global": heads.cosine(full[id(it.ref_enc)], full[id(it.out_enc)])} for it in batch.items]


def _cp_mnn(batch: MetricBatch) -> list[dict[str, Any]]:
    out = []
    for it in batch.items:
        keep = cp_keep(it.ref_weights, batch.fg_threshold)
        if not keep.any():
            out.append({"cp_mnn": float("nan"), "cp_mnn_frac": float("nan")})
            continue
        sims = heads.cosine_matrix(batch.host_tokens(it.ref_enc)[keep], batch.host_tokens(it.out_enc))
        j = sims.argmax(axis=1)
        mutual = sims.argmax(axis=0)[j] == np.arange(sims.shape[0])
        out.append(
            {
                "cp_mnn": float(np.mean(np.where(mutual, sims.max(axis=1), 0.0), dtype=np.float32)),
                "cp_mnn_frac": float(mutual.mean()),
            }
        )
    return out


def _pf_pooling(batch: MetricBatch) -> list[dict[str, Any]]:
    s, items = batch.scorer, batch.items
    full = batch.shared("global_pool", _global_pool)
    bg_kpm = [heads.background_key_padding_mask(it.out_weights, batch.fg_threshold) for it in items]
    pooled_bg, _ = s.pool_background([it.out_enc for it in items], bg_kpm)
    pooled_fg, _ = s.pool_background([it.out_enc for it in items], [~k for k in bg_kpm])
    stripped = [res.extras["prompt_text"] for res in batch.results]
    texts = sorted(set(stripped) | {it.prompt for it in items})
    emb, _ = s.encode_texts(texts)
    row = {t: i for i, t in enumerate(texts)}
    out = []
    for i, it in enumerate(items):
        d = {}
        for region, vec in (("full", full[id(it.out_enc)]), ("bg", pooled_bg[i]), ("fg", pooled_fg[i])):
            for kind, text in (("stripped", stripped[i]), ("unstripped", it.prompt)):
                d[f"pf_{region}_{kind}"] = (
                    float("nan") if not np.isfinite(vec).all() else heads.cosine(vec, emb[row[text]])
                )
        out.append(d)
    return out


def _baseline(
    name: str,
    columns: tuple[str, ...],
    compute: Compute,
    description: str,
    reference: str,
    encoders: tuple[str, ...] = ("siglip2.vision", "siglip2.pool"),
) -> PairMetric:
    return register(
        PairMetric(
            name=name,
            columns=columns,
            compute=compute,
            option=BASELINES,
            encoders=encoders,
            description=description,
            reference=reference,
        )
    )


CP_GLOBAL = _baseline(
    "cp_global",
    ("cp_global",),
    _cp_global,
    "cosine of the reference's and the output's global pooled embeddings (pooling head, nothing hidden), [-1, 1]",
    "arXiv 2605.22469 Table 4",
)
CP_MNN = _baseline(
    "cp_mnn",
    ("cp_mnn", "cp_mnn_frac"),
    _cp_mnn,
    "CP counting a reference foreground patch only when its best output match is mutual (else 0), [-1, 1]; "
    "cp_mnn_frac: the share of mutual matches, [0, 1]",
    "arXiv 2605.22469 Sec. 4.4 (our reading; unverified against the paper's code)",
    encoders=("siglip2.vision",),
)
PF_POOLING = _baseline(
    "pf_pooling",
    tuple(f"pf_{r}_{k}" for r in ("full", "bg", "fg") for k in ("stripped", "unstripped")),
    _pf_pooling,
    "PF with the pooling head over all patches, the background or the foreground, against the stripped or "
    "the original prompt, [-1, 1] (pf_bg_stripped is PF)",
    "arXiv 2605.22469 Sec. 4.4",
    encoders=("siglip2.vision", "siglip2.pool", "siglip2.text"),
)
