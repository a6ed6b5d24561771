"""Finer-Personalization Rank (arXiv 2512.19026): identity preservation as retrieval.

Each generated image is a *query* against an identity-labelled *gallery* of real images. The
gallery is ranked by similarity to the query; a gallery image is *relevant* when it shows the
query's identity (``level="identity"``, the default) or its class (``level="class"``, the paper's
category level). Scores: average precision (AP) per query, mean AP (mAP) over queries, and the
CMC top-1 / top-5 rates (share of queries whose first relevant image is at rank <= k), per
method, per class and overall.

Layout: a pure functional core (:func:`average_precision`, :func:`first_correct_rank`,
:func:`rank_query`, :func:`cmc`, :func:`cmc_at`, :func:`summarize`, :func:`cosine_scores`,
:func:`maxcos_scores`), encoders (:class:`EngineEncoder` on a bundle, :class:`OnnxEmbeddingEncoder`
from a manifest), and a thin job (:func:`run_rank`, behind ``masc-rank``).

Tie rule (pessimistic)
----------------------
Gallery items are ranked by descending score; among items with *exactly equal* scores the
irrelevant ones are ranked first, so a tie never helps a query: AP and the rank of the first
correct item are the worst values any ordering of the tied items could give. Why this rule rather
than ranking ties by gallery order (a stable sort by score, as the Market-1501 style evaluations
effectively do through ``argsort``): (1) the result depends only on the scores and the labels,
never on how the gallery CSV happens to be ordered (``masc-rank`` results are identical under any
permutation of the gallery rows, which the tests check); (2) a degenerate encoder that gives every
image the same score gets the lowest AP, not a lucky one; (3) it is exactly defined, whereas
``np.argsort``'s default quicksort is not stable. Where no ties exist it equals every other rule
and ``sklearn.metrics.average_precision_score``; with ties, sklearn (which credits every relevant
item of a tied group with the precision at the group's end) gives a value >= ours, at times above
the AP of every ordering of the tied items. Ties among items of the same
relevance cannot change AP; for the reported ``top1_image`` they fall back to the gallery's
canonical order (sorted by resolved path).

Undefined queries: a query with no relevant gallery item (its identity is absent, or its only
image was the excluded query itself) has no AP: it is reported with status
``no_relevant_gallery_item`` and AP NaN, counted in ``n_undefined`` and left out of mAP and CMC,
never counted as 0.

Similarity
----------
- ``global``: the engine's pooling head run on *all* patches (an all-False key_padding_mask) gives
  one embedding per image; similarity is their cosine. With an encoder manifest, the manifest's
  embedding is used instead.
- ``maxcos``: CP's masked max-cosine between patch tokens: for each query patch (only those under
  the query's foreground mask when the query has one; all patches otherwise), the max cosine to
  any patch of the gallery image; the mean over the query patches. Gallery images use all their
  patches, as CP uses all output patches. Needs a bundle (patch tokens).

Each distinct image path is decoded and encoded once per run (gallery first, in sorted path order,
then the query-only images), so a gallery image's encoding does not depend on the CSV's row order
or on the queries.

Exclusion and the oracle
------------------------
Every gallery item whose image is the query's own file (same resolved path) is removed from that
query's gallery (``n_excluded``), so an image can never retrieve itself. The paper's *oracle*
(``--oracle``) uses the real gallery images themselves as the queries (method ``oracle``), each
against the rest of the gallery (leave-one-out): the upper reference for a generator.

Outputs
-------
Per query, in input order (input columns carried through): ``query_index`` (1-based row),
``query``, ``identity``, ``method``, ``class`` (the queries file's, else the identity's class in
the gallery), ``status``, ``status_detail``, ``ap``, ``first_rank`` (rank of the first correct
gallery image), ``top1``, ``top5`` (0/1), ``n_relevant``, ``n_gallery`` (after exclusion),
``n_excluded``, ``n_query_patches`` (maxcos), ``top1_image``, ``top1_identity``, ``top1_score``.
Summary (:func:`summarize`): ``n_queries, n_scored, n_undefined, n_failed, mAP, top1, top5`` per
(method, class), per method (class ``*``), per class (method ``*``) and overall (``*``, ``*``).
Gallery rows that cannot be used (empty cell, unreadable image) are left out of every query's
gallery and listed in :attr:`RankReport.gallery_failures` (and on the console).

Pluggable encoder manifest
--------------------------
Any image encoder exported to ONNX (a re-identification or species model) can replace SigLIP2 for
``global`` similarity through a small JSON manifest (paths relative to the manifest's folder)::

    {
      "format": "masc-rank-encoder/1",          (optional; this version if given)
      "name": "my-reid-model",                  (optional label)
      "onnx": "reid.onnx",                      ONNX file
      "input": "images",                        input name: float32 [B, 3, H, W] (or [B, H, W, 3])
      "input_size": [256, 128],                 [H, W] fed to the model
      "mean": [0.485, 0.456, 0.406],            per channel, applied after pixel / pixel_scale
      "std": [0.229, 0.224, 0.225],
      "resize": "stretch",                      stretch | center_crop | letterbox
      "output": "embedding",                    output name
      "output_kind": "embedding",               the only kind: [B, D] (cosine is taken, no
                                                normalisation needed inside the model)
      "layout": "NCHW",                         (optional) NCHW (default) | NHWC
      "interpolation": "bilinear",              (optional) bilinear (default) | bicubic | nearest
      "pixel_scale": 255.0,                     (optional) RGB 0..255 divided by this (default 255)
      "sha256": "..."                           (optional) checked on load
    }

``stretch`` resizes to HxW ignoring the aspect ratio; ``center_crop`` resizes the shorter side to
cover HxW and crops the centre; ``letterbox`` fits the image inside HxW and pads with the mean
colour (0 after normalisation). Images are converted to RGB first (Pillow resize, then float32
``(x / pixel_scale - mean) / std``). A graph with a fixed batch dimension is run that many images
at a time. It runs on ONNX Runtime through :class:`~masc_engine.engine.backends.onnxruntime.OrtRunner`.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import InputError, MascEngineError
from ..runtime import heads
from ..runtime.io import load_image, load_mask
from ..runtime.masks import mask_to_patch_grid

SIMILARITIES = ("global", "maxcos")
LEVELS = ("identity", "class")
TOP_KS = (1, 5)
ORACLE_METHOD = "oracle"
ALL = "*"  # the "all methods" / "all classes" label in the summary

GALLERY_REQUIRED = ("image", "identity")
QUERY_REQUIRED = ("image", "identity", "method")

QUERY_RESULT_COLUMNS = ("query_index", "query", "identity", "method", "class", "status", "status_detail", "ap",
                        "first_rank", "top1", "top5", "n_relevant", "n_gallery", "n_excluded", "n_query_patches",
                        "top1_image", "top1_identity", "top1_score", "similarity", "level")
SUMMARY_COLUMNS = ("method", "class", "n_queries", "n_scored", "n_undefined", "n_failed", "mAP", "top1", "top5")


class RankFileError(InputError):
    """A gallery or queries file itself is unusable (missing, no header, missing columns, no
    usable gallery image)."""


class EncoderManifestError(MascEngineError):
    """An encoder manifest (or its ONNX graph) is unusable."""


# ====================================================================== functional core


def _as_arrays(scores, relevant) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    r = np.asarray(relevant, dtype=bool).reshape(-1)
    if s.shape != r.shape:
        raise ValueError(f"scores and relevant differ in length: {s.shape[0]} vs {r.shape[0]}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN; a similarity must be a number (or -inf) for every gallery item")
    return s, r


def ranking(scores, relevant) -> np.ndarray:
    """Gallery indices in rank order under the pessimistic tie rule (module docstring):
    descending score; among equal scores irrelevant before relevant; then by index."""
    s, r = _as_arrays(scores, relevant)
    return np.lexsort((np.arange(s.size), r.astype(np.int8), -s))


def _hit_positions(scores, relevant) -> np.ndarray:
    s, r = _as_arrays(scores, relevant)
    return np.flatnonzero(r[ranking(s, r)]) + 1  # 1-based ranks of the relevant items


def average_precision(scores, relevant) -> float:
    """AP of one query: mean over the relevant items of the precision at their rank.

    Args:
        scores: ``[G]`` similarities (higher = more similar); NaN is refused, -inf allowed.
        relevant: ``[G]`` bool, True for the query's identity.

    Returns:
        AP in ``(0, 1]``; NaN when no item is relevant (undefined, not 0). Ties: pessimistic.

    Raises:
        ValueError: lengths differ, or a score is NaN.
    """
    pos = _hit_positions(scores, relevant)
    if pos.size == 0:
        return float("nan")
    return float(np.mean(np.arange(1, pos.size + 1) / pos))


def first_correct_rank(scores, relevant) -> int | None:
    """1-based rank of the first relevant item (pessimistic ties), None when none is relevant."""
    pos = _hit_positions(scores, relevant)
    return int(pos[0]) if pos.size else None


@dataclass(frozen=True)
class QueryRanking:
    """One query's retrieval result: ``ap`` (NaN if undefined), ``first_rank`` (None if undefined),
    ``n_relevant``, ``n_gallery``, ``top_index`` (gallery index ranked first, None if empty)."""

    ap: float
    first_rank: int | None
    n_relevant: int
    n_gallery: int
    top_index: int | None

    @property
    def defined(self) -> bool:
        return self.first_rank is not None

    def top(self, k: int) -> bool | None:
        return None if self.first_rank is None else self.first_rank <= k


def rank_query(scores, relevant) -> QueryRanking:
    """AP, first correct rank and counts of one query (see :func:`average_precision`)."""
    s, r = _as_arrays(scores, relevant)
    order = ranking(s, r)
    pos = np.flatnonzero(r[order]) + 1
    ap = float(np.mean(np.arange(1, pos.size + 1) / pos)) if pos.size else float("nan")
    return QueryRanking(ap=ap, first_rank=int(pos[0]) if pos.size else None, n_relevant=int(r.sum()),
                        n_gallery=int(s.size), top_index=int(order[0]) if s.size else None)


def cmc(first_ranks: Iterable[int | None], max_rank: int) -> np.ndarray:
    """CMC curve: ``curve[k - 1]`` = share of defined queries whose first correct rank is <= k,
    for k = 1..max_rank. Undefined queries (None) are left out; no defined query gives NaNs."""
    ranks = np.array([r for r in first_ranks if r is not None], dtype=np.int64)
    if ranks.size and ranks.min() < 1:
        raise ValueError("ranks are 1-based")
    if ranks.size == 0:
        return np.full(max_rank, np.nan)
    return np.array([(ranks <= k).mean() for k in range(1, max_rank + 1)])


def cmc_at(first_ranks: Iterable[int | None], k: int) -> float:
    """The CMC value at rank k (top-k accuracy over defined queries; NaN if none)."""
    return float(cmc(first_ranks, k)[k - 1])


def summarize(rows: Sequence[dict], ks: Sequence[int] = TOP_KS) -> list[dict]:
    """mAP and CMC top-k per (method, class), per method (class ``*``), per class (method ``*``)
    and overall (``*``, ``*``).

    Args:
        rows: per-query dicts with ``method``, ``class``, ``status`` and, for scored queries
            (status ``ok``), ``ap`` and ``first_rank``. Status ``no_relevant_gallery_item`` counts
            as undefined; any other non-ok status as failed.

    Returns:
        dicts with ``method, class, n_queries, n_scored, n_undefined, n_failed, mAP`` and
        ``top{k}``; mAP/top-k are NaN for a group without scored queries. The values do not
        depend on the order of ``rows`` (mAP is an exactly rounded sum over the queries).
    """
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        m, c = str(row.get("method", "")), str(row.get("class", ""))
        for key in ((m, c), (m, ALL), (ALL, c), (ALL, ALL)):
            groups[key].append(row)

    def order(key):  # specific groups first, "*" last, otherwise alphabetical
        return tuple((k == ALL, k) for k in key)

    out = []
    for key in sorted(groups, key=order):
        g = groups[key]
        scored = [r for r in g if r["status"] == "ok"]
        n_undef = sum(r["status"] == "no_relevant_gallery_item" for r in g)
        ranks = [int(r["first_rank"]) for r in scored]
        res = {"method": key[0], "class": key[1], "n_queries": len(g), "n_scored": len(scored),
               "n_undefined": n_undef, "n_failed": len(g) - len(scored) - n_undef,
               # fsum: exactly rounded, so the summary does not depend on the order of the queries
               "mAP": math.fsum(float(r["ap"]) for r in scored) / len(scored) if scored else float("nan")}
        for k in ks:
            res[f"top{k}"] = cmc_at(ranks, k) if ranks else float("nan")
        out.append(res)
    return out


def cosine_scores(query: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    """Cosine of one ``[D]`` embedding to each of ``[G, D]`` (float32, ``F.normalize`` eps).

    Computed row by row (an elementwise product summed along D), so a pair's score does not
    depend on the other gallery rows (a matrix product may change the last bits with the shape).
    """
    q = heads.l2_normalize(np.asarray(query, np.float32)[None])[0]
    g = heads.l2_normalize(np.asarray(gallery, np.float32))
    return np.sum(g * q[None], axis=1, dtype=np.float32)


#: Upper bound on the ``[N_query, M_chunk]`` cosine block of :func:`maxcos_scores` (floats).
MAXCOS_BLOCK = 1 << 24


def maxcos_scores(query_tokens: np.ndarray, gallery_tokens: Sequence[np.ndarray],
                  query_keep: np.ndarray | None = None) -> np.ndarray:
    """CP's masked max-cosine of one query against each gallery image.

    Args:
        query_tokens: ``[N, D]`` query patch tokens.
        gallery_tokens: per gallery image ``[M_g, D]`` patch tokens (``M_g >= 1``).
        query_keep: ``[N]`` bool, the query patches to use (its foreground); None = all.

    Returns:
        ``[G] float32``: for each gallery image, the mean over kept query patches of the max
        cosine to any of its patches (equals ``heads.masked_maxcos`` up to float32 rounding).

    Raises:
        ValueError: no query patch is kept.
    """
    q = np.asarray(query_tokens, np.float32)
    if query_keep is not None:
        q = q[np.asarray(query_keep, bool)]
    if q.shape[0] == 0:
        raise ValueError("no query patch is kept")
    qn = heads.l2_normalize(q)
    out = np.empty(len(gallery_tokens), np.float32)
    per_chunk = max(1, MAXCOS_BLOCK // max(1, qn.shape[0]))
    start = 0
    while start < len(gallery_tokens):
        stop, m = start, 0
        while stop < len(gallery_tokens) and (stop == start or m + gallery_tokens[stop].shape[0] <= per_chunk):
            m += gallery_tokens[stop].shape[0]
            stop += 1
        gn = heads.l2_normalize(np.concatenate([np.asarray(t, np.float32) for t in gallery_tokens[start:stop]]))
        sims = qn @ gn.T  # [N, M]
        offsets = np.cumsum([0] + [gallery_tokens[i].shape[0] for i in range(start, stop - 1)])
        best = np.ascontiguousarray(np.maximum.reduceat(sims, offsets, axis=1).T)  # [chunk, N]
        out[start:stop] = np.mean(best, axis=1, dtype=np.float32)
        start = stop
    return out


# ====================================================================== encoders


class EngineEncoder:
    """The engine's SigLIP2 bundle as a rank encoder (patch tokens and the global embedding)."""

    name = "engine"
    supports_tokens = True

    def __init__(self, scorer):
        self.scorer = scorer
        self.fg_threshold = scorer.fg_threshold

    def encode(self, images: Sequence) -> list:
        """``[ImageEncoding]`` (patch tokens and grid) per image."""
        return self.scorer.encode_images(images)

    def global_embeddings(self, encs: Sequence) -> np.ndarray:
        """``[B, D]``: the pooling head on every patch (an all-False key_padding_mask)."""
        pooled, _ = self.scorer.pool_background(encs, [np.zeros(e.tokens.shape[0], bool) for e in encs])
        return pooled

    def embed(self, images: Sequence) -> np.ndarray:
        return self.global_embeddings(self.encode(images))


