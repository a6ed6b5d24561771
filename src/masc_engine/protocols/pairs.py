"""Scoring a pairs file (the job behind ``masc-run``): resumable, exactly once, at scale.

Input columns: ``ref_image, ref_mask, out_image, out_mask, prompt, object_name``; paths relative
to the CSV's folder or absolute; every other column is carried through. Output: one row per input
row, in input order, with ``row_index`` (1-based data row), ``row_key``, ``cp``, ``pf``, ``status``
(``ok`` or a reason), ``status_detail`` (file and cause), and the reference's extras.

Per-row statuses (a bad row never stops the run; NaN never appears without a status):

- ``missing_file``, ``unreadable_image``, ``unreadable_mask``, ``image_too_large``: file problems;
- ``mask_size_mismatch``: a mask's size differs from its image's (the reference stretches it);
- ``mask_orientation_mismatch``: the mask fits the image only rotated by 90 degrees (EXIF);
- ``empty_reference_mask``: the reference mask has no foreground pixel (CP undefined);
- ``reference_mask_below_threshold``: no reference patch above the threshold (CP undefined);
- ``filtered_reference_mask`` / ``filtered_output_mask``: dropped by the paper's coverage filter;
- ``no_background``: the output mask hides every patch; CP is scored, PF is undefined (NaN);
- ``bad_row``: a required cell is empty.

Exactly once: finished rows go to an append-only journal (protocols/results.py) keyed by
``row_index`` and ``row_key`` (a hash of the row's cells and its files' size and mtime) under a
settings fingerprint (bundle, stripper, threshold, budget, EXIF policy, filters, provider). A
rerun of the same command scores only what is missing; a changed row, bundle or setting is
scored again, never reused.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import platform
import threading
import time
from collections import Counter, OrderedDict, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..runtime.cache import EncodingStore, sha256_bytes
from ..runtime.io import image_from_bytes, mask_coverage, mask_from_bytes, read_bytes
from ..runtime.masks import mask_to_patch_grid
from ..runtime.scorer import EncodedPair, ImageEncoding, Scorer
from .results import (append_journal, journal_path, meta_path, output_format, read_journal,
                      read_output, write_output)

REQUIRED_COLUMNS = ("ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name")
FILE_COLUMNS = REQUIRED_COLUMNS[:4]
RESULT_COLUMNS = ("row_index", "row_key", "cp", "pf", "status", "status_detail", "prompt_text",
                  "prompt_stripped", "prompt_truncated", "cp_n_ref_fg", "cp_n_ref_total", "pf_n_bg_pooled",
                  "pf_n_total", "ref_mask_coverage", "out_mask_coverage")
#: Opt-in columns (``--baselines``): the paper's same-forward-pass ablations (Scorer._baselines).
BASELINE_COLUMNS = ("cp_global", "cp_mnn", "cp_mnn_frac") + tuple(
    f"pf_{r}_{k}" for r in ("full", "bg", "fg") for k in ("stripped", "unstripped"))
#: Opt-in columns (``--save-maps DIR``): PNG overlays, paths relative to the output file's folder.
MAP_COLUMNS = ("cp_map", "pf_map")


class PairsFileError(InputError):
    """The pairs file itself is unusable (missing, no header, missing columns)."""


def read_pairs(csv_path: str | Path) -> tuple[list[str], list[dict]]:
    """Read a pairs CSV (UTF-8, byte-order mark tolerated, quoted commas/newlines allowed).

    Raises:
        PairsFileError: the file is missing, empty, or lacks required columns (named).
    """
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise PairsFileError("missing_file", f"pairs file {csv_path} does not exist")
    with open(csv_path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames:
            raise PairsFileError("bad_pairs_file", f"{csv_path} is empty (no header row)")
        missing = [c for c in REQUIRED_COLUMNS if c not in reader.fieldnames]
        if missing:
            raise PairsFileError("bad_pairs_file",
                                 f"{csv_path}: missing column(s) {', '.join(missing)}; "
                                 f"required: {', '.join(REQUIRED_COLUMNS)}")
        rows = [{k: (v if v is not None else "") for k, v in r.items() if k is not None} for r in reader]
    return list(reader.fieldnames), rows


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
        return RESULT_COLUMNS + (BASELINE_COLUMNS if self.baselines else ()) + (MAP_COLUMNS if self.save_maps else ())

    def fingerprint(self, scorer: Scorer) -> str:
        d = {"run": asdict(self), "bundle": scorer.bundle.fingerprint, "stripper": scorer.stripper,
             "fg_threshold": scorer.fg_threshold, "budget": scorer.image_settings.max_num_patches,
             "provider": scorer.provider, "cp_head": scorer.cp_head, "backend": scorer.backend,
             "precision": scorer.precision}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def _resolve(base: Path, p: str) -> str:
    return p if os.path.isabs(p) else str(base / p)


def row_key(row: dict, base: Path) -> str:
    """Identity of a row's inputs: its cells plus size and mtime of its four files."""
    h = hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
    for c in FILE_COLUMNS:
        try:
            st = os.stat(_resolve(base, row.get(c) or ""))
            h.update(f"|{st.st_size}:{st.st_mtime_ns}".encode())
        except OSError:
            h.update(b"|missing")
    return h.hexdigest()[:20]


