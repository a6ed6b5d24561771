"""Finer-Personalization Rank (arXiv 2512.19026): identity preservation as retrieval.

Each generated image is a *query* against an identity-labelled *gallery* of real images. The
gallery is ranked by similarity to the query; a gallery image is *relevant* when it shows the
query's identity (``level="identity"``, the default) or its class (``level="class"``, the paper's
category level). Scores: average precision (AP) per query, mean AP (mAP) over queries, and the
CMC top-1 / top-5 rates (share of queries whose first relevant image is at rank <= k), per
method, per class and overall.

The job is a client of the job layer: tables read by :func:`~masc_engine.jobs.tables.read_table`,
paths resolved by :func:`~masc_engine.jobs.tables.resolve_path`, files decoded by
:func:`~masc_engine.jobs.loading.load_all`. The metrics are :mod:`masc_engine.metrics.retrieval`
(AP, CMC, the tie rule); the encoders, similarities and the encoder manifest format are
:mod:`masc_engine.jobs.rank_encoders`.

Each distinct image path is decoded and encoded once per run (gallery first, in sorted path order,
then the query-only images), so a gallery image's encoding does not depend on the CSV's row order
or on the queries.

Exclusion and the oracle:
Every gallery item whose image is the query's own file (same resolved path) is removed from that
query's gallery (``n_excluded``), so an image can never retrieve itself. The paper's *oracle*
(``--oracle``) uses the real gallery images themselves as the queries (method ``oracle``), each
against the rest of the gallery (leave-one-out): the upper reference for a generator.

Outputs:
Per query, in input order (input columns carried through): ``query_index`` (1-based row),
``query``, ``identity``, ``method``, ``class`` (the queries file's, else the identity's class in
the gallery), ``status``, ``status_detail``, ``ap``, ``first_rank`` (rank of the first correct
gallery image), ``top1``, ``top5`` (0/1), ``n_relevant``, ``n_gallery`` (after exclusion),
``n_excluded``, ``n_query_patches`` (maxcos), ``top1_image``, ``top1_identity``, ``top1_score``.
Summary (:func:`summarize`): ``n_queries, n_scored, n_undefined, n_failed, mAP, top1, top5`` per
(method, class), per method (class ``*``), per class (method ``*``) and overall (``*``, ``*``).
Gallery rows that cannot be used (empty cell, unreadable image) are left out of every query's
gallery and listed in :attr:`RankReport.gallery_failures` (and on the console).

Query masks from a segmenter (``segmenter=``, ``masc-rank --segmenter``): under ``maxcos`` with
masks, a query without a mask gets the segmenter's mask of its image, prompted by its
``object_name`` cell, else its class (the ``class`` cell, or its identity's one class in the
gallery; runtime/segmenter.py, the recipe masc-run uses); one with neither gets
``no_mask_source``. The per-query rows then say where each mask came from
(``mask_source``: ``file``, ``segmenter``, or empty for a query without one).
"""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..metrics.retrieval import rank_query, summarize
from ..runtime.io import load_image, load_mask
from ..runtime.masks import DEFAULT_FG_THRESHOLD, MaskPolicy, cp_keep, mask_to_patch_grid
from .loading import load_all
from .rank_encoders import cosine_scores, maxcos_scores
from .tables import TableError, cell, read_table, resolve_path, write_table


SIMILARITIES = ("global", "maxcos")
LEVELS = ("identity", "class")
ORACLE_METHOD = "oracle"

GALLERY_REQUIRED = ("image", "identity")
QUERY_REQUIRED = ("image", "identity", "method")

QUERY_RESULT_COLUMNS = (
    "query_index",
    "query",
    "identity",
    "method",
    "class",
    "status",
    "status_detail",
    "ap",
    "first_rank",
    "top1",
    "top5",
    "n_relevant",
    "n_gallery",
    "n_excluded",
    "n_query_patches",
    "top1_image",
    "top1_identity",
    "top1_score",
    "similarity",
    "level",
)
SUMMARY_COLUMNS = ("method", "class", "n_queries", "n_scored", "n_undefined", "n_failed", "mAP", "top1", "top5")


class RankFileError(TableError):
    """A gallery or queries file itself is unusable (missing, no header, missing columns, no
    usable gallery image)."""