RESIZE_MODES = ("stretch", "center_crop", "letterbox")
LAYOUTS = ("NCHW", "NHWC")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
MANIFEST_FORMAT = "masc-rank-encoder/1"
MANIFEST_REQUIRED = ("onnx", "input", "input_size", "mean", "std", "resize", "output", "output_kind")


@dataclass(frozen=True)
class EncoderManifest:
    """A parsed encoder manifest (format: module docstring)."""

    onnx: Path
    input: str
    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str
    output: str
    output_kind: str = "embedding"
    layout: str = "NCHW"
    interpolation: str = "bilinear"
    pixel_scale: float = 255.0
    name: str = ""
    sha256: str | None = None


def load_encoder_manifest(path: str | Path) -> EncoderManifest:
    """Read and check an encoder manifest; the ONNX path is resolved against its folder.

    Raises:
        EncoderManifestError: missing file, bad JSON, a missing or invalid key (named).
    """
    path = Path(path)
    if not path.is_file():
        raise EncoderManifestError(f"encoder manifest {path} does not exist")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EncoderManifestError(f"encoder manifest {path}: not valid JSON ({e})") from e
    if not isinstance(d, dict):
        raise EncoderManifestError(f"encoder manifest {path}: expected a JSON object")
    bad = lambda msg: EncoderManifestError(f"encoder manifest {path}: {msg}")  # noqa: E731
    if d.get("format", MANIFEST_FORMAT) != MANIFEST_FORMAT:
        raise bad(f"format {d.get('format')!r} is not {MANIFEST_FORMAT!r}")
    missing = [k for k in MANIFEST_REQUIRED if k not in d]
    if missing:
        raise bad(f"missing key(s) {', '.join(missing)}; required: {', '.join(MANIFEST_REQUIRED)}")
    try:
        size = tuple(int(v) for v in d["input_size"])
        mean = tuple(float(v) for v in d["mean"])
        std = tuple(float(v) for v in d["std"])
        pixel_scale = float(d.get("pixel_scale", 255.0))
    except (TypeError, ValueError) as e:
        raise bad(f"input_size, mean, std and pixel_scale must be numbers ({e})") from e
    if len(size) != 2 or min(size) < 1:
        raise bad(f"input_size must be [H, W] of positive integers, got {d['input_size']!r}")
    if len(mean) != 3 or len(std) != 3 or min(abs(s) for s in std) == 0 or pixel_scale <= 0:
        raise bad("mean and std must have 3 values (RGB), std non-zero; pixel_scale > 0")
    checks = (("resize", RESIZE_MODES), ("layout", LAYOUTS), ("interpolation", INTERPOLATIONS),
              ("output_kind", ("embedding",)))
    defaults = {"layout": "NCHW", "interpolation": "bilinear"}
    for key, allowed in checks:
        v = d.get(key, defaults.get(key))
        if v not in allowed:
            raise bad(f"{key} must be one of {', '.join(allowed)}, got {v!r}")
    onnx_path = Path(d["onnx"])
    if not onnx_path.is_absolute():
        onnx_path = path.resolve().parent / onnx_path
    if not onnx_path.is_file():
        raise bad(f"ONNX file {onnx_path} does not exist")
    return EncoderManifest(onnx=onnx_path, input=str(d["input"]), input_size=size, mean=mean, std=std,
                           resize=d["resize"], output=str(d["output"]), output_kind=d["output_kind"],
                           layout=d.get("layout", "NCHW"), interpolation=d.get("interpolation", "bilinear"),
                           pixel_scale=pixel_scale, name=str(d.get("name", "")), sha256=d.get("sha256"))