@dataclass
class Summary:
    rows: int = 0
    ok: int = 0
    resumed: int = 0
    statuses: Counter = field(default_factory=Counter)
    by_method: dict = field(default_factory=lambda: defaultdict(lambda: {"n": 0, "cp": [], "pf": []}))
    duplicates: list = field(default_factory=list)
    seconds: float = 0.0
    images_encoded: int = 0
    cache_hits: int = 0
    journal_repaired: bool = False

    def add(self, row: dict, method: str | None) -> None:
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
        if self.by_method:
            out.append(f"{'method':<28} {'rows':>6} {'n CP':>6} {'mean CP':>9} {'n PF':>6} {'mean PF':>9}")
            for name, m in sorted(self.by_method.items()):
                cp = f"{np.mean(m['cp']):.4f}" if m["cp"] else "-"
                pf = f"{np.mean(m['pf']):.4f}" if m["pf"] else "-"
                out.append(f"{name:<28} {m['n']:>6} {len(m['cp']):>6} {cp:>9} {len(m['pf']):>6} {pf:>9}")
        return out

    def counts(self) -> dict:
        return {"rows": self.rows, "ok": self.ok, "resumed": self.resumed, "statuses": dict(self.statuses),
                "duplicate_rows": len(self.duplicates), "images_encoded": self.images_encoded,
                "cache_hits": self.cache_hits}


@dataclass
class LoadedImage:
    image: object  # PIL.Image.Image
    sha256: str
    notes: tuple
    pre: object = None  # PreprocessedImage, made in the loader thread when not already encoded


