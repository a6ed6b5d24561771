"""The classic personalization metrics as opt-in pair metrics (``masc-run --metrics``).

Each reads embeddings an embedder bundle (runtime/embedder.py) made of the pair's images, which
the pairs job computes once per distinct image and call (``MetricBatch.embeddings``), and for
CLIP-T the prompt's text embedding (``MetricBatch.text_embeddings``):

- ``clip_i``: 100 x cosine of the L2-normalised CLIP image projections of the reference and the
  output, no clamp, one reference <-> one output (DreamBench++ ``metrics/clip_score.py``).
- ``clip_t``: 100 x cosine of the output's CLIP image projection and the text projection of the
  prompt as given, the subject name kept (same file).
- ``dino``, ``dino_s8``: 100 x cosine of the DINO ViT-S/16 (ViT-S/8) CLS embeddings after the
  final norm (facebookresearch/dino ``eval_knn.py``; DreamBench++ ``metrics/dino_score.py``).
- ``dinov2``: 100 x cosine of DINOv2-small's CLS after its layer norm (DreamBench++
  ``metrics/dino_score.py``).

A value is NaN only with a status saying why (``no_embedding``: the embedder gave no embedding of
an image or the prompt). Which embedder each metric reads: :data:`EMBEDDER_OF`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .base import MetricBatch, PairMetric, register

__all__ = ["CLASSIC", "EMBEDDER_OF", "CLIP_I", "CLIP_T", "DINO", "DINO_S8", "DINOV2", "cosine100"]

#: The run option of these metrics: each is asked for by name (``RunSettings.metrics``).
CLASSIC = "classic"
#: Metric name -> the embedder (``masc-run --embedder NAME=BUNDLE``) it reads.
EMBEDDER_OF = {"clip_i": "clip", "clip_t": "clip", "dino": "dino", "dino_s8": "dino_s8", "dinov2": "dinov2"}

_DREAMBENCH = "yuangpeng/dreambench_plus dreambench_plus/metrics/"


def cosine100(a: np.ndarray, b: np.ndarray) -> float:
    """100 x the cosine of two ``[D]`` embeddings (each L2-normalised in float64 first), no clamp;
    in [-100, 100]."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(100.0 * np.dot(a64 / np.linalg.norm(a64), b64 / np.linalg.norm(b64)))


def _missing(name: str, what: str) -> dict:
    return {name: float("nan"), "status": "no_embedding", "note": f"{name}: no {what} embedding"}


def _image_pair(name: str) -> Callable[[MetricBatch], list[dict]]:
    """compute for a reference <-> output image metric reading embedder ``EMBEDDER_OF[name]``."""

    def compute(batch: MetricBatch) -> list[dict]:
        table = batch.embeddings.get(EMBEDDER_OF[name], {})
        out = []
        for ref, img in batch.image_keys:
            if ref not in table or img not in table:
                out.append(_missing(name, "image"))
            else:
                out.append({name: cosine100(table[ref], table[img])})
        return out

    return compute


def _clip_t(batch: MetricBatch) -> list[dict]:
    images = batch.embeddings.get("clip", {})
    texts = batch.text_embeddings.get("clip", {})
    out = []
    for it, (_, img) in zip(batch.items, batch.image_keys):
        if img not in images or it.prompt not in texts:
            out.append(_missing("clip_t", "image or prompt"))
        else:
            out.append({"clip_t": cosine100(images[img], texts[it.prompt])})
    return out


def _classic(name: str, compute, encoders: tuple[str, ...], description: str, reference: str) -> PairMetric:
    return register(PairMetric(name=name, columns=(name,), compute=compute, status_column=f"{name}_status",
                               statuses=("no_embedding",), encoders=encoders, option=CLASSIC,
                               description=description, reference=reference, version=1))


CLIP_I = _classic(
    "clip_i", _image_pair("clip_i"), ("clip.image",),
    "100 x cosine of the reference's and the output's CLIP image projections, [-100, 100], no clamp",
    _DREAMBENCH + "clip_score.py")
CLIP_T = _classic(
    "clip_t", _clip_t, ("clip.image", "clip.text"),
    "100 x cosine of the output's CLIP image projection and the prompt's text projection (prompt as given), "
    "[-100, 100], no clamp", _DREAMBENCH + "clip_score.py")
DINO = _classic(
    "dino", _image_pair("dino"), ("dino.image",),
    "100 x cosine of the reference's and the output's DINO ViT-S/16 CLS embeddings, [-100, 100]",
    "facebookresearch/dino eval_knn.py, hubconf.py; " + _DREAMBENCH + "dino_score.py")
DINO_S8 = _classic(
    "dino_s8", _image_pair("dino_s8"), ("dino_s8.image",),
    "100 x cosine of the reference's and the output's DINO ViT-S/8 CLS embeddings, [-100, 100]",
    _DREAMBENCH + "dino_score.py (its default backbone)")
DINOV2 = _classic(
    "dinov2", _image_pair("dinov2"), ("dinov2.image",),
    "100 x cosine of the reference's and the output's DINOv2-small CLS embeddings, [-100, 100]",
    _DREAMBENCH + "dino_score.py (Dinov2Model)")