def manifest_preprocess(image, m: EncoderManifest) -> np.ndarray:
    """One PIL image -> ``[3, H, W]`` (NCHW) or ``[H, W, 3]`` (NHWC) float32 as the manifest says."""
    from PIL import Image

    resample = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}[m.interpolation]
    im = image.convert("RGB")
    h, w = m.input_size
    mean = np.asarray(m.mean, np.float32)
    std = np.asarray(m.std, np.float32)
    if m.resize == "stretch":
        arr = np.asarray(im.resize((w, h), resample), np.float32)
        x = (arr / np.float32(m.pixel_scale) - mean) / std
    elif m.resize == "center_crop":
        scale = max(h / im.height, w / im.width)
        nw, nh = max(w, round(im.width * scale)), max(h, round(im.height * scale))
        left, top = (nw - w) // 2, (nh - h) // 2
        arr = np.asarray(im.resize((nw, nh), resample).crop((left, top, left + w, top + h)), np.float32)
        x = (arr / np.float32(m.pixel_scale) - mean) / std
    else:  # letterbox: fit inside, pad with the mean colour (0 after normalisation)
        scale = min(h / im.height, w / im.width)
        nw, nh = min(w, max(1, round(im.width * scale))), min(h, max(1, round(im.height * scale)))
        arr = np.asarray(im.resize((nw, nh), resample), np.float32)
        x = np.zeros((h, w, 3), np.float32)
        top, left = (h - nh) // 2, (w - nw) // 2
        x[top:top + nh, left:left + nw] = (arr / np.float32(m.pixel_scale) - mean) / std
    x = x.astype(np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1) if m.layout == "NCHW" else x)