@dataclass
class _Item:
    """A gallery entry or a query: the row, where it came from, and its state."""

    index: int  # 1-based data row of its CSV
    row: dict
    image: str = ""  # resolved path ("" when the cell is empty)
    mask: str = ""
    identity: str = ""
    cls: str = ""
    method: str = ""
    status: str = "ok"
    detail: str = ""
    mask_source: str = ""  # "file", "segmenter" or "" (no mask)


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
    #: Result columns besides :data:`QUERY_RESULT_COLUMNS` (``mask_source`` with a segmenter).
    extra_columns: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        statuses = Counter(r["status"] for r in self.rows)
        out = [
            f"queries: {len(self.rows)}  scored: {statuses.get('ok', 0)}  gallery: {self.gallery_size} images  "
            f"similarity: {self.similarity}  level: {self.level}  encoder: {self.encoder}  "
            f"({self.seconds:.1f}s, {self.images_encoded} images encoded)"
        ]
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
            out.append(
                f"{s['method'][:24]:<24} {s['class'][:20]:<20} {s['n_queries']:>5} {s['n_undefined']:>5} "
                f"{s['n_failed']:>5} {f(s['mAP']):>7} {f(s['top1']):>7} {f(s['top5']):>7}"
            )
        return out


def _read_items(path: str | Path, required: Sequence[str], what: str) -> tuple[list[str], list["_Item"]]:
    """A gallery or queries table as items: cells parsed, paths resolved (symbolic links too, so
    a query's own file is recognised in the gallery), empty required cells flagged ``bad_row``."""
    try:
        t = read_table(path, required, what, extra_fields="ignore")
    except TableError as e:
        raise RankFileError(e.reason, e.detail) from None
    base = Path(path).resolve().parent
    items = []
    for i, row in enumerate(t.rows, start=1):
        it = _Item(i, row, identity=cell(row, "identity"), cls=cell(row, "class"), method=cell(row, "method"))
        empty = [c for c in required if not cell(row, c)]
        if empty:
            it.status, it.detail = "bad_row", f"empty column(s): {', '.join(empty)}"
        elif refused := [c for c in ("image", "mask") if "\0" in cell(row, c)]:
            it.status, it.detail = (
                "bad_path",
                f"{refused[0]}: the path holds a NUL byte: the operating system refuses it",
            )
        else:
            it.image = resolve_path(base, cell(row, "image"), real=True)
            it.mask = resolve_path(base, cell(row, "mask"), real=True) if cell(row, "mask") else ""
            it.mask_source = "file" if it.mask else ""
        items.append(it)
    return t.columns, items


