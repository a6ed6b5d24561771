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
- ``clip_score_tm``: torchmetrics' ``CLIPScore`` (Lightning-AI/torchmetrics 1.9.0
  ``functional/multimodal/clip_score.py``, ``_clip_score_update`` and ``clip_score``;
  ``multimodal/clip_score.py`` ``CLIPScore.compute``), with its default checkpoint
  openai/clip-vit-large-patch14 (embedder ``clip_l14``): the per-sample score
  ``100 * cos(E_image, E_text)`` of the output and the prompt as given, NOT clamped. torchmetrics
  clamps the MEAN over the samples, ``max(mean, 0)``, never a sample: a per-row column can only
  carry the unclamped per-sample score (clamping each row would raise the mean of a set with
  negative rows). :func:`clip_score_tm_aggregate` is torchmetrics' number for a set of rows.

A value is NaN only with a status saying why (``no_embedding``: the embedder gave no embedding of
an image or the prompt). Which embedder each metric reads: :data:`EMBEDDER_OF`; each column's
recipe as data: :data:`COLUMN_RECIPES`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import Compute, MetricBatch, PairMetric, register

__all__ = [
    "CLASSIC",
    "EMBEDDER_OF",
    "BACKBONE_OF",
    "COLUMN_RECIPES",
    "backbone_mismatch",
    "CLIP_I",
    "CLIP_T",
    "DINO",
    "DINO_S8",
    "DINOV2",
    "CLIP_SCORE_TM",
    "cosine100",
    "clip_score_tm_aggregate",
]

#: The run option of these metrics: each is asked for by name (``RunSettings.metrics``).
CLASSIC = "classic"
#: Metric name -> the embedder (``masc-run --embedder NAME=BUNDLE``) it reads.
EMBEDDER_OF = {
    "clip_i": "clip",
    "clip_t": "clip",
    "dino": "dino",
    "dino_s8": "dino_s8",
    "dinov2": "dinov2",
    "clip_score_tm": "clip_l14",
}

#: Metric name -> the backbone its column's recipe names (:data:`COLUMN_RECIPES` ``checkpoint``):
#: the embedder bundle's ``family`` and ViT patch size (``architecture.patch_size``). Another
#: backbone would fill the column with another metric's numbers under this one's name.
BACKBONE_OF = {
    "clip_i": ("clip", 32),
    "clip_t": ("clip", 32),
    "dino": ("dino", 16),
    "dino_s8": ("dino", 8),
    "dinov2": ("dinov2", 14),
    "clip_score_tm": ("clip", 14),
}

_DREAMBENCH = "yuangpeng/dreambench_plus dreambench_plus/metrics/"


def backbone_mismatch(metric: str, manifest: dict[str, Any]) -> str | None:
    """Why an embedder bundle cannot fill ``metric``'s column (one clause), or None when its family
    and patch size are those :data:`BACKBONE_OF` names (or ``metric`` names none).

    Args:
        metric: a classic metric's name (``dino``).
        manifest: the embedder bundle's ``manifest.json`` (``family``, ``architecture.patch_size``).
    """
    if metric not in BACKBONE_OF:
        return None
    family, patch = BACKBONE_OF[metric]
    # a manifest is input: a field of another type reads as absent (the bundle reader refuses it later)
    arch = manifest.get("architecture")
    got_patch = arch.get("patch_size") if isinstance(arch, dict) else None
    got_family = manifest.get("family") if isinstance(manifest.get("family"), str) else None
    got_patch = got_patch if isinstance(got_patch, int) and not isinstance(got_patch, bool) else None
    if (got_family, got_patch) == (family, patch):
        return None
    return (
        f"--metrics {metric} reads a {family} embedder with {patch}-pixel patches "
        f"({COLUMN_RECIPES[metric]['checkpoint']}); this bundle is {got_family or 'of no family'} "
        f"with {got_patch or 'unknown'}-pixel patches"
    )