class PairsJob:
    """Score rows of a pairs file with one :class:`Scorer`.

    Within a run each distinct image (by content) is encoded once, held in an in-memory LRU of
    ``cache_items`` encodings and, with ``store``, in a persistent content-keyed cache shared
    across runs and processes. Images and masks are decoded by ``io_workers`` threads.
    """

    def __init__(self, scorer: Scorer, settings: RunSettings = RunSettings(), store: EncodingStore | None = None,
                 io_workers: int = 4, cache_items: int = 512):
        self.scorer = scorer
        self.settings = settings
        self.store = store
        self.io_workers = io_workers
        self.cache_items = cache_items
        self._lru: OrderedDict[str, ImageEncoding] = OrderedDict()
        self._lock = threading.Lock()
        self.images_encoded = 0
        self.cache_hits = 0

    # ---------------------------------------------------------------- loading

    def _load_image(self, path: str):
        try:
            data = read_bytes(path, "image")
            im, notes = image_from_bytes(data, path, self.settings.exif)
            sha = sha256_bytes(data)
            # Preprocess here, in the loader threads, so it overlaps inference on the previous chunk.
            pre = None if self._lru_get(sha) is not None else self.scorer.preprocess(im)
            return LoadedImage(im, sha, notes, pre)
        except InputError as e:
            return e

    def _load_mask(self, path: str):
        try:
            return mask_from_bytes(read_bytes(path, "mask"), path, self.settings.exif)
        except InputError as e:
            return e

    def load(self, rows: list[dict], base: Path) -> tuple[dict, dict]:
        """Decode the distinct images and masks of some rows: ``(images, masks)`` by path, each
        value the decoded object or the :class:`InputError` it raised."""
        imgs, masks = set(), set()
        for row in rows:
            if all((row.get(c) or "").strip() for c in FILE_COLUMNS):
                imgs.update(_resolve(base, row[c]) for c in ("ref_image", "out_image"))
                masks.update(_resolve(base, row[c]) for c in ("ref_mask", "out_mask"))
        with ThreadPoolExecutor(self.io_workers) as ex:
            images = dict(zip(sorted(imgs), ex.map(self._load_image, sorted(imgs))))
            mask_arrays = dict(zip(sorted(masks), ex.map(self._load_mask, sorted(masks))))
        return images, mask_arrays

    # ---------------------------------------------------------------- encoding

    def _lru_get(self, key: str) -> ImageEncoding | None:
        with self._lock:
            v = self._lru.get(key)
            if v is not None:
                self._lru.move_to_end(key)
            return v

    def _lru_put(self, key: str, enc: ImageEncoding) -> None:
        with self._lock:
            self._lru[key] = enc
            while len(self._lru) > self.cache_items:
                self._lru.popitem(last=False)

    def encode(self, images: list[LoadedImage]) -> dict[str, ImageEncoding]:
        """Encodings by content hash; only images in neither cache go through the vision tower."""
        out: dict[str, ImageEncoding] = {}
        todo: dict[str, LoadedImage] = {}
        for li in images:
            if li.sha256 in out or li.sha256 in todo:
                continue
            enc = self._lru_get(li.sha256)
            if enc is None and self.store is not None:
                enc = self.store.get_image(li.sha256)
                if enc is not None:
                    enc = self.scorer.device_encoding(enc)  # device-resident runs keep tokens there
                    self.cache_hits += 1
                    self._lru_put(li.sha256, enc)
            if enc is None:
                todo[li.sha256] = li
            else:
                out[li.sha256] = enc
        if todo:
            s = self.scorer
            encs = s.encode_preprocessed([li.pre if li.pre is not None else s.preprocess(li.image)
                                          for li in todo.values()])
            for key, enc in zip(todo, encs):
                out[key] = enc
                self._lru_put(key, enc)
                if self.store is not None:
                    self.store.put_image(key, s.host_encoding(enc))
            self.images_encoded += len(todo)
        return out

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

    def score_rows(self, rows: list[dict], base: Path, first_index: int = 1, loaded=None,
                   indices: list[int] | None = None) -> list[dict]:
        """Score rows; ``indices`` are their 1-based row indices (default ``first_index``,
        ``first_index + 1``, ...). Results in input order."""
        s, st = self.scorer, self.settings
        images, masks = loaded if loaded is not None else self.load(rows, base)
        indices = indices if indices is not None else list(range(first_index, first_index + len(rows)))
        results = [{**row, "row_index": idx, "cp": float("nan"), "pf": float("nan"),
                    "status": "ok", "status_detail": ""} for idx, row in zip(indices, rows)]
        good_images = [v for v in images.values() if isinstance(v, LoadedImage)]
        encs = self.encode(good_images)
        items, slots = [], []
        for row, res in zip(rows, results):
            try:
                empty = [c for c in REQUIRED_COLUMNS if c != "object_name" and not (row.get(c) or "").strip()]
                if empty:
                    raise InputError("bad_row", f"empty column(s): {', '.join(empty)}")
                paths = {c: _resolve(base, row[c]) for c in FILE_COLUMNS}
                for c in FILE_COLUMNS:
                    obj = (images if "image" in c else masks)[paths[c]]
                    if isinstance(obj, InputError):
                        raise obj
                ref, out = images[paths["ref_image"]], images[paths["out_image"]]
                ref_m, out_m = masks[paths["ref_mask"]], masks[paths["out_mask"]]
                notes = [n for n in (self._check_mask(ref.image, ref_m, "reference", paths["ref_mask"]),
                                     self._check_mask(out.image, out_m, "output", paths["out_mask"])) if n]
                notes += list(ref.notes) + list(out.notes)
                res["ref_mask_coverage"] = round(mask_coverage(ref_m), 6)
                res["out_mask_coverage"] = round(mask_coverage(out_m), 6)
                res["status_detail"] = "; ".join(notes)
                if not ref_m.any():
                    raise InputError("empty_reference_mask", f"{paths['ref_mask']} has no foreground pixel")
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
                if not (rw > s.fg_threshold).any():
                    raise InputError("reference_mask_below_threshold",
                                     f"{paths['ref_mask']}: no patch of the {r.grid[0]}x{r.grid[1]} grid has "
                                     f"mask weight > {s.fg_threshold}")
                items.append(EncodedPair(r, rw, o, mask_to_patch_grid(out_m, o.grid), row["prompt"],
                                         row.get("object_name") or None))
                slots.append((res, ref.image, out.image))
            except InputError as e:
                res.update(status=e.reason, status_detail=e.detail)
        scored = s.score_encoded(items, baselines=st.baselines, with_arrays=st.save_maps is not None)
        for (res, ref_im, out_im), it, sc in zip(slots, items, scored):
            ex = sc.extras
            res.update(cp=sc.cp, pf=sc.pf, **{k: ex[k] for k in (
                "prompt_text", "prompt_stripped", "prompt_truncated", "cp_n_ref_fg", "cp_n_ref_total",
                "pf_n_bg_pooled", "pf_n_total")})
            if st.baselines:
                res.update({k: ex[k] for k in BASELINE_COLUMNS})
            if st.save_maps is not None:
                res.update(self._save_maps(res["row_index"], ref_im, out_im, it, sc))
            detail = [res["status_detail"]] if res["status_detail"] else []
            if not (res.get("object_name") or "").strip():
                detail.append("no object_name: the PF prompt was not stripped")
            if ex["prompt_truncated"]:
                detail.append(f"prompt truncated to {s.text_settings.max_length} tokens")
            if math.isnan(sc.pf):
                res["status"] = "no_background"
                detail.append("the output mask hides every patch: PF undefined, CP scored")
            res["status_detail"] = "; ".join(detail)
        return results