def _encode_paths(
    paths: list[str], encoder, similarity: str, chunk: int, workers: int, progress
) -> tuple[dict, dict, int]:
    """Decode and encode ``paths`` (in the given order, ``chunk`` at a time).

    Returns ``(features, sizes, n_encoded)``: features[path] is a ``[D]`` embedding (global), an
    ImageEncoding (maxcos) or the InputError that stopped it; sizes[path] is ``(H, W)``.
    """
    feats: dict = {}
    sizes: dict = {}
    n = 0
    for start in range(0, len(paths), chunk):
        part = paths[start : start + chunk]
        images = load_all(part, load_image, workers)
        ok = [p for p in part if not isinstance(images[p], InputError)]
        for p in part:
            im = images[p]
            if isinstance(im, InputError):
                feats[p] = im
            else:
                sizes[p] = (im.height, im.width)
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
            (``mask_size_mismatch``, ``mask_orientation_mismatch``: runtime/masks.py
            :class:`MaskPolicy`), it is empty (``empty_query_mask``), or no patch passes the
            threshold (``query_mask_below_threshold``).
    """
    if not q.mask:
        return None
    mask = masks[q.mask]
    if isinstance(mask, InputError):
        raise mask
    MaskPolicy().check(sizes[q.image], mask.shape, "query", q.mask)
    if not mask.any():
        raise InputError("empty_query_mask", f"{q.mask} has no foreground pixel")
    keep = cp_keep(mask_to_patch_grid(mask, enc.grid), fg_threshold)
    if not keep.any():
        raise InputError(
            "query_mask_below_threshold",
            f"{q.mask}: no patch of the {enc.grid[0]}x{enc.grid[1]} grid has mask weight > {fg_threshold}",
        )
    return keep


def _segment_queries(queries: list[_Item], segmenter, classes_of: dict, workers: int) -> dict:
    """The segmenter's masks of the queries that have none (``{mask key: mask or InputError}``;
    each such query's ``mask`` becomes its key): prompted by the ``object_name`` cell, else the
    query's class (its ``class`` cell, or its identity's one class in the gallery); each (image,
    subject) segmented once."""
    need: dict[tuple[str, str], list[_Item]] = defaultdict(list)
    for q in queries:
        if q.status == "ok" and not q.mask:
            one = classes_of.get(q.identity, ())
            subject = cell(q.row, "object_name") or q.cls or (next(iter(one)) if len(one) == 1 else "")
            need[(q.image, subject)].append(q)
    images = load_all({p for p, _ in need}, load_image, workers)
    out: dict = {}
    for (path, subject), qs in need.items():
        key = f"segmenter mask of {path} ({subject or 'no subject'})"
        im = images[path]
        if isinstance(im, InputError):
            out[key] = im
        elif not subject.strip():
            out[key] = InputError(
                "no_mask_source", f"query {path} has no mask and no object_name or class to prompt the segmenter with"
            )
        else:
            try:
                out[key] = segmenter.segment([im], [subject])[0].mask
            except InputError as e:
                out[key] = InputError("mask_prompt_too_long", f"{subject!r} as the segmenter's prompt: {e.detail}")
        for q in qs:
            q.mask, q.mask_source = key, "segmenter"
    return out


def _check_options(encoder, queries_csv, oracle: bool, similarity: str, level: str) -> None:
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    if similarity == "maxcos" and not getattr(encoder, "supports_tokens", False):
        raise ValueError("maxcos similarity needs patch tokens: use a bundle, not an embedding-only encoder")
    if oracle == (queries_csv is not None):
        raise ValueError("give a queries file, or oracle=True (the gallery images as queries), not both")


def _read_queries(
    gallery_csv, queries_csv, oracle: bool, query_masks: bool
) -> tuple[list[_Item], list[_Item], list[str]]:
    """``(gallery, queries, input_columns)``: with ``oracle`` the gallery's items are the queries
    (method ``oracle``); without ``query_masks`` the queries' masks are dropped."""
    g_fields, gallery = _read_items(gallery_csv, GALLERY_REQUIRED, "gallery")
    if oracle:
        queries = [
            _Item(
                g.index,
                g.row,
                image=g.image,
                mask=g.mask,
                identity=g.identity,
                cls=g.cls,
                method=ORACLE_METHOD,
                status=g.status,
                detail=g.detail,
            )
            for g in gallery
        ]
        q_fields: list[str] = []
    else:
        q_fields, queries = _read_items(queries_csv, QUERY_REQUIRED, "queries")
    if not query_masks:
        for q in queries:
            q.mask, q.mask_source = "", ""
    return gallery, queries, list(g_fields if oracle else q_fields)


def _encode_all(
    gallery: list[_Item], queries: list[_Item], encoder, similarity: str, chunk: int, workers: int, progress: bool
) -> tuple[dict, dict, int]:
    """Encode every usable image once: the gallery's first (sorted), then the query-only ones
    (sorted), so a gallery encoding depends neither on row order nor on the queries.
    Returns :func:`_encode_paths`' ``(features, sizes, n_encoded)`` over both."""
    g_paths = sorted({g.image for g in gallery if g.status == "ok"})
    q_paths = sorted({q.image for q in queries if q.status == "ok"} - set(g_paths))
    try:
        from tqdm import tqdm

        # disable=None: tqdm draws only when stderr is a terminal (a log file or pipe gets no bar lines)
        bar = tqdm(
            total=len(g_paths) + len(q_paths), unit="image", disable=None if progress else True, desc="masc-rank"
        )
    except ImportError:  # pragma: no cover
        bar = None
    tick = (lambda n: bar.update(n)) if bar is not None else (lambda n: None)
    feats, sizes, n_enc = _encode_paths(g_paths, encoder, similarity, chunk, workers, tick)
    f2, s2, n2 = _encode_paths(q_paths, encoder, similarity, chunk, workers, tick)
    feats.update(f2)
    sizes.update(s2)
    if bar is not None:
        bar.close()
    return feats, sizes, n_enc + n2


@dataclass
class _Gallery:
    """The usable gallery in canonical order (resolved path, then row), as arrays."""

    items: list[_Item]
    image: np.ndarray  # [G] resolved paths
    label: np.ndarray  # [G] identity or class, by level
    emb: np.ndarray | None  # [G, D] global embeddings (similarity "global")
    tokens: list | None  # G token arrays (similarity "maxcos")
    classes_of: dict  # identity -> its classes in the gallery