class OnnxEmbeddingEncoder:
    """A user's ONNX image encoder (``[B, D]`` embeddings) described by an encoder manifest.

    Raises (on construction):
        EncoderManifestError: bad manifest, sha256 mismatch, or the graph's input/output do not
            match it (name, rank, dtype, fixed size).
        BackendUnavailableError: the provider is missing.
    """

    supports_tokens = False

    def __init__(self, manifest: str | Path | EncoderManifest, provider: str = "cpu",
                 intra_op_threads: int | None = None, batch_size: int = 8):
        from ..engine.backends.onnxruntime import OrtRunner

        self.manifest = manifest if isinstance(manifest, EncoderManifest) else load_encoder_manifest(manifest)
        m = self.manifest
        if m.sha256:
            digest = hashlib.sha256(m.onnx.read_bytes()).hexdigest()
            if digest != m.sha256.lower():
                raise EncoderManifestError(f"{m.onnx}: sha256 {digest} differs from the manifest's {m.sha256}")
        try:
            self.runner = OrtRunner(str(m.onnx), m.name or m.onnx.stem, provider=provider,
                                    intra_op_threads=intra_op_threads)
        except MascEngineError:
            raise
        except Exception as e:  # onnxruntime's own load errors (bad file, unsupported op)
            raise EncoderManifestError(f"{m.onnx}: onnxruntime cannot load it ({e})") from e
        self.name = m.name or m.onnx.stem
        inputs = {i.name: i for i in self.runner.session.get_inputs()}
        outputs = {o.name for o in self.runner.session.get_outputs()}
        if m.input not in inputs or len(inputs) != 1:
            raise EncoderManifestError(f"{m.onnx}: expected one input named {m.input!r}, graph has "
                                       f"{', '.join(inputs)}")
        if m.output not in outputs:
            raise EncoderManifestError(f"{m.onnx}: no output named {m.output!r}; graph has {', '.join(outputs)}")
        spec = inputs[m.input]
        if spec.type != "tensor(float)" or len(spec.shape) != 4:
            raise EncoderManifestError(f"{m.onnx}: input {m.input!r} must be a 4-D float32 tensor, "
                                       f"is {spec.type} {spec.shape}")
        h, w = m.input_size
        want = (3, h, w) if m.layout == "NCHW" else (h, w, 3)
        for got, exp in zip(spec.shape[1:], want):
            if isinstance(got, int) and got != exp:
                raise EncoderManifestError(f"{m.onnx}: input shape {spec.shape} does not fit input_size "
                                           f"{list(m.input_size)} with layout {m.layout}")
        self.batch_size = spec.shape[0] if isinstance(spec.shape[0], int) and spec.shape[0] > 0 \
            else max(1, int(batch_size))

    def embed(self, images: Sequence) -> np.ndarray:
        """``[B, D] float32`` embeddings of PIL images."""
        out = []
        for start in range(0, len(images), self.batch_size):
            x = np.stack([manifest_preprocess(im, self.manifest) for im in images[start:start + self.batch_size]])
            res = self.runner.session.run([self.manifest.output], {self.manifest.input: x})[0]
            if res.ndim != 2 or res.shape[0] != x.shape[0]:
                raise EncoderManifestError(f"{self.manifest.onnx}: output {self.manifest.output!r} has shape "
                                           f"{res.shape}; output_kind 'embedding' needs [B, D]")
            out.append(np.asarray(res, np.float32))
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