def _versions() -> dict:
    import numpy
    import onnxruntime
    import PIL
    import tokenizers

    from .. import __version__

    return {"masc_engine": __version__, "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
            "pillow": PIL.__version__, "tokenizers": tokenizers.__version__, "python": platform.python_version()}


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
    done: dict[int, dict] = {}
    if header is not None and header.get("fingerprint") == fp:
        for e in entries:
            i = int(e["row_index"])
            if 1 <= i <= len(rows) and e.get("row_key") == keys[i - 1]:
                done[i] = e
    elif out_path.is_file() and meta_path(out_path).is_file():
        meta = json.loads(meta_path(out_path).read_text())
        if meta.get("fingerprint") == fp:
            for e in read_output(out_path):
                i = int(e["row_index"])
                if 1 <= i <= len(rows) and e.get("row_key") == keys[i - 1]:
                    done[i] = e
    if header is None or header.get("fingerprint") != fp:
        if header is not None and entries:
            # Another bundle or setting: nothing is reused, but the old partial work is kept.
            stale = jpath.with_name(f"{jpath.name}.{header.get('fingerprint')}.stale")
            os.replace(jpath, stale)
            log(f"masc-run: the journal of an earlier run with other settings ({len(entries)} rows) was kept as "
                f"{stale}; rows are scored again with the current settings")
        jpath.unlink(missing_ok=True)
        append_journal(jpath, [{"type": "header", "fingerprint": fp, "input": str(csv_path)}])
        append_journal(jpath, list(done.values()))
    summary.resumed = len(done)
    todo = [i for i in range(1, len(rows) + 1) if i not in done]

    store = None
    if cache_dir is not None:
        ns = {"bundle": scorer.bundle.fingerprint, "budget": scorer.image_settings.max_num_patches,
              "exif": settings.exif, "provider": scorer.provider, "backend": scorer.backend,
              "precision": scorer.precision}  # fp16 engines' tokens must never serve an fp32 run
        store = EncodingStore(cache_dir, ns, **({"size_limit": cache_size_limit} if cache_size_limit else {}))
        scorer.text_store = store
    chunks = [todo[i:i + chunk_size] for i in range(0, len(todo), chunk_size)]
    # Chunks are runs of consecutive row indices only where nothing was done; score_rows needs
    # each chunk's rows and their indices.
    bar = tqdm(total=len(rows), initial=len(done), unit="pair", disable=not progress, desc="masc-run")
    try:
        if executor == "ray":
            from .ray_executor import run_chunks_on_ray

            results_iter = run_chunks_on_ray(chunks, rows, keys, base, scorer, settings, ray_address, ray_workers,
                                             io_workers)
            job = None
        else:
            job = PairsJob(scorer, settings, store=store, io_workers=io_workers)
            results_iter = _local_chunks(job, chunks, rows, keys, base)
        for results in results_iter:
            append_journal(jpath, results)
            for r in results:
                done[int(r["row_index"])] = r
            bar.update(len(results))
    finally:
        bar.close()
        if store is not None:
            store.close()
            scorer.text_store = None
    if job is not None:
        summary.images_encoded, summary.cache_hits = job.images_encoded, job.cache_hits

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
    meta = {"fingerprint": fp, "input": str(csv_path.resolve()), "output": str(out_path.resolve()), "bundle": str(scorer.bundle.path),
            "bundle_fingerprint": scorer.bundle.fingerprint, "source_model": scorer.bundle.manifest["source"],
            "bundle_versions": scorer.bundle.manifest.get("versions"), "runtime_versions": _versions(),
            "settings": {**asdict(settings), "stripper": scorer.stripper, "fg_threshold": scorer.fg_threshold,
                         "max_num_patches": scorer.image_settings.max_num_patches, "provider": scorer.provider,
                         "backend": scorer.backend, "precision": scorer.precision, "cp_head": scorer.cp_head,
                         "device_resident": scorer.device is not None, "executor": executor, "batch_size": scorer.batch_size, "chunk_size": chunk_size},
            "counts": summary.counts(), "seconds": round(summary.seconds, 2),
            "pairs_per_second": round(len(todo) / summary.seconds, 3) if summary.seconds else None,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    meta_path(out_path).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    jpath.unlink(missing_ok=True)
    return summary


def _num(v) -> float:
    if v is None or v == "":
        return float("nan")
    return float(v)


def _local_chunks(job: PairsJob, chunks: list[list[int]], rows, keys, base):
    """Yield each chunk's results; the next chunk is decoded while the current one is inferred."""
    def rows_of(chunk):
        return [rows[i - 1] for i in chunk]

    with ThreadPoolExecutor(1) as prefetch:
        pending = prefetch.submit(job.load, rows_of(chunks[0]), base) if chunks else None
        for n, chunk in enumerate(chunks):
            loaded = pending.result()
            if n + 1 < len(chunks):
                pending = prefetch.submit(job.load, rows_of(chunks[n + 1]), base)
            yield score_index_chunk(job, chunk, rows, keys, base, loaded)


def score_index_chunk(job: PairsJob, chunk: list[int], rows, keys, base, loaded=None) -> list[dict]:
    """Score the rows with 1-based indices ``chunk`` (not necessarily consecutive)."""
    sub = [rows[i - 1] for i in chunk]
    results = job.score_rows(sub, base, first_index=1, loaded=loaded, indices=chunk)
    for r in results:
        r["row_key"] = keys[r["row_index"] - 1]
    return results