def _usable_gallery(
    gallery: list[_Item], feats: dict, similarity: str, level: str, gallery_csv
) -> tuple[_Gallery, list[dict]]:
    """The gallery rows that encoded, and the failures (rows left out, with their reasons).

    Raises:
        RankFileError: no gallery row has a usable image (``empty_gallery``).
    """
    failures = []
    for g in gallery:
        if g.status == "ok" and isinstance(feats[g.image], InputError):
            g.status, g.detail = feats[g.image].reason, feats[g.image].detail
        if g.status != "ok":
            failures.append(
                {"row_index": g.index, "image": g.row.get("image", ""), "status": g.status, "status_detail": g.detail}
            )
    usable = sorted((g for g in gallery if g.status == "ok"), key=lambda g: (g.image, g.index))
    if not usable:
        raise RankFileError(
            "empty_gallery", f"{gallery_csv}: no gallery row has a usable image ({len(failures)} rows failed)"
        )
    classes_of: dict[str, set] = defaultdict(set)
    for g in usable:
        if g.cls:
            classes_of[g.identity].add(g.cls)
    glob = similarity == "global"
    return _Gallery(
        items=usable,
        image=np.array([g.image for g in usable]),
        label=np.array([g.identity if level == "identity" else g.cls for g in usable]),
        emb=np.stack([feats[g.image] for g in usable]) if glob else None,
        tokens=None if glob else [feats[g.image].tokens for g in usable],
        classes_of=classes_of,
    ), failures


def _query_row(q: _Item, cls: str, similarity: str, level: str) -> dict:
    """A query's output row before ranking (input columns, then the results, unset)."""
    return {
        **q.row,
        "query_index": q.index,
        "query": q.row.get("image", ""),
        "identity": q.identity,
        "method": q.method,
        "class": cls,
        "status": q.status,
        "status_detail": q.detail,
        "ap": float("nan"),
        "first_rank": None,
        "top1": None,
        "top5": None,
        "n_relevant": None,
        "n_gallery": None,
        "n_excluded": None,
        "n_query_patches": None,
        "top1_image": "",
        "top1_identity": "",
        "top1_score": float("nan"),
        "similarity": similarity,
        "level": level,
    }


def _similarities(
    q: _Item, cls: str, gal: _Gallery, feats: dict, sizes: dict, masks: dict, fg: float, similarity: str, level: str
) -> tuple[np.ndarray, int | None]:
    """``(scores [G], n_query_patches)`` of a query against the usable gallery.

    Raises:
        InputError: the query's image failed, its class is unknown at class level, or its mask
            is unusable (:func:`_query_keep`).
    """
    f = feats[q.image]
    if isinstance(f, InputError):
        raise f
    if level == "class" and not cls:
        raise InputError(
            "bad_row",
            "level 'class' needs the query's class (class column, or an identity with one class in the gallery)",
        )
    if similarity == "global":
        assert gal.emb is not None  # the gallery of "global" holds embeddings
        return cosine_scores(f, gal.emb), None
    keep = _query_keep(q, f, sizes, masks, fg)
    assert gal.tokens is not None  # the gallery of "maxcos" holds tokens
    return maxcos_scores(f.tokens, gal.tokens, keep), int(f.tokens.shape[0] if keep is None else keep.sum())


def _rank_into(res: dict, q: _Item, label: str, scores: np.ndarray, gal: _Gallery, level: str) -> None:
    """Rank the gallery (the query's own file excluded) and fill the query's row."""
    include = gal.image != q.image
    r = rank_query(scores[include], gal.label[include] == label)
    res.update(n_relevant=r.n_relevant, n_gallery=r.n_gallery, n_excluded=int((~include).sum()))
    if r.top_index is not None:
        top = gal.items[int(np.flatnonzero(include)[r.top_index])]
        res.update(
            top1_image=top.row.get("image", ""),
            top1_identity=top.identity,
            top1_score=float(scores[include][r.top_index]),
        )
    if r.first_rank is None:  # not r.defined
        res.update(
            status="no_relevant_gallery_item",
            status_detail=f"no gallery image of {level} {label!r} (after excluding the query itself): "
            "AP undefined, left out of mAP",
        )
        return
    res.update(ap=r.ap, first_rank=r.first_rank, top1=int(r.first_rank <= 1), top5=int(r.first_rank <= 5))


