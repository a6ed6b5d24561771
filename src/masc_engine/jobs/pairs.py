"""The pairs job behind ``masc-run`` (and, one item at a time, the service): resumable, exactly
once, at scale.

Input columns: ``ref_image, ref_mask, out_image, out_mask, prompt, object_name``; paths relative
to the CSV's folder or absolute; every other column is carried through. Output: one row per input
row, in input order, with ``row_index`` (1-based data row), ``row_key``, ``cp``, ``pf``, ``status``,
``status_detail`` (file and cause), ``cp_status``, ``pf_status``, ``prompt_empty`` and the
reference's extras.

Each score has its own outcome: ``cp_status`` / ``pf_status`` is ``ok`` exactly when that score is
defined, else the reason it is NaN; ``status`` is ``ok`` when both are, else the first reason (CP's,
then PF's). A bad row never stops the run, a defined score is never dropped, and NaN never appears
without its reason:

- both scores (the row cannot be scored): ``missing_file``, ``unreadable_image``,
  ``unreadable_mask``, ``image_too_large``; ``mask_size_mismatch`` (a mask's size differs from its
  image's; the reference stretches it); ``mask_orientation_mismatch`` (the mask fits the image only
  rotated by 90 degrees, EXIF); ``bad_row`` (an empty image or mask cell);
  ``filtered_reference_mask`` / ``filtered_output_mask`` (dropped on request by the paper's
  coverage filter);
- CP only: ``empty_reference_mask`` (no foreground pixel), ``reference_mask_below_threshold``
  (no reference patch above the threshold);
- PF only: ``no_background`` (the output mask hides every patch).

An empty prompt, or one that is only the subject name (it strips to nothing), is data: scored as
masc-metric scores it (PF against the empty text) and flagged ``prompt_empty`` (also in
``status_detail``), never a failed row.

Exactly once: finished rows go to an append-only journal (jobs/results.py) keyed by
``row_index`` and ``row_key`` (a hash of the row's cells and its files' size and mtime) under a
settings fingerprint (bundle, stripper, threshold, budget, EXIF policy, filters, provider, graph
variant). A
rerun of the same command scores only what is missing; a changed row, bundle or setting is
scored again, never reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..runtime.cache import EncodingCache, EncodingStore, sha256_bytes
from ..runtime.io import image_from_bytes, mask_from_bytes, read_bytes
from ..runtime.masks import mask_coverage, mask_to_patch_grid
from ..runtime.scorer import EncodedPair, Scorer
from .executors import Chunk, LocalExecutor, RayExecutor
from .loading import load_all
from .results import (append_journal, journal_path, meta_path, output_format, read_journal,
                      read_output, write_output)
from .tables import TableError, read_table, resolve_path

REQUIRED_COLUMNS = ("ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name")
FILE_COLUMNS = REQUIRED_COLUMNS[:4]
RESULT_COLUMNS = ("row_index", "row_key", "cp", "pf", "status", "status_detail", "cp_status", "pf_status",
                  "prompt_empty", "prompt_text",
                  "prompt_stripped", "prompt_truncated", "cp_n_ref_fg", "cp_n_ref_total", "pf_n_bg_pooled",
                  "pf_n_total", "ref_mask_coverage", "out_mask_coverage")
#: Opt-in columns (``--baselines``): the paper's same-forward-pass ablations (Scorer._baselines).
BASELINE_COLUMNS = ("cp_global", "cp_mnn", "cp_mnn_frac") + tuple(
    f"pf_{r}_{k}" for r in ("full", "bg", "fg") for k in ("stripped", "unstripped"))
#: Opt-in columns (``--save-maps DIR``): PNG overlays, paths relative to the output file's folder.
MAP_COLUMNS = ("cp_map", "pf_map")


class PairsFileError(TableError):
    """The pairs file itself is unusable (missing, no header, missing columns)."""


def read_pairs(csv_path: str | Path) -> tuple[list[str], list[dict]]:
    """Read a pairs table with the job layer's reader (:func:`~masc_engine.jobs.tables.read_table`;
    CSV: UTF-8, byte-order mark tolerated, quoted commas/newlines allowed).

    Returns:
        ``(columns, rows)``; the required columns' cells are strings (``""`` for a missing or
        null cell, numbers as text); other columns are carried through as read.

    Raises:
        PairsFileError: the file is missing, empty, unparsable, or lacks required columns (named).
    """
    try:
        t = read_table(csv_path, REQUIRED_COLUMNS, "pairs", extra_fields="ignore")
    except TableError as e:
        raise PairsFileError(e.reason, e.detail) from None
    return t.columns, [{k: (_cell(v) if k in REQUIRED_COLUMNS else ("" if v is None else v)) for k, v in r.items()}
                       for r in t.rows]


def _cell(v) -> str:
    """A required cell as text: JSON and Parquet tables can hold numbers (a numeric object_name or
    file name) or nulls (NaN from pandas); those are data, not a reason to stop the run."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return v if isinstance(v, str) else str(v)


