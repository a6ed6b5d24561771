"""The paper's same-forward-pass baselines as opt-in pair metrics (``--baselines``).

Computed by the scorer in the same pass as CP and PF (``Scorer.score_encoded(baselines=True)``,
the rules in ``Scorer._baselines``): the global-embedding CP (paper Table 4), the
mutual-nearest-neighbour CP (Sec. 4.4) and PF with the pooling head over other regions and texts.
NaN where the pooled region or the reference foreground is empty; no status column of their own.
"""

from __future__ import annotations

from .base import MetricBatch, PairMetric, register

__all__ = ["CP_GLOBAL", "CP_MNN", "PF_POOLING"]

BASELINES = "baselines"


def _from_extras(columns: tuple[str, ...]):
    def compute(batch: MetricBatch) -> list[dict]:
        return [{c: res.extras[c] for c in columns} for res in batch.results]
    return compute


def _baseline(name: str, columns: tuple[str, ...], description: str, reference: str,
              encoders: tuple[str, ...] = ("siglip2.vision",)) -> PairMetric:
    return register(PairMetric(name=name, columns=columns, compute=_from_extras(columns), option=BASELINES,
                               encoders=encoders, description=description, reference=reference))


CP_GLOBAL = _baseline(
    "cp_global", ("cp_global",),
    "cosine of the reference's and the output's global pooled embeddings (pooling head, nothing hidden), [-1, 1]",
    "arXiv 2605.22469 Table 4")
CP_MNN = _baseline(
    "cp_mnn", ("cp_mnn", "cp_mnn_frac"),
    "CP counting a reference foreground patch only when its best output match is mutual (else 0), [-1, 1]; "
    "cp_mnn_frac: the share of mutual matches, [0, 1]",
    "arXiv 2605.22469 Sec. 4.4 (our reading; unverified against the paper's code)")
PF_POOLING = _baseline(
    "pf_pooling", tuple(f"pf_{r}_{k}" for r in ("full", "bg", "fg") for k in ("stripped", "unstripped")),
    "PF with the pooling head over all patches, the background or the foreground, against the stripped or "
    "the original prompt, [-1, 1] (pf_bg_stripped is PF)",
    "arXiv 2605.22469 Sec. 4.4", encoders=("siglip2.vision", "siglip2.text"))