# ====================================================================== the job


def read_table(csv_path: str | Path, required: Sequence[str], what: str) -> tuple[list[str], list[dict]]:
    """Read a gallery or queries CSV (UTF-8, byte-order mark tolerated).

    Raises:
        RankFileError: missing file, no header, or a missing required column (named).
    """
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise RankFileError("missing_file", f"{what} file {csv_path} does not exist")
    with open(csv_path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise RankFileError(f"bad_{what}_file", f"{csv_path} is empty (no header row)")
        missing = [c for c in required if c not in reader.fieldnames]
        if missing:
            raise RankFileError(f"bad_{what}_file", f"{csv_path}: missing column(s) {', '.join(missing)}; "
                                                    f"required: {', '.join(required)}")
        rows = list(reader)
    return list(reader.fieldnames), rows


def _resolve(base: Path, p: str) -> str:
    return os.path.realpath(p if os.path.isabs(p) else base / p)


def _cell(row: dict, key: str) -> str:
    return (row.get(key) or "").strip()


@dataclass
class _Item:
    """A gallery entry or a query: the row, where it came from, and its state."""

    index: int                 # 1-based data row of its CSV
    row: dict
    image: str = ""            # resolved path ("" when the cell is empty)
    mask: str = ""
    identity: str = ""
    cls: str = ""
    method: str = ""
    status: str = "ok"
    detail: str = ""


@dataclass
class RankReport:
    """What :func:`run_rank` did: per-query rows, summary rows, gallery problems, counts."""

    rows: list[dict]
    summary: list[dict]
    gallery_size: int
    gallery_failures: list[dict] = field(default_factory=list)
    images_encoded: int = 0
    seconds: float = 0.0
    similarity: str = "global"
    level: str = "identity"
    encoder: str = ""
    input_columns: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        statuses = Counter(r["status"] for r in self.rows)
        out = [f"queries: {len(self.rows)}  scored: {statuses.get('ok', 0)}  gallery: {self.gallery_size} images  "
               f"similarity: {self.similarity}  level: {self.level}  encoder: {self.encoder}  "
               f"({self.seconds:.1f}s, {self.images_encoded} images encoded)"]
        for status, n in sorted(statuses.items()):
            if status != "ok":
                out.append(f"  {status}: {n}")
        if self.gallery_failures:
            out.append(f"  gallery rows left out: {len(self.gallery_failures)}")
            for g in self.gallery_failures[:10]:
                out.append(f"    row {g['row_index']}: {g['status']} {g['status_detail']}")
        out.append(f"{'method':<24} {'class':<20} {'n':>5} {'undef':>5} {'fail':>5} {'mAP':>7} {'top1':>7} {'top5':>7}")
        for s in self.summary:
            f = lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"  # noqa: E731
            out.append(f"{s['method'][:24]:<24} {s['class'][:20]:<20} {s['n_queries']:>5} {s['n_undefined']:>5} "
                       f"{s['n_failed']:>5} {f(s['mAP']):>7} {f(s['top1']):>7} {f(s['top5']):>7}")
        return out


def _load_all(paths: Iterable[str], loader, workers: int) -> dict:
    def one(p):
        try:
            return p, loader(p)
        except InputError as e:
            return p, e
    with ThreadPoolExecutor(max(1, workers)) as ex:
        return dict(ex.map(one, sorted(set(paths))))


def _encode_paths(paths: list[str], encoder, similarity: str, chunk: int, workers: int,
                  progress) -> tuple[dict, dict, int]:
    """Decode and encode ``paths`` (in the given order, ``chunk`` at a time).

    Returns ``(features, sizes, n_encoded)``: features[path] is a ``[D]`` embedding (global), an
    ImageEncoding (maxcos) or the InputError that stopped it; sizes[path] is ``(H, W)``.
    """
    feats: dict = {}
    sizes: dict = {}
    n = 0
    for start in range(0, len(paths), chunk):
        part = paths[start:start + chunk]
        images = _load_all(part, load_image, workers)
        ok = [p for p in part if not isinstance(images[p], InputError)]
        for p in part:
            if isinstance(images[p], InputError):
                feats[p] = images[p]
            else:
                sizes[p] = (images[p].height, images[p].width)
        if ok:
            if similarity == "maxcos":
                for p, enc in zip(ok, encoder.encode([images[p] for p in ok])):
                    feats[p] = enc
            else:
                for p, e in zip(ok, encoder.embed([images[p] for p in ok])):
                    feats[p] = np.asarray(e, np.float32)
            n += len(ok)
        progress(len(part))
    return feats, sizes, n


def _query_keep(q: _Item, enc, sizes: dict, masks: dict, fg_threshold: float) -> np.ndarray | None:
    """The query's foreground patches for maxcos (None: no mask, all patches).

    Raises:
        InputError: the mask cannot be read, its size differs from the image's
            (``mask_size_mismatch``), it is empty (``empty_query_mask``), or no patch passes the
            threshold (``query_mask_below_threshold``).
    """
    if not q.mask:
        return None
    mask = masks[q.mask]
    if isinstance(mask, InputError):
        raise mask
    h, w = sizes[q.image]
    if mask.shape != (h, w):
        raise InputError("mask_size_mismatch", f"query mask {q.mask} is {mask.shape[1]}x{mask.shape[0]} (WxH) "
                                               f"but its image is {w}x{h}")
    if not mask.any():
        raise InputError("empty_query_mask", f"{q.mask} has no foreground pixel")
    keep = mask_to_patch_grid(mask, enc.grid) > np.float32(fg_threshold)
    if not keep.any():
        raise InputError("query_mask_below_threshold", f"{q.mask}: no patch of the {enc.grid[0]}x{enc.grid[1]} "
                                                       f"grid has mask weight > {fg_threshold}")
    return keep


def run_rank(gallery_csv: str | Path, encoder, *, queries_csv: str | Path | None = None, oracle: bool = False,
             similarity: str = "global", level: str = "identity", use_masks: bool = True,
             io_workers: int = 4, chunk_size: int = 64, progress: bool = False) -> RankReport:
    """Rank a gallery for every query and summarise (the job behind ``masc-rank``).

    Args:
        gallery_csv: columns ``image, identity`` (``mask``, ``class`` optional; others ignored);
            paths relative to the CSV's folder or absolute.
        encoder: :class:`EngineEncoder` or :class:`OnnxEmbeddingEncoder`.
        queries_csv: columns ``image, identity, method`` (``mask``, ``class`` optional; other
            columns carried through); required unless ``oracle``.
        oracle: the gallery images are the queries (method ``oracle``), leave-one-out.
        similarity: ``global`` or ``maxcos`` (needs an encoder with patch tokens).
        level: relevance by ``identity`` or by ``class``.
        use_masks: maxcos restricts the query to its mask's foreground patches when it has one.

    Returns:
        a :class:`RankReport`; per-query rows are in query order, with ``status`` ``ok``,
        ``no_relevant_gallery_item`` (AP undefined) or a failure reason (``missing_file``,
        ``unreadable_image``, ``unreadable_mask``, ``image_too_large``, ``mask_size_mismatch``,
        ``empty_query_mask``, ``query_mask_below_threshold``, ``bad_row``).

    Raises:
        RankFileError: a file is unusable or the gallery has no usable image.
        ValueError: bad option combination.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if similarity == "maxcos" and not getattr(encoder, "supports_tokens", False):
        raise ValueError("maxcos similarity needs patch tokens: use a bundle, not an embedding-only encoder")
    if oracle == (queries_csv is not None):
        raise ValueError("give a queries file, or oracle=True (the gallery images as queries), not both")
    t0 = time.time()

    gallery_csv = Path(gallery_csv)
    g_fields, g_rows = read_table(gallery_csv, GALLERY_REQUIRED, "gallery")
    g_base = gallery_csv.resolve().parent
    gallery: list[_Item] = []
    for i, row in enumerate(g_rows, start=1):
        it = _Item(i, row, identity=_cell(row, "identity"), cls=_cell(row, "class"))
        empty = [c for c in GALLERY_REQUIRED if not _cell(row, c)]
        if empty:
            it.status, it.detail = "bad_row", f"empty column(s): {', '.join(empty)}"
        else:
            it.image = _resolve(g_base, _cell(row, "image"))
            it.mask = _resolve(g_base, _cell(row, "mask")) if _cell(row, "mask") else ""
        gallery.append(it)

    if oracle:
        queries = [_Item(g.index, g.row, image=g.image, mask=g.mask, identity=g.identity, cls=g.cls,
                         method=ORACLE_METHOD, status=g.status, detail=g.detail) for g in gallery]
        q_fields: list[str] = []
    else:
        queries_csv = Path(queries_csv)
        q_fields, q_rows = read_table(queries_csv, QUERY_REQUIRED, "queries")
        q_base = queries_csv.resolve().parent
        queries = []
        for i, row in enumerate(q_rows, start=1):
            it = _Item(i, row, identity=_cell(row, "identity"), cls=_cell(row, "class"), method=_cell(row, "method"))
            empty = [c for c in QUERY_REQUIRED if not _cell(row, c)]
            if empty:
                it.status, it.detail = "bad_row", f"empty column(s): {', '.join(empty)}"
            else:
                it.image = _resolve(q_base, _cell(row, "image"))
                it.mask = _resolve(q_base, _cell(row, "mask")) if _cell(row, "mask") else ""
            queries.append(it)
    if not (similarity == "maxcos" and use_masks):
        for q in queries:
            q.mask = ""

    # Encode: the gallery's images first (sorted), then the query-only ones (sorted).
    g_paths = sorted({g.image for g in gallery if g.status == "ok"})
    q_paths = sorted({q.image for q in queries if q.status == "ok"} - set(g_paths))
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(g_paths) + len(q_paths), unit="image", disable=not progress, desc="masc-rank")
    except ImportError:  # pragma: no cover
        bar = None
    tick = (lambda n: bar.update(n)) if bar is not None else (lambda n: None)
    feats, sizes, n_enc = _encode_paths(g_paths, encoder, similarity, chunk_size, io_workers, tick)
    f2, s2, n2 = _encode_paths(q_paths, encoder, similarity, chunk_size, io_workers, tick)
    feats.update(f2)
    sizes.update(s2)
    if bar is not None:
        bar.close()

    # The usable gallery, in canonical order (resolved path, then row).
    failures = []
    for g in gallery:
        if g.status == "ok" and isinstance(feats[g.image], InputError):
            g.status, g.detail = feats[g.image].reason, feats[g.image].detail
        if g.status != "ok":
            failures.append({"row_index": g.index, "image": g.row.get("image", ""), "status": g.status,
                             "status_detail": g.detail})
    usable = sorted((g for g in gallery if g.status == "ok"), key=lambda g: (g.image, g.index))
    if not usable:
        raise RankFileError("empty_gallery", f"{gallery_csv}: no gallery row has a usable image "
                                             f"({len(failures)} rows failed)")
    g_image = np.array([g.image for g in usable])
    g_label = np.array([g.identity if level == "identity" else g.cls for g in usable])
    if similarity == "global":
        g_emb = np.stack([feats[g.image] for g in usable])
    else:
        g_tok = [feats[g.image].tokens for g in usable]

    classes_of: dict[str, set] = defaultdict(set)
    for g in usable:
        if g.cls:
            classes_of[g.identity].add(g.cls)

    masks = _load_all([q.mask for q in queries if q.mask and q.status == "ok"], load_mask, io_workers)
    fg = getattr(encoder, "fg_threshold", 0.5)
    rows = []
    for q in queries:
        cls = q.cls or (next(iter(classes_of[q.identity])) if len(classes_of.get(q.identity, ())) == 1 else "")
        res = {**q.row, "query_index": q.index, "query": q.row.get("image", ""), "identity": q.identity,
               "method": q.method, "class": cls, "status": q.status, "status_detail": q.detail,
               "ap": float("nan"), "first_rank": None, "top1": None, "top5": None, "n_relevant": None,
               "n_gallery": None, "n_excluded": None, "n_query_patches": None, "top1_image": "",
               "top1_identity": "", "top1_score": float("nan"), "similarity": similarity, "level": level}
        rows.append(res)
        if q.status != "ok":
            continue
        try:
            f = feats[q.image]
            if isinstance(f, InputError):
                raise f
            if level == "class" and not cls:
                raise InputError("bad_row", "level 'class' needs the query's class (class column, or an identity "
                                            "with one class in the gallery)")
            if similarity == "global":
                scores = cosine_scores(f, g_emb)
                n_patches = None
            else:
                keep = _query_keep(q, f, sizes, masks, fg)
                scores = maxcos_scores(f.tokens, g_tok, keep)
                n_patches = int(f.tokens.shape[0] if keep is None else keep.sum())
        except InputError as e:
            res.update(status=e.reason, status_detail=e.detail)
            continue
        label = q.identity if level == "identity" else cls
        include = g_image != q.image
        r = rank_query(scores[include], g_label[include] == label)
        res.update(n_relevant=r.n_relevant, n_gallery=r.n_gallery, n_excluded=int((~include).sum()),
                   n_query_patches=n_patches)
        if r.top_index is not None:
            top = usable[int(np.flatnonzero(include)[r.top_index])]
            res.update(top1_image=top.row.get("image", ""), top1_identity=top.identity,
                       top1_score=float(scores[include][r.top_index]))
        if not r.defined:
            res.update(status="no_relevant_gallery_item",
                       status_detail=f"no gallery image of {level} {label!r} (after excluding the query itself): "
                                     "AP undefined, left out of mAP")
            continue
        res.update(ap=r.ap, first_rank=r.first_rank, top1=int(r.top(1)), top5=int(r.top(5)))

    name = getattr(encoder, "name", "")
    return RankReport(rows=rows, summary=summarize(rows), gallery_size=len(usable), gallery_failures=failures,
                      images_encoded=n_enc + n2, seconds=time.time() - t0, similarity=similarity, level=level,
                      encoder=name, input_columns=list(g_fields if oracle else q_fields))


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    return v


def write_rank_outputs(report: RankReport, out_path: str | Path, summary_path: str | Path) -> None:
    """Per-query rows to ``out_path`` (the input columns carried through, then the results) and
    the summary to ``summary_path`` (CSV, each written atomically)."""
    cols = [c for c in report.input_columns if c not in QUERY_RESULT_COLUMNS] + list(QUERY_RESULT_COLUMNS)
    for path, fields, rows in ((out_path, cols, report.rows), (summary_path, list(SUMMARY_COLUMNS), report.summary)):
        tmp = Path(str(path) + ".partial")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            for row in rows:
                w.writerow({k: _fmt(v) for k, v in row.items()})
        os.replace(tmp, path)