@dataclass(frozen=True)
class RunSettings:
    """Everything besides the bundle that can change a row's result (part of the fingerprint).

    Attributes:
        exif: ``"apply"`` or ``"ignore"`` (runtime/io.py).
        min_reference_mask_frac / min_output_mask_frac: the paper's coverage filter (0.05 in the
            paper, 0.005 for ORIDa); ``None`` disables it.
        mask_size_tolerance: a mask up to this many pixels off its image's size is stretched
            (the reference's behaviour) instead of refused; 0 refuses any difference.
        baselines: add the same-forward-pass baseline columns (``BASELINE_COLUMNS``).
        save_maps: folder for per-pair attribution PNGs (runtime/maps.py), or ``None``.
    """

    exif: str = "apply"
    min_reference_mask_frac: float | None = None
    min_output_mask_frac: float | None = None
    mask_size_tolerance: int = 0
    baselines: bool = False
    save_maps: str | None = None

    def result_columns(self) -> tuple[str, ...]:
        """The result columns a run with these settings writes, in order."""
        return RESULT_COLUMNS + (BASELINE_COLUMNS if self.baselines else ()) + (MAP_COLUMNS if self.save_maps else ())

    def fingerprint(self, scorer: Scorer) -> str:
        """16 hex digits identifying these settings with the scorer's (a journal is reused only
        under the same fingerprint)."""
        d = {"run": asdict(self), "bundle": scorer.bundle.fingerprint, "stripper": scorer.stripper,
             "fg_threshold": scorer.fg_threshold, "budget": scorer.image_settings.max_num_patches,
             "provider": scorer.provider, "cp_head": scorer.cp_head, "backend": scorer.backend,
             "precision": scorer.precision, "graph_variant": scorer.graph_variant}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def row_key(row: dict, base: Path) -> str:
    """Identity of a row's inputs: its cells plus size and mtime of its four files (20 hex digits)."""
    h = hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
    for c in FILE_COLUMNS:
        try:
            st = os.stat(resolve_path(base, row.get(c) or ""))
            h.update(f"|{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(b"|missing")
    return h.hexdigest()[:20]


@dataclass
class Summary:
    """What a run did: row and status counts, per-method means, duplicates, counters, time."""

    rows: int = 0
    ok: int = 0
    resumed: int = 0
    statuses: Counter = field(default_factory=Counter)
    by_method: dict = field(default_factory=lambda: defaultdict(lambda: {"n": 0, "cp": [], "pf": []}))
    duplicates: list = field(default_factory=list)
    seconds: float = 0.0
    images_encoded: int = 0
    cache_hits: int = 0
    lost_workers: int = 0
    journal_repaired: bool = False

    def add(self, row: dict, method: str | None) -> None:
        """Count one output row (``method``: its method column's value, or None)."""
        self.rows += 1
        self.statuses[row["status"]] += 1
        self.ok += row["status"] == "ok"
        if method is not None:
            m = self.by_method[method]
            m["n"] += 1
            for k in ("cp", "pf"):
                v = row.get(k)
                if isinstance(v, (int, float)) and not math.isnan(v):
                    m[k].append(float(v))

    def lines(self) -> list[str]:
        """The console summary, one line per item."""
        out = [f"rows: {self.rows}  ok: {self.ok}  not ok: {self.rows - self.ok}  resumed: {self.resumed}  "
               f"({self.seconds:.1f}s, {self.images_encoded} images encoded, {self.cache_hits} cache hits)"]
        for status, n in sorted(self.statuses.items()):
            if status != "ok":
                out.append(f"  {status}: {n}")
        if self.duplicates:
            shown = ", ".join(f"{a}={b}" for a, b in self.duplicates[:5])
            out.append(f"  duplicate input rows: {len(self.duplicates)} (row=first seen: {shown})")
        if self.journal_repaired:
            out.append("  a torn last line of the previous run's journal was repaired")
        if self.lost_workers:
            out.append(f"  {self.lost_workers} Ray worker(s) lost; their chunks were scored again by the others")
        if self.by_method:
            out.append(f"{'method':<28} {'rows':>6} {'n CP':>6} {'mean CP':>9} {'n PF':>6} {'mean PF':>9}")
            for name, m in sorted(self.by_method.items()):
                cp = f"{np.mean(m['cp']):.4f}" if m["cp"] else "-"
                pf = f"{np.mean(m['pf']):.4f}" if m["pf"] else "-"
                out.append(f"{name:<28} {m['n']:>6} {len(m['cp']):>6} {cp:>9} {len(m['pf']):>6} {pf:>9}")
        return out

    def counts(self) -> dict:
        """The counts recorded in ``<out>.meta.json``."""
        return {"rows": self.rows, "ok": self.ok, "resumed": self.resumed, "statuses": dict(self.statuses),
                "duplicate_rows": len(self.duplicates), "images_encoded": self.images_encoded,
                "cache_hits": self.cache_hits}


@dataclass
class LoadedImage:
    """A decoded image: the PIL image, its content hash, conversion notes, and its preprocessed
    form when it was not already cached (made in a loader thread)."""

    image: object  # PIL.Image.Image
    sha256: str
    notes: tuple
    pre: object = None  # PreprocessedImage


class PairsJob:
    """Score rows of a pairs file (or single in-memory items) with one :class:`Scorer`.

    Each distinct image (by content) is encoded once: ``cache`` (an
    :class:`~masc_engine.runtime.cache.EncodingCache`, by default an LRU of ``cache_items``
    encodings in front of ``store``, a persistent content-keyed store shared across runs and
    processes). Images and masks are decoded by ``io_workers`` threads.
    """

    def __init__(self, scorer: Scorer, settings: RunSettings = RunSettings(), store: EncodingStore | None = None,
                 io_workers: int = 4, cache_items: int = 512, cache: EncodingCache | None = None):
        self.scorer = scorer
        self.settings = settings
        self.io_workers = io_workers
        self.cache = cache if cache is not None else EncodingCache(scorer, cache_items, store)

    @property
    def images_encoded(self) -> int:
        """Images that went through the vision tower for this job."""
        return self.cache.images_encoded

    @property
    def cache_hits(self) -> int:
        """Images served from the disk store for this job."""
        return self.cache.cache_hits

    def stats(self) -> dict:
        """``{"images_encoded", "cache_hits"}`` since this job was made (executor interface)."""
        return {"images_encoded": self.cache.images_encoded, "cache_hits": self.cache.cache_hits}

    # ---------------------------------------------------------------- loading

    def _image(self, data: bytes, name: str) -> LoadedImage:
        im, notes = image_from_bytes(data, name, self.settings.exif)
        sha = sha256_bytes(data)
        # Preprocess here, in the loader threads, so it overlaps inference on the previous chunk.
        pre = None if self.cache.in_memory(sha) else self.scorer.preprocess(im)
        return LoadedImage(im, sha, notes, pre)

    def _load_image(self, path: str) -> LoadedImage:
        return self._image(read_bytes(path, "image"), path)

    def _load_mask(self, path: str) -> np.ndarray:
        return mask_from_bytes(read_bytes(path, "mask"), path, self.settings.exif)

    def load(self, rows, base: str | Path) -> tuple[dict, dict]:
        """Decode the distinct images and masks of some rows: ``(images, masks)`` by path, each
        value the decoded object or the :class:`InputError` it raised."""
        imgs, masks = set(), set()
        for row in rows:
            if all((row.get(c) or "").strip() for c in FILE_COLUMNS):
                imgs.update(resolve_path(base, row[c]) for c in ("ref_image", "out_image"))
                masks.update(resolve_path(base, row[c]) for c in ("ref_mask", "out_mask"))
        return load_all(imgs, self._load_image, self.io_workers), load_all(masks, self._load_mask, self.io_workers)

    # ---------------------------------------------------------------- encoding

    def encode(self, images: list[LoadedImage]) -> dict:
        """Encodings by content hash; only images in neither cache level go through the vision tower."""
        sources: dict = {}
        for li in images:
            sources.setdefault(li.sha256, li.pre if li.pre is not None else li.image)
        return self.cache.encode(sources)

    # ---------------------------------------------------------------- scoring

    def _check_mask(self, image, mask: np.ndarray, what: str, path: str) -> str | None:
        """Refuse a mask whose size differs from its image's; returns a note when tolerated."""
        h, w = mask.shape
        if (h, w) == (image.height, image.width):
            return None
        if (h, w) == (image.width, image.height):
            raise InputError("mask_orientation_mismatch",
                             f"{what} mask {path} is {w}x{h}, its image {image.width}x{image.height}: they "
                             "fit only rotated by 90 degrees (EXIF orientation applied to one of them? "
                             f"--exif is {self.settings.exif})")
        tol = self.settings.mask_size_tolerance
        if abs(h - image.height) <= tol and abs(w - image.width) <= tol:
            return f"{what} mask {w}x{h} stretched to its image {image.width}x{image.height}"
        raise InputError("mask_size_mismatch",
                         f"{what} mask {path} is {w}x{h} (WxH) but its image is {image.width}x{image.height} "
                         "(--mask-size-tolerance N stretches masks up to N pixels off)")

    def _save_maps(self, row_index: int, ref_im, out_im, it: EncodedPair, sc) -> dict:
        """Write the pair's CP and PF overlays; returns their paths (absolute; run_pairs makes
        them relative to the output file)."""
        from ..runtime.maps import cp_map, pf_map

        d = Path(self.settings.save_maps)
        d.mkdir(parents=True, exist_ok=True)
        cp_path, pf_path = d / f"{row_index:07d}_cp.png", d / f"{row_index:07d}_pf.png"
        cp_map(ref_im, it.ref_enc.grid, sc.arrays["cp_best"], it.ref_weights, self.scorer.fg_threshold).save(cp_path)
        pf_map(out_im, it.out_enc.grid, sc.arrays["pf_attention"], sc.arrays["pf_hidden"]).save(pf_path)
        return {"cp_map": str(cp_path.resolve()), "pf_map": str(pf_path.resolve())}

    def score_rows(self, rows: list[dict], base: str | Path, first_index: int = 1, loaded=None,
                   indices: list[int] | None = None) -> list[dict]:
        """Score rows; ``indices`` are their 1-based row indices (default ``first_index``,
        ``first_index + 1``, ...). Results in input order."""
        images, masks = loaded if loaded is not None else self.load(rows, base)
        indices = indices if indices is not None else list(range(first_index, first_index + len(rows)))
        items = []
        for idx, row in zip(indices, rows):
            objs = names = None
            if all((row.get(c) or "").strip() for c in FILE_COLUMNS):
                names = {c: resolve_path(base, row[c]) for c in FILE_COLUMNS}
                objs = {c: (images if "image" in c else masks)[names[c]] for c in FILE_COLUMNS}
            items.append((idx, row, objs, names))
        return self._score(items)

    def score_chunk(self, chunk: Chunk, loaded=None) -> list[dict]:
        """Score a chunk's rows (executor interface); each result carries its ``row_key``."""
        results = self.score_rows(list(chunk.rows), chunk.base, loaded=loaded, indices=list(chunk.indices))
        for r, k in zip(results, chunk.keys):
            r["row_key"] = k
        return results

    def score_item(self, ref_image, ref_mask, out_image, out_mask, prompt: str, object_name: str = "",
                   row_index: int = 1, extra: dict | None = None) -> dict:
        """Score one in-memory pair; returns the very result record masc-run writes for a row.

        Args:
            ref_image, out_image: encoded image bytes (PNG, JPEG, ...) or a PIL image (converted
                to RGB; an 8-bit image is used as it is).
            ref_mask, out_mask: encoded mask bytes, or a ``[H, W]`` uint8 array (foreground
                non-zero), as masc-run decodes mask files.
            prompt, object_name: the row's ``prompt`` and ``object_name`` cells.
            row_index: the record's ``row_index`` (a service's request item number).
            extra: other cells to carry through (as a pairs file's extra columns).

        Returns:
            a dict with ``RESULT_COLUMNS`` (``row_key`` empty) and the carried cells; a bad input
            gives its status and detail (naming the field), never an exception.
        """
        row = {**(extra or {}), "ref_image": "ref_image", "ref_mask": "ref_mask", "out_image": "out_image",
               "out_mask": "out_mask", "prompt": prompt, "object_name": object_name}
        objs = {}
        for c, v in (("ref_image", ref_image), ("out_image", out_image)):
            try:
                objs[c] = self._image(v, c) if isinstance(v, (bytes, bytearray, memoryview)) else self._pil_image(v, c)
            except InputError as e:
                objs[c] = e
        for c, v in (("ref_mask", ref_mask), ("out_mask", out_mask)):
            try:
                objs[c] = (mask_from_bytes(bytes(v), c, self.settings.exif) if isinstance(v, (bytes, bytearray, memoryview))
                           else self._array_mask(v, c))
            except InputError as e:
                objs[c] = e
        res = self._score([(row_index, row, objs, {c: c for c in FILE_COLUMNS})])[0]
        res["row_key"] = ""
        return res

    def _pil_image(self, im, name: str) -> LoadedImage:
        from PIL import Image

        if not isinstance(im, Image.Image):
            raise InputError("unreadable_image", f"{name}: expected image bytes or a PIL image, got {type(im).__name__}")
        rgb = im if im.mode == "RGB" else im.convert("RGB")
        arr = np.asarray(rgb)
        sha = sha256_bytes(b"pil:%d:%d:" % rgb.size + arr.tobytes())  # content key of the pixels
        pre = None if self.cache.in_memory(sha) else self.scorer.preprocess(rgb)
        notes = () if im.mode == "RGB" else (f"{im.mode} converted to RGB",)
        return LoadedImage(rgb, sha, notes, pre)

    @staticmethod
    def _array_mask(m, name: str) -> np.ndarray:
        a = np.asarray(m)
        if a.ndim != 2 or a.dtype != np.uint8:
            raise InputError("unreadable_mask", f"{name}: expected mask bytes or a [H, W] uint8 array, got "
                                                f"{a.dtype} {list(a.shape)}")
        return a

    def _score(self, items: list[tuple]) -> list[dict]:
        """Score ``(row_index, row, objs, names)`` items: ``objs`` maps each file column to its
        decoded object (or the InputError decoding raised), ``names`` to the path named in
        messages; both None when a file cell is empty.

        Each score gets its own outcome (``cp_status``, ``pf_status``; ``status`` is the first
        that is not ``ok``): a row that cannot be read costs both, a reference mask without a
        usable foreground costs CP only, an output mask hiding every patch costs PF only.
        """
        s, st = self.scorer, self.settings
        results = [{**row, "row_index": idx, "cp": float("nan"), "pf": float("nan"), "status": "ok",
                    "status_detail": "", "cp_status": "ok", "pf_status": "ok", "prompt_empty": False}
                   for idx, row, _, _ in items]
        good_images = [o for _, _, objs, _ in items if objs for c, o in objs.items()
                       if "image" in c and isinstance(o, LoadedImage)]
        encs = self.encode(good_images)
        pairs, slots = [], []
        for (idx, row, objs, names), res in zip(items, results):
            try:
                empty = [c for c in FILE_COLUMNS if not (row.get(c) or "").strip()]
                if empty:
                    raise InputError("bad_row", f"empty column(s): {', '.join(empty)}")
                for c in FILE_COLUMNS:
                    if isinstance(objs[c], InputError):  # name the column: the same file can be in two
                        e = objs[c]
                        raise InputError(e.reason, e.detail if c in e.detail else f"{c}: {e.detail}")
                ref, out = objs["ref_image"], objs["out_image"]
                ref_m, out_m = objs["ref_mask"], objs["out_mask"]
                notes = [n for n in (self._check_mask(ref.image, ref_m, "reference", names["ref_mask"]),
                                     self._check_mask(out.image, out_m, "output", names["out_mask"])) if n]
                notes += list(ref.notes) + list(out.notes)
                res["ref_mask_coverage"] = round(mask_coverage(ref_m), 6)
                res["out_mask_coverage"] = round(mask_coverage(out_m), 6)
                res["status_detail"] = "; ".join(notes)
                if st.min_reference_mask_frac is not None and res["ref_mask_coverage"] < st.min_reference_mask_frac:
                    raise InputError("filtered_reference_mask",
                                     f"reference mask covers {res['ref_mask_coverage']:.2%} < "
                                     f"{st.min_reference_mask_frac:.2%} of the image")
                if st.min_output_mask_frac is not None and res["out_mask_coverage"] < st.min_output_mask_frac:
                    raise InputError("filtered_output_mask",
                                     f"output mask covers {res['out_mask_coverage']:.2%} < "
                                     f"{st.min_output_mask_frac:.2%} of the image")
                r, o = encs[ref.sha256], encs[out.sha256]
                rw = mask_to_patch_grid(ref_m, r.grid)
                pairs.append(EncodedPair(r, rw, o, mask_to_patch_grid(out_m, o.grid), row.get("prompt") or "",
                                         row.get("object_name") or None))
                slots.append((res, ref.image, out.image, ref_m, names["ref_mask"]))
            except InputError as e:
                res.update(status=e.reason, status_detail=e.detail, cp_status=e.reason, pf_status=e.reason)
        scored = s.score_encoded(pairs, baselines=st.baselines, with_arrays=st.save_maps is not None)
        for (res, ref_im, out_im, ref_m, ref_name), it, sc in zip(slots, pairs, scored):
            ex = sc.extras
            res.update(cp=sc.cp, pf=sc.pf, **{k: ex[k] for k in (
                "prompt_text", "prompt_stripped", "prompt_truncated", "cp_n_ref_fg", "cp_n_ref_total",
                "pf_n_bg_pooled", "pf_n_total")})
            if st.baselines:
                res.update({k: ex[k] for k in BASELINE_COLUMNS})
            if st.save_maps is not None:
                res.update(self._save_maps(res["row_index"], ref_im, out_im, it, sc))
            detail = [res["status_detail"]] if res["status_detail"] else []
            if math.isnan(sc.cp):
                if not np.any(ref_m):
                    res["cp_status"] = "empty_reference_mask"
                    detail.append(f"{ref_name} has no foreground pixel: CP undefined, PF scored")
                else:
                    g = it.ref_enc.grid
                    res["cp_status"] = "reference_mask_below_threshold"
                    detail.append(f"{ref_name}: no patch of the {g[0]}x{g[1]} grid has mask weight > "
                                  f"{s.fg_threshold}: CP undefined, PF scored")
            if math.isnan(sc.pf):
                res["pf_status"] = "no_background"
                detail.append("the output mask hides every patch: PF undefined, CP scored")
            if not (res.get("object_name") or "").strip():
                detail.append("no object_name: the PF prompt was not stripped")
            if not ex["prompt_text"].strip():
                res["prompt_empty"] = True
                detail.append("prompt_empty: PF compares with an empty text" + (
                    "" if not (res.get("prompt") or "").strip() else
                    f" (the prompt is only the subject {res.get('object_name')!r})"))
            if ex["prompt_truncated"]:
                detail.append(f"prompt truncated to {s.text_settings.max_length} tokens")
            res["status"] = next((x for x in (res["cp_status"], res["pf_status"]) if x != "ok"), "ok")
            res["status_detail"] = "; ".join(detail)
        return results


def build_pairs_job(bundle_dir: str, scorer_kwargs: dict, settings: dict, io_workers: int,
                    cache_dir: str | None = None, cache_size_limit: int | None = None) -> PairsJob:
    """A :class:`PairsJob` on a fresh scorer: the factory Ray workers call (picklable through
    :func:`functools.partial`, so executors need not know this module). With ``cache_dir`` the
    worker reads and writes the same persistent store as the driver (diskcache is safe across
    processes; on several nodes the folder must be shared storage)."""
    scorer = Scorer(bundle_dir, **scorer_kwargs)
    run_settings = RunSettings(**settings)
    store = None
    if cache_dir is not None:
        store = EncodingStore(cache_dir, encoding_namespace(scorer, run_settings.exif),
                              **({"size_limit": cache_size_limit} if cache_size_limit else {}))
        scorer.text_store = store
    return PairsJob(scorer, run_settings, store=store, io_workers=io_workers)


def _ray_factory(scorer: Scorer, settings: RunSettings, io_workers: int, cache_dir=None, cache_size_limit=None):
    kwargs = {"provider": scorer.provider, "stripper": scorer.stripper, "fg_threshold": scorer.fg_threshold,
              "naflex_max_patches": scorer.image_settings.max_num_patches, "batch_size": scorer.batch_size,
              "verify": False, "cp_head": scorer.cp_head, "backend": scorer.backend,
              "precision": scorer.precision, "device_resident": scorer.device is not None,
              "ort_memory": getattr(scorer, "ort_memory", "lean"), "graph_variant": scorer.graph_variant}
    if scorer.backend == "onnxruntime" and scorer.bundle.verify:
        # The workers load the bundle unverified (one hash per run, not per worker): the driver
        # checks every graph file (and weights) they will load, the text graph included, which the
        # driver itself may never load.
        for g in ("vision", "pool", "text", "cp"):
            scorer.bundle.graph_file(g, scorer.graph_variant)
    return functools.partial(build_pairs_job, str(Path(scorer.bundle.path).resolve()), kwargs, asdict(settings),
                             io_workers, None if cache_dir is None else str(Path(cache_dir).resolve()), cache_size_limit)


def _versions() -> dict:
    import numpy
    import onnxruntime
    import PIL
    import tokenizers

    from .. import __version__

    return {"masc_engine": __version__, "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            "pillow": PIL.__version__, "tokenizers": tokenizers.__version__, "python": platform.python_version()}


def encoding_namespace(scorer: Scorer, exif: str) -> dict:
    """The disk store's namespace (runtime/cache.py ``EncodingStore``) for ``scorer``'s encodings:
    everything that changes a stored token or text embedding. masc-run and masc-serve both use it,
    so the two share entries exactly when their encodings are interchangeable.

    Args:
        scorer: the scorer whose encodings are stored.
        exif: the EXIF orientation policy (``RunSettings.exif``).
    """
    return {"bundle": scorer.bundle.fingerprint, "budget": scorer.image_settings.max_num_patches,
            "exif": exif, "provider": scorer.provider, "backend": scorer.backend,
            "precision": scorer.precision,  # fp16 engines' tokens must never serve an fp32 run
            "graph_variant": scorer.graph_variant}  # fused and portable tokens differ by rounding


def run_pairs(csv_path: str | Path, scorer: Scorer, out_path: str | Path, settings: RunSettings = RunSettings(),
              chunk_size: int = 64, io_workers: int = 4, cache_dir: str | Path | None = None,
              cache_size_limit: int | None = None, executor: str = "local", ray_address: str | None = None,
              ray_workers: int | None = None, progress: bool = True, log=print) -> Summary:
    """Score every row of ``csv_path`` into ``out_path`` (format by extension), resumably.

    Rows already in the journal (or in a complete previous output) with the same ``row_key`` and
    settings fingerprint are not scored again. Decoding of the next chunk overlaps inference on
    the current one.

    Raises:
        PairsFileError: the pairs file is unusable (nothing is written then).
        ValueError: an unsupported output extension.
    """
    from tqdm import tqdm

    from ..engine.device import is_gpu

    t0 = time.time()
    out_path = Path(out_path)
    output_format(out_path)
    csv_path = Path(csv_path)
    fieldnames, rows = read_pairs(csv_path)
    base = csv_path.resolve().parent
    fp = settings.fingerprint(scorer)
    keys = [row_key(r, base) for r in rows]
    summary = Summary()
    seen: dict[str, int] = {}
    for i, r in enumerate(rows, start=1):
        k = json.dumps(r, sort_keys=True)
        if k in seen:
            summary.duplicates.append((i, seen[k]))
        else:
            seen[k] = i

    # ---- what is already done (journal of an interrupted run, or a complete previous output)
    jpath = journal_path(out_path)
    header, entries, summary.journal_repaired = read_journal(jpath)
    runs = [e for e in entries if e.get("type") == "run"]
    entries = [e for e in entries if e.get("type") != "run"]
    done: dict[int, dict] = {}
    earlier_runs: list[dict] = []  # the records of the runs that made what is reused
    if header is not None and header.get("fingerprint") == fp:
        for e in entries:
            i = int(e["row_index"])
            if 1 <= i <= len(rows) and e.get("row_key") == keys[i - 1]:
                done[i] = e
        earlier_runs = list(header.get("earlier_runs") or []) + _last_per_run(runs)
    elif out_path.is_file() and meta_path(out_path).is_file():
        meta = json.loads(meta_path(out_path).read_text())
        if meta.get("fingerprint") == fp:
            for e in read_output(out_path):
                i = int(e["row_index"])
                if 1 <= i <= len(rows) and e.get("row_key") == keys[i - 1]:
                    done[i] = e
            earlier_runs = list(meta.get("runs") or [])
    if header is None or header.get("fingerprint") != fp:
        if header is not None and entries:
            # Another bundle or setting: nothing is reused, but the old partial work is kept.
            stale = jpath.with_name(f"{jpath.name}.{header.get('fingerprint')}.stale")
            os.replace(jpath, stale)
            log(f"masc-run: the journal of an earlier run with other settings ({len(entries)} rows) was kept as "
                f"{stale}; rows are scored again with the current settings")
        jpath.unlink(missing_ok=True)
        append_journal(jpath, [{"type": "header", "fingerprint": fp, "input": str(csv_path),
                                "earlier_runs": earlier_runs}])
        append_journal(jpath, list(done.values()))
    summary.resumed = len(done)
    todo = [i for i in range(1, len(rows) + 1) if i not in done]

    store = None
    if cache_dir is not None:
        store = EncodingStore(cache_dir, encoding_namespace(scorer, settings.exif), **({"size_limit": cache_size_limit} if cache_size_limit else {}))
        scorer.text_store = store
    # Chunks are runs of consecutive row indices only where nothing was done.
    chunks = [Chunk(tuple(c), tuple(rows[i - 1] for i in c), tuple(keys[i - 1] for i in c), str(base))
              for c in (todo[i:i + chunk_size] for i in range(0, len(todo), chunk_size))]
    if executor == "ray":
        runner = RayExecutor(_ray_factory(scorer, settings, io_workers, cache_dir, cache_size_limit), gpu=is_gpu(scorer.backend, scorer.provider),
                             address=ray_address, workers=ray_workers)
    else:
        runner = LocalExecutor(PairsJob(scorer, settings, store=store, io_workers=io_workers))
    bar = tqdm(total=len(rows), initial=len(done), unit="pair", disable=not progress, desc="masc-run")
    run_id = len(earlier_runs) + 1
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    scored = 0

    def record(completed: bool) -> dict:
        st = runner.stats()
        sec = time.time() - t0
        return {"type": "run", "run": run_id, "started": started, "seconds": round(sec, 3),
                "rows_scored": scored, "rows_reused": summary.resumed, "images_encoded": st.get("images_encoded", 0),
                "cache_hits": st.get("cache_hits", 0), "lost_workers": st.get("lost_workers", 0),
                "executor": executor, "completed": completed,
                "pairs_per_second": round(scored / sec, 3) if sec > 0 else None}

    try:
        for results in runner.run(chunks):
            scored += len(results)
            # The run's figures so far travel in the journal, so a killed run's work stays on record.
            append_journal(jpath, results + [record(False)])
            for r in results:
                done[int(r["row_index"])] = r
            bar.update(len(results))
    finally:
        bar.close()
        if store is not None:
            store.close()
            scorer.text_store = None
    stats = runner.stats()  # Ray: summed over the workers' reports
    summary.images_encoded, summary.cache_hits = stats.get("images_encoded", 0), stats.get("cache_hits", 0)
    summary.lost_workers = stats.get("lost_workers", 0)

    # ---- materialize the output in input order, then the sidecar, then drop the journal
    method_col = "method" if "method" in fieldnames else None
    result_cols = settings.result_columns()
    ordered = []
    for i in range(1, len(rows) + 1):
        r = {**rows[i - 1], **{k: v for k, v in done[i].items() if k in result_cols}}
        r["cp"], r["pf"] = _num(r.get("cp")), _num(r.get("pf"))
        for k in MAP_COLUMNS:
            if r.get(k) and os.path.isabs(r[k]):
                r[k] = os.path.relpath(r[k], out_path.resolve().parent)
        ordered.append(r)
        summary.add(r, r.get(method_col) if method_col else None)
    columns = fieldnames + [c for c in result_cols if c not in fieldnames]
    write_output(out_path, ordered, columns)
    summary.seconds = time.time() - t0
    this_run = {k: v for k, v in record(True).items() if k != "type"}
    this_run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    all_runs = earlier_runs + [this_run]
    total_s = sum(float(r.get("seconds") or 0.0) for r in all_runs)
    total_scored = sum(int(r.get("rows_scored") or 0) for r in all_runs)
    counts = summary.counts()
    counts.update(images_encoded=sum(int(r.get("images_encoded") or 0) for r in all_runs),
                  cache_hits=sum(int(r.get("cache_hits") or 0) for r in all_runs))
    meta = {"fingerprint": fp, "input": str(csv_path.resolve()), "output": str(out_path.resolve()), "bundle": str(scorer.bundle.path),
            "bundle_fingerprint": scorer.bundle.fingerprint, "source_model": scorer.bundle.manifest["source"],
            "bundle_versions": scorer.bundle.manifest.get("versions"), "runtime_versions": _versions(),
            "settings": {**asdict(settings), "stripper": scorer.stripper, "fg_threshold": scorer.fg_threshold,
                         "max_num_patches": scorer.image_settings.max_num_patches, "provider": scorer.provider,
                         "backend": scorer.backend, "precision": scorer.precision, "cp_head": scorer.cp_head,
                         "graph_variant": scorer.graph_variant, "device_resident": scorer.device is not None, "executor": executor, "batch_size": scorer.batch_size, "chunk_size": chunk_size},
            # Cumulative over every run that produced this output (a resumed or repeated command
            # adds its record to "runs" and never erases what the earlier ones measured).
            "counts": counts, "seconds": round(total_s, 2),
            "pairs_per_second": round(total_scored / total_s, 3) if total_s > 0 and total_scored else None,
            "runs": all_runs, "finished": this_run["finished"]}
    meta_path(out_path).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    jpath.unlink(missing_ok=True)
    return summary


def _last_per_run(records: list[dict]) -> list[dict]:
    """The last journal record of each run (each chunk rewrites its run's figures)."""
    last: dict = {}
    for r in records:
        last[r.get("run")] = {k: v for k, v in r.items() if k != "type"}
    return list(last.values())


def _num(v) -> float:
    if v is None or v == "":
        return float("nan")
    return float(v)