def run_rank(
    gallery_csv: str | Path,
    encoder,
    *,
    queries_csv: str | Path | None = None,
    oracle: bool = False,
    similarity: str = "global",
    level: str = "identity",
    use_masks: bool = True,
    io_workers: int = 4,
    chunk_size: int = 64,
    progress: bool = False,
    segmenter=None,
) -> RankReport:
    """Rank a gallery for every query and summarise (the job behind ``masc-rank``).

    Stages: read the tables (:func:`_read_queries`), encode each image once
    (:func:`_encode_all`), keep the usable gallery (:func:`_usable_gallery`), then per query its
    similarities (:func:`_similarities`) and ranking (:func:`_rank_into`).

    Args:
        gallery_csv: columns ``image, identity`` (``mask``, ``class`` optional; others ignored);
            paths relative to the CSV's folder or absolute.
        encoder (EngineEncoder | OnnxEmbeddingEncoder): the image encoder.
        queries_csv: columns ``image, identity, method`` (``mask``, ``class`` optional; other
            columns carried through); required unless ``oracle``.
        oracle: the gallery images are the queries (method ``oracle``), leave-one-out.
        similarity: ``global`` or ``maxcos`` (needs an encoder with patch tokens).
        level: relevance by ``identity`` or by ``class``.
        use_masks: maxcos restricts the query to its mask's foreground patches when it has one.
        segmenter (Segmenter | None): a :class:`~masc_engine.runtime.segmenter.Segmenter`: under maxcos with masks,
            a query without a mask gets the segmenter's (module docstring).

    Returns:
        a :class:`RankReport`; per-query rows are in query order, with ``status`` ``ok``,
        ``no_relevant_gallery_item`` (AP undefined) or a failure reason (``missing_file``,
        ``bad_path``, ``file_too_large``, ``unreadable_image``, ``unreadable_mask``, ``image_too_large``,
        ``mask_size_mismatch``,
        ``mask_orientation_mismatch``, ``empty_query_mask``, ``query_mask_below_threshold``, ``bad_row``; with a
        segmenter ``no_mask_source``, ``mask_prompt_too_long``).

    Raises:
        RankFileError: a file is unusable or the gallery has no usable image.
        ValueError: bad option combination (a segmenter without maxcos and masks).
    """
    _check_options(encoder, queries_csv, oracle, similarity, level)
    if segmenter is not None and not (similarity == "maxcos" and use_masks):
        raise ValueError("a segmenter makes query masks, which only maxcos similarity with masks reads")
    t0 = time.time()
    gallery, queries, input_columns = _read_queries(
        gallery_csv, queries_csv, oracle, similarity == "maxcos" and use_masks
    )
    feats, sizes, n_encoded = _encode_all(gallery, queries, encoder, similarity, chunk_size, io_workers, progress)
    gal, failures = _usable_gallery(gallery, feats, similarity, level, gallery_csv)
    masks = load_all([q.mask for q in queries if q.mask and q.status == "ok"], load_mask, io_workers)
    if segmenter is not None:
        masks.update(_segment_queries(queries, segmenter, gal.classes_of, io_workers))
    fg = getattr(encoder, "fg_threshold", DEFAULT_FG_THRESHOLD)
    rows = []
    for q in queries:
        one = gal.classes_of.get(q.identity, ())
        cls = q.cls or (next(iter(one)) if len(one) == 1 else "")
        res = _query_row(q, cls, similarity, level)
        if segmenter is not None:
            res["mask_source"] = q.mask_source
        rows.append(res)
        if q.status != "ok":
            continue
        try:
            scores, n_patches = _similarities(q, cls, gal, feats, sizes, masks, fg, similarity, level)
        except InputError as e:
            res.update(status=e.reason, status_detail=e.detail)
            continue
        res["n_query_patches"] = n_patches
        _rank_into(res, q, q.identity if level == "identity" else cls, scores, gal, level)

    return RankReport(
        rows=rows,
        summary=summarize(rows),
        gallery_size=len(gal.items),
        gallery_failures=failures,
        images_encoded=n_encoded,
        seconds=time.time() - t0,
        similarity=similarity,
        level=level,
        encoder=getattr(encoder, "name", ""),
        input_columns=input_columns,
        extra_columns=["mask_source"] if segmenter is not None else [],
    )


def write_rank_outputs(report: RankReport, out_path: str | Path, summary_path: str | Path) -> None:
    """Per-query rows to ``out_path`` (the input columns carried through, then the results) and
    the summary to ``summary_path``: CSV whatever the extension, each written atomically by the
    job layer's one table writer (:func:`~masc_engine.jobs.tables.write_table`: an undefined AP
    or score is ``nan``, an unset value such as the rank of a failed query an empty cell)."""
    result_cols = list(QUERY_RESULT_COLUMNS) + report.extra_columns
    cols = [c for c in report.input_columns if c not in result_cols] + result_cols
    write_table(out_path, report.rows, cols, fmt="csv")
    write_table(summary_path, report.summary, list(SUMMARY_COLUMNS), fmt="csv")