def cosine100(a: np.ndarray, b: np.ndarray) -> float:
    """100 x the cosine of two ``[D]`` embeddings (each L2-normalised in float64 first), no clamp;
    in [-100, 100]."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(100.0 * np.dot(a64 / np.linalg.norm(a64), b64 / np.linalg.norm(b64)))


def _missing(name: str, what: str) -> dict[str, Any]:
    return {name: float("nan"), "status": "no_embedding", "note": f"{name}: no {what} embedding"}


def _image_pair(name: str) -> Compute:
    """compute for a reference <-> output image metric reading embedder ``EMBEDDER_OF[name]``."""

    def compute(batch: MetricBatch) -> list[dict[str, Any]]:
        table = batch.embeddings.get(EMBEDDER_OF[name], {})
        out: list[dict[str, Any]] = []
        for ref, img in batch.image_keys:
            if ref not in table or img not in table:
                out.append(_missing(name, "image"))
            else:
                out.append({name: cosine100(table[ref], table[img])})
        return out

    return compute


def _image_text(name: str) -> Compute:
    """compute for an output <-> prompt metric reading embedder ``EMBEDDER_OF[name]``: the
    per-row ``100 x cosine``, unclamped (CLIP-T; CLIPScore's per-sample score)."""

    def compute(batch: MetricBatch) -> list[dict[str, Any]]:
        images = batch.embeddings.get(EMBEDDER_OF[name], {})
        texts = batch.text_embeddings.get(EMBEDDER_OF[name], {})
        out: list[dict[str, Any]] = []
        for it, (_, img) in zip(batch.items, batch.image_keys):
            if img not in images or it.prompt not in texts:
                out.append(_missing(name, "image or prompt"))
            else:
                out.append({name: cosine100(images[img], texts[it.prompt])})
        return out

    return compute


def clip_score_tm_aggregate(values: Sequence[float] | np.ndarray) -> float:
    """torchmetrics' ``CLIPScore`` of a set of rows from their ``clip_score_tm`` values: the mean
    of the per-sample scores, then ``max(mean, 0)`` (torchmetrics 1.9.0
    ``functional/multimodal/clip_score.py`` ``clip_score``: ``score.mean(0)`` then
    ``torch.max(score, zeros)``; ``CLIPScore.compute``: ``max(score_sum / n_samples, 0)``).

    Args:
        values: per-row ``clip_score_tm`` values in [-100, 100]; NaN rows (no embedding) are left
            out, as rows torchmetrics was never given.

    Returns:
        A float in [0, 100]; NaN when no value is finite (torchmetrics divides by 0 samples).
    """
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    return float("nan") if v.size == 0 else max(float(v.mean()), 0.0)


def _classic(name: str, compute: Compute, encoders: tuple[str, ...], description: str, reference: str) -> PairMetric:
    return register(
        PairMetric(
            name=name,
            columns=(name,),
            compute=compute,
            status_column=f"{name}_status",
            statuses=("no_embedding",),
            encoders=encoders,
            option=CLASSIC,
            description=description,
            reference=reference,
            version=1,
        )
    )


CLIP_I = _classic(
    "clip_i",
    _image_pair("clip_i"),
    ("clip.image",),
    "100 x cosine of the reference's and the output's CLIP image projections, [-100, 100], no clamp",
    _DREAMBENCH + "clip_score.py",
)
CLIP_T = _classic(
    "clip_t",
    _image_text("clip_t"),
    ("clip.image", "clip.text"),
    "100 x cosine of the output's CLIP image projection and the prompt's text projection (prompt as given), "
    "[-100, 100], no clamp",
    _DREAMBENCH + "clip_score.py",
)
DINO = _classic(
    "dino",
    _image_pair("dino"),
    ("dino.image",),
    "100 x cosine of the reference's and the output's DINO ViT-S/16 CLS embeddings, [-100, 100]",
    "facebookresearch/dino eval_knn.py, hubconf.py; " + _DREAMBENCH + "dino_score.py",
)
DINO_S8 = _classic(
    "dino_s8",
    _image_pair("dino_s8"),
    ("dino_s8.image",),
    "100 x cosine of the reference's and the output's DINO ViT-S/8 CLS embeddings, [-100, 100]",
    _DREAMBENCH + "dino_score.py (its default backbone)",
)
DINOV2 = _classic(
    "dinov2",
    _image_pair("dinov2"),
    ("dinov2.image",),
    "100 x cosine of the reference's and the output's DINOv2-small CLS embeddings, [-100, 100]",
    _DREAMBENCH + "dino_score.py (Dinov2Model)",
)
CLIP_SCORE_TM = _classic(
    "clip_score_tm",
    _image_text("clip_score_tm"),
    ("clip_l14.image", "clip_l14.text"),
    "torchmetrics CLIPScore's per-sample score: 100 x cosine of the output's CLIP L/14 image projection and "
    "the prompt's text projection, [-100, 100], unclamped (torchmetrics clamps the mean: clip_score_tm_aggregate)",
    "Lightning-AI/torchmetrics 1.9.0 src/torchmetrics/functional/multimodal/clip_score.py",
)

_CLIP_TEXT = (
    "CLIP BPE of the prompt as given (subject name kept), padded to 77, truncated at 77 keeping "
    "end-of-text; embedding at end-of-text, text projection"
)
#: Each classic column's recipe as data (the sidecar and docs/metrics.md give these): checkpoint,
#: image recipe (runtime/recipes.py ``NAMED_RECIPES`` key), text, embedding, scale, clamp, pairing,
#: the source it follows.
COLUMN_RECIPES: dict[str, dict[str, str | None]] = {
    "clip_i": {
        "checkpoint": "openai/clip-vit-base-patch32",
        "image_recipe": "clip_b32_dreambench",
        "text": None,
        "embedding": "visual_projection(post_layernorm(CLS)), L2-normalised",
        "scale": "100 x cosine",
        "clamp": None,
        "pairing": "one reference <-> one output",
        "follows": CLIP_I.reference,
    },
    "clip_t": {
        "checkpoint": "openai/clip-vit-base-patch32",
        "image_recipe": "clip_b32_dreambench",
        "text": _CLIP_TEXT,
        "embedding": "image and text projections, L2-normalised",
        "scale": "100 x cosine",
        "clamp": None,
        "pairing": "output <-> its prompt",
        "follows": CLIP_T.reference,
    },
    "dino": {
        "checkpoint": "facebook/dino-vits16 (LayerNorm eps 1e-6)",
        "image_recipe": "dino_v1_eval",
        "text": None,
        "embedding": "CLS after the final norm, L2-normalised",
        "scale": "100 x cosine",
        "clamp": None,
        "pairing": "one reference <-> one output",
        "follows": DINO.reference,
    },
    "dino_s8": {
        "checkpoint": "facebook/dino-vits8 (LayerNorm eps 1e-6)",
        "image_recipe": "dino_v1_eval",
        "text": None,
        "embedding": "CLS after the final norm, L2-normalised",
        "scale": "100 x cosine",
        "clamp": None,
        "pairing": "one reference <-> one output",
        "follows": DINO_S8.reference,
    },
    "dinov2": {
        "checkpoint": "facebook/dinov2-small",
        "image_recipe": "dinov2_hf",
        "text": None,
        "embedding": "CLS after the layer norm, L2-normalised",
        "scale": "100 x cosine",
        "clamp": None,
        "pairing": "one reference <-> one output",
        "follows": DINOV2.reference,
    },
    "clip_score_tm": {
        "checkpoint": "openai/clip-vit-large-patch14 (torchmetrics' default model_name_or_path)",
        "image_recipe": "clip_l14_torchmetrics",
        "text": "CLIP BPE of the prompt as given, padded to the longest in the batch (padding=True), attention "
        "mask passed; equal to the engine's for prompts of at most 77 tokens. A longer prompt: torchmetrics "
        "keeps its first 77 ids (end-of-text dropped, the pooled token is then the highest id among them), "
        "the engine keeps end-of-text at position 77: such rows differ",
        "embedding": "get_image_features / get_text_features (pooler_output unwrapped), L2-normalised",
        "scale": "100 x cosine per sample",
        "clamp": "max(mean, 0) on the mean over the rows (clip_score_tm_aggregate), never per row: the column "
        "holds the unclamped per-sample score",
        "pairing": "output <-> its prompt",
        "follows": CLIP_SCORE_TM.reference + " (_clip_score_update, clip_score); "
        "src/torchmetrics/multimodal/clip_score.py (CLIPScore.compute)",
    },
}
