"""Scoring a pairs CSV (the job behind ``masc-run``).

Input columns: ``ref_image, ref_mask, out_image, out_mask, prompt, object_name``; paths relative
to the CSV's folder or absolute; every other column is carried through. Output: one row per input
row, in input order, with ``row_index`` (1-based data row), ``cp``, ``pf``, ``status`` (``ok`` or a
reason), ``status_detail`` (file and cause), and the reference's extras that explain a score.

Per-row statuses (a bad row never stops the run; NaN never appears without a status):

- ``missing_file``, ``unreadable_image``, ``unreadable_mask``, ``image_too_large``: file problems;
- ``mask_size_mismatch``: a mask's size differs from its image's (the reference stretches it);
- ``empty_reference_mask``: the reference mask has no foreground pixel (CP undefined);
- ``reference_mask_below_threshold``: foreground pixels, but no patch above the threshold after
  downsampling (CP undefined, the reference returns NaN);
- ``no_background``: the output mask hides every patch; CP is scored, PF is undefined (NaN);
- ``bad_row``: a required cell is empty.
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections import Counter, OrderedDict, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..runtime.io import load_image, load_mask
from ..runtime.scorer import EncodedPair, ImageEncoding, Scorer, check_mask_matches
from ..runtime.masks import mask_to_patch_grid

REQUIRED_COLUMNS = ("ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name")
RESULT_COLUMNS = ("row_index", "cp", "pf", "status", "status_detail", "prompt_text", "prompt_stripped",
                  "prompt_truncated", "cp_n_ref_fg", "cp_n_ref_total", "pf_n_bg_pooled", "pf_n_total")


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
        rows = list(reader)
    return list(reader.fieldnames), rows


@dataclass
class Summary:
    rows: int = 0
    ok: int = 0
    statuses: Counter = field(default_factory=Counter)
    by_method: dict = field(default_factory=lambda: defaultdict(lambda: {"n": 0, "cp": [], "pf": []}))
    seconds: float = 0.0
    images_encoded: int = 0

    def add(self, row: dict, method: str | None) -> None:
        self.rows += 1
        self.statuses[row["status"]] += 1
        self.ok += row["status"] == "ok"
        if method is not None:
            m = self.by_method[method]
            m["n"] += 1
            for k in ("cp", "pf"):
                if isinstance(row[k], float) and not math.isnan(row[k]):
                    m[k].append(row[k])

    def lines(self) -> list[str]:
        out = [f"rows: {self.rows}  ok: {self.ok}  failed or partial: {self.rows - self.ok}  "
               f"({self.seconds:.1f}s, {self.images_encoded} images encoded)"]
        for status, n in sorted(self.statuses.items()):
            if status != "ok":
                out.append(f"  {status}: {n}")
        if self.by_method:
            out.append(f"{'method':<28} {'n':>5} {'mean CP':>9} {'mean PF':>9}")
            for name, m in sorted(self.by_method.items()):
                cp = f"{np.mean(m['cp']):.4f}" if m["cp"] else "-"
                pf = f"{np.mean(m['pf']):.4f}" if m["pf"] else "-"
                out.append(f"{name:<28} {m['n']:>5} {cp:>9} {pf:>9}")
        return out


class EncodingCache:
    """In-memory LRU of image encodings by path, so a reference reused across rows is encoded
    once per run while memory stays bounded (``max_items`` encodings)."""

    def __init__(self, max_items: int = 512):
        self.max_items = max_items
        self._d: OrderedDict[str, ImageEncoding] = OrderedDict()

    def get(self, key: str) -> ImageEncoding | None:
        v = self._d.get(key)
        if v is not None:
            self._d.move_to_end(key)
        return v

    def put(self, key: str, value: ImageEncoding) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.max_items:
            self._d.popitem(last=False)


def _resolve(base: Path, p: str) -> str:
    return p if os.path.isabs(p) else str(base / p)


def _fmt(x):
    return "" if x is None else x


class PairsJob:
    """Score the rows of a pairs CSV with one :class:`Scorer`, chunk by chunk.

    Args:
        scorer: the scorer.
        chunk_size: rows per chunk (images of a chunk are decoded in parallel, then encoded in
            batches of ``scorer.batch_size``).
        io_workers: threads decoding images and masks.
    """

    def __init__(self, scorer: Scorer, chunk_size: int = 64, io_workers: int = 4, cache_items: int = 512):
        self.scorer = scorer
        self.chunk_size = chunk_size
        self.io_workers = io_workers
        self.cache = EncodingCache(cache_items)
        self.images_encoded = 0

    def _load_all(self, paths: set[str], loader) -> dict:
        def one(p):
            try:
                return p, loader(p)
            except InputError as e:
                return p, e
        with ThreadPoolExecutor(self.io_workers) as ex:
            return dict(ex.map(one, sorted(paths)))

    def score_rows(self, rows: list[dict], base: Path, first_index: int) -> list[dict]:
        """Score one chunk; returns result dicts (input columns + results) in input order."""
        s = self.scorer
        results: list[dict] = []
        for i, row in enumerate(rows):
            results.append({**row, "row_index": first_index + i, "cp": float("nan"), "pf": float("nan"),
                            "status": "ok", "status_detail": ""})
        img_paths, mask_paths = set(), set()
        for row, res in zip(rows, results):
            empty = [c for c in REQUIRED_COLUMNS if c != "object_name" and not (row.get(c) or "").strip()]
            if empty:
                res.update(status="bad_row", status_detail=f"empty column(s): {', '.join(empty)}")
                continue
            img_paths.update(_resolve(base, row[c]) for c in ("ref_image", "out_image"))
            mask_paths.update(_resolve(base, row[c]) for c in ("ref_mask", "out_mask"))
        need = {p for p in img_paths if self.cache.get(p) is None}
        images = self._load_all(need | img_paths, load_image)  # sizes are needed for mask checks
        masks = self._load_all(mask_paths, load_mask)
        to_encode = [p for p in sorted(need) if not isinstance(images[p], InputError)]
        pre = [s.preprocess(images[p]) for p in to_encode]
        for p, enc in zip(to_encode, s.encode_preprocessed(pre)):
            self.cache.put(p, enc)
        self.images_encoded += len(to_encode)
        # Hold this chunk's encodings: the LRU may evict some of them while the chunk is scored.
        encs = {p: self.cache.get(p) for p in img_paths if not isinstance(images[p], InputError)}
        items, slots = [], []
        for row, res in zip(rows, results):
            if res["status"] != "ok":
                continue
            try:
                paths = {c: _resolve(base, row[c]) for c in REQUIRED_COLUMNS[:4]}
                for c in REQUIRED_COLUMNS[:4]:
                    obj = (images if "image" in c else masks)[paths[c]]
                    if isinstance(obj, InputError):
                        raise obj
                ref_im, out_im = images[paths["ref_image"]], images[paths["out_image"]]
                ref_m, out_m = masks[paths["ref_mask"]], masks[paths["out_mask"]]
                check_mask_matches(ref_im, ref_m, f"reference {paths['ref_mask']}")
                check_mask_matches(out_im, out_m, f"output {paths['out_mask']}")
                if not ref_m.any():
                    raise InputError("empty_reference_mask", f"{paths['ref_mask']} has no foreground pixel")
                r, o = encs[paths["ref_image"]], encs[paths["out_image"]]
                rw = mask_to_patch_grid(ref_m, r.grid)
                if not (rw > s.fg_threshold).any():
                    raise InputError("reference_mask_below_threshold",
                                     f"{paths['ref_mask']}: no patch of the {r.grid[0]}x{r.grid[1]} grid "
                                     f"has mask weight > {s.fg_threshold}")
                items.append(EncodedPair(r, rw, o, mask_to_patch_grid(out_m, o.grid),
                                         row["prompt"], row.get("object_name") or None))
                slots.append(res)
            except InputError as e:
                res.update(status=e.reason, status_detail=e.detail)
        for res, sc in zip(slots, s.score_encoded(items)):
            ex = sc.extras
            res.update(cp=sc.cp, pf=sc.pf, prompt_text=ex["prompt_text"], prompt_stripped=ex["prompt_stripped"],
                       prompt_truncated=ex["prompt_truncated"], cp_n_ref_fg=ex["cp_n_ref_fg"],
                       cp_n_ref_total=ex["cp_n_ref_total"], pf_n_bg_pooled=ex["pf_n_bg_pooled"],
                       pf_n_total=ex["pf_n_total"])
            if math.isnan(sc.pf):
                res.update(status="no_background",
                           status_detail="the output mask hides every patch: PF undefined, CP scored")
            elif ex["prompt_truncated"]:
                res["status_detail"] = f"prompt truncated to {s.text_settings.max_length} tokens"
        return results


def run_pairs_csv(csv_path: str | Path, scorer: Scorer, out_path: str | Path, chunk_size: int = 64,
                  io_workers: int = 4, progress: bool = True) -> Summary:
    """Score every row of ``csv_path`` into ``out_path`` (CSV), streaming chunk by chunk.

    Raises:
        PairsFileError: the pairs file is unusable (nothing is written then).
    """
    from tqdm import tqdm

    t0 = time.time()
    csv_path = Path(csv_path)
    fieldnames, rows = read_pairs(csv_path)
    base = csv_path.resolve().parent
    job = PairsJob(scorer, chunk_size=chunk_size, io_workers=io_workers)
    out_cols = fieldnames + [c for c in RESULT_COLUMNS if c not in fieldnames]
    summary = Summary()
    method_col = "method" if "method" in fieldnames else None
    tmp = Path(str(out_path) + ".partial")
    with open(tmp, "w", newline="", encoding="utf-8") as f, \
            tqdm(total=len(rows), unit="pair", disable=not progress, desc="masc-run") as bar:
        w = csv.DictWriter(f, fieldnames=out_cols, extrasaction="ignore")
        w.writeheader()
        for start in range(0, len(rows), chunk_size):
            chunk = rows[start:start + chunk_size]
            for res in job.score_rows(chunk, base, first_index=start + 1):
                summary.add(res, res.get(method_col) if method_col else None)
                w.writerow({k: _fmt(v) for k, v in res.items()})
            f.flush()
            bar.update(len(chunk))
    os.replace(tmp, out_path)
    summary.seconds = time.time() - t0
    summary.images_encoded = job.images_encoded
    return summary
