"""The pairs job behind ``masc-run`` (and, one item at a time, the service): resumable, exactly
once, at scale.

Input columns: ``ref_image, ref_mask, out_image, out_mask, prompt, object_name``; paths relative
to the CSV's folder or absolute; every other column is carried through. Output: one row per input
row, in input order, with ``row_index`` (1-based data row), ``row_key``, ``cp``, ``pf``, ``status``,
``status_detail`` (file and cause), ``cp_status``, ``pf_status``, ``prompt_empty`` and the
reference's extras.

With a segmenter (``run_pairs(..., segmenter=...)``, ``masc-run --segmenter``) the mask columns
are optional: a side whose mask cell is empty or absent gets the segmenter's mask of its image,
prompted by the row's ``object_name`` (jobs/mask_source.py); the output then records each mask's
source (``ref_mask_source`` / ``out_mask_source``: ``file`` or ``segmenter``) and, with
``RunSettings.save_masks``, the PNG each computed mask was saved as (``ref_mask_saved`` /
``out_mask_saved``).

Each score has its own outcome: ``cp_status`` / ``pf_status`` is ``ok`` exactly when that score is
defined, else the reason it is NaN; ``status`` is ``ok`` when both are, else the first reason (CP's,
then PF's). A bad row never stops the run, a defined score is never dropped, and NaN never appears
without its reason:

- both scores (the row cannot be scored): ``prompt_too_long`` / ``object_name_too_long`` (over
  the text budget, checked before the row's files are read or its text tokenized: see
  :class:`RunSettings`); ``missing_file``, ``bad_path`` (a path the operating system refuses: a
  NUL byte, a name too long), ``unreadable_image``, ``unreadable_mask``, ``image_too_large``,
  ``file_too_large`` (over the byte cap, from its size, before it is read);
  ``mask_size_mismatch`` (a mask's size differs from its image's; the reference stretches it);
  ``mask_orientation_mismatch`` (the mask fits the image only rotated by 90 degrees, EXIF); ``bad_row`` (an empty image cell, or an empty mask cell without
  a segmenter); ``no_mask_source`` (no mask and no ``object_name`` to prompt the segmenter with),
  ``mask_prompt_too_long`` (the ``object_name`` is over the segmenter's prompt budget);
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
variant; the segmenter and its recipe when there is one). A rerun of the same command scores only what is missing, and a changed row is scored
again; a rerun with other settings stops, naming what differs, unless asked to replace the
results (``overwrite``). One writer per output (``<out>.lock``); a full disk, a read-only folder
or a refused permission on the output side is one :class:`~.results.OutputWriteError`, and the
journal keeps what was finished (docs/input-policies.md, "Outputs").

Inputs are decoded and reduced to what scoring needs one file at a time (jobs/items.py); the
in-memory path (:meth:`PairsJob.decode_pair`, :meth:`PairsJob.check_pair`,
:meth:`PairsJob.score_decoded`) is what masc-serve calls.
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

from ..engine.backends.registry import get_backend
from ..errors import InputError
from ..runtime.cache import EncodingCache, EncodingStore
from ..runtime.io import default_max_file_bytes, read_bytes
from ..runtime.config import ScorerConfig
from ..runtime.scorer import EncodedPair, Scorer
from ..runtime.segmenter import Segmenter, SegmenterConfig
from ..runtime.text import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_PROMPT_TOKENS, PreparedPrompt, PromptBudget
from .executors import Chunk, LocalExecutor, RayExecutor
from .items import (DecodedImage, DecodedMask, DecodedPair, PairError, array_mask, check_mask, decode_image,
                    decode_mask, reduce_image)
from .loading import ByteBudget, load_all
from .mask_source import MASK_SOURCE_COLUMNS, SAVED_MASK_COLUMNS, SEGMENTER, SegmenterMasks
from .results import (MASK_COUNTERS, Journal, OutputLock, RunRecord, meta_path, output_errors, output_format, resume,
                      write_meta, write_output)
from .tables import DEFAULT_MAX_PAIRS_BYTES, TableError, read_table, resolve_path

REQUIRED_COLUMNS = ("ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name")
FILE_COLUMNS = REQUIRED_COLUMNS[:4]
MASK_COLUMNS = ("ref_mask", "out_mask")
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


def read_pairs(csv_path: str | Path, masks_optional: bool = False,
               max_bytes: int | None = DEFAULT_MAX_PAIRS_BYTES) -> tuple[list[str], list[dict]]:
    """Read a pairs table with the job layer's reader (:func:`~masc_engine.jobs.tables.read_table`;
    CSV: UTF-8, byte-order mark tolerated, quoted commas/newlines allowed).

    Args:
        masks_optional: the mask columns may be absent (a run with a segmenter).
        max_bytes: the file's byte budget (``--max-pairs-mb``), checked before it is read.

    Returns:
        ``(columns, rows)``; the required columns' cells are strings (``""`` for a missing or
        null cell, numbers as text); other columns are carried through as read.

    Raises:
        PairsFileError: the file is missing, over ``max_bytes``, empty, unparsable, or lacks
            required columns (named).
    """
    try:
        required = [c for c in REQUIRED_COLUMNS if not (masks_optional and c in MASK_COLUMNS)]
        t = read_table(csv_path, required, "pairs", extra_fields="ignore", max_bytes=max_bytes,
                       budget_option="--max-pairs-mb")
    except TableError as e:
        hint = ("; without mask columns, give a segmenter (--segmenter): masks from each row's object_name"
                if not masks_optional and "missing column" in e.detail and "_mask" in e.detail.split(";")[0] else "")
        raise PairsFileError(e.reason, e.detail + hint) from None
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
        save_masks: folder for the segmenter's masks as PNGs (jobs/mask_source.py), or ``None``;
            needs a segmenter.
        max_prompt_bytes, max_prompt_tokens: the text budget of a row (masc-serve's defaults,
            runtime/text.py): its prompt and its object name each at most ``max_prompt_bytes``
            UTF-8 bytes, checked before anything is tokenized; the object name and the stripped
            prompt each at most ``max_prompt_tokens`` tokens (the bundle's tokenizer, before
            truncation). Over it: ``prompt_too_long`` / ``object_name_too_long``.
        max_file_bytes: byte cap of a file named as an image or mask, checked from its size
            before it is read (``file_too_large``); None: 4 bytes a pixel of the pixel budget
            plus 16 MiB (runtime/io.py ``default_max_file_bytes``).
    """

    exif: str = "apply"
    min_reference_mask_frac: float | None = None
    min_output_mask_frac: float | None = None
    mask_size_tolerance: int = 0
    baselines: bool = False
    save_maps: str | None = None
    save_masks: str | None = None
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_file_bytes: int | None = None

    def as_dict(self) -> dict:
        """The fields as a dict, ``save_masks`` and the budgets only when not their defaults (what
        the fingerprint hashes and the sidecar records: unchanged for runs without them)."""
        d = asdict(self)
        for k, v in _OPTIONAL_SETTINGS.items():
            if d[k] == v:
                del d[k]
        return d

    def prompt_budget(self) -> PromptBudget:
        """The text budget of a row (:attr:`max_prompt_bytes`, :attr:`max_prompt_tokens`)."""
        return PromptBudget(self.max_prompt_bytes, self.max_prompt_tokens)

    def file_cap(self) -> int:
        """The byte cap of an image or mask file, bytes."""
        return default_max_file_bytes() if self.max_file_bytes is None else int(self.max_file_bytes)

    def result_columns(self, segmenter: bool = False) -> tuple[str, ...]:
        """The result columns a run with these settings (and a segmenter or not) writes, in order."""
        return (RESULT_COLUMNS + (MASK_SOURCE_COLUMNS if segmenter else ()) + (BASELINE_COLUMNS if self.baselines else ())
                + (MAP_COLUMNS if self.save_maps else ()) + (SAVED_MASK_COLUMNS if self.save_masks else ()))

    def _budget_identity(self) -> dict:
        """The budgets set away from their defaults, under their masc-run options."""
        d = {}
        for k, option in _BUDGET_OPTIONS.items():
            v = getattr(self, k)
            if v != _OPTIONAL_SETTINGS[k]:
                d[option] = v / 2**20 if k == "max_file_bytes" else v
        return d

    def identity(self, scorer: Scorer, segmenter: Segmenter | None = None) -> dict:
        """The settings a row's result depends on, each under the masc-run option that sets it
        (``--bundle``, ``--segmenter``: their content fingerprints): what a rerun on the same
        output compares (jobs/results.py ``settings_diff``). The same settings as
        :meth:`fingerprint`."""
        d = {"--bundle": scorer.bundle.fingerprint, "--exif": self.exif, **scorer.config.option_identity(),
             "--min-reference-mask-frac": self.min_reference_mask_frac,
             "--min-output-mask-frac": self.min_output_mask_frac,
             "--mask-size-tolerance": self.mask_size_tolerance, "--baselines": self.baselines,
             "--save-maps": self.save_maps, **self._budget_identity()}
        if segmenter is not None:
            d.update({**segmenter.option_identity(), "--save-masks": self.save_masks})
        return d

    def fingerprint(self, scorer: Scorer, segmenter: Segmenter | None = None) -> str:
        """16 hex digits identifying these settings with the scorer's (a journal is reused only
        under the same fingerprint): the run settings, the bundle's fingerprint, the scorer's
        ``config.identity()`` and, with a segmenter, its ``identity()``.

        Settings added after journals existed (``save_masks``, the segmenter) enter only when they
        are set, so a run without them keeps the fingerprint it always had."""
        d = {"run": self.as_dict(), "bundle": scorer.bundle.fingerprint, **scorer.config.identity()}
        if segmenter is not None:
            d["segmenter"] = segmenter.identity()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


#: Settings recorded (and fingerprinted) only when they differ from these defaults.
_OPTIONAL_SETTINGS = {"save_masks": None, "max_prompt_bytes": DEFAULT_MAX_PROMPT_BYTES,
                      "max_prompt_tokens": DEFAULT_MAX_PROMPT_TOKENS, "max_file_bytes": None}
_BUDGET_OPTIONS = {"max_prompt_bytes": "--max-prompt-bytes", "max_prompt_tokens": "--max-prompt-tokens",
                   "max_file_bytes": "--max-file-mb"}


def row_key(row: dict, base: Path) -> str:
    """Identity of a row's inputs: its cells plus size and mtime of its four files (20 hex digits;
    an empty or absent cell names no file, not the CSV's folder)."""
    h = hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
    for c in FILE_COLUMNS:
        if not (row.get(c) or "").strip():
            h.update(b"|empty")
            continue
        try:
            st = os.stat(resolve_path(base, row[c]))
            h.update(f"|{st.st_size}:{st.st_mtime_ns}".encode())
        except (OSError, ValueError):  # ValueError: a path the OS refuses (a NUL byte): the row's status
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
    #: The segmenter's counters (jobs/mask_source.py), when the run had one.
    masks: dict = field(default_factory=dict)

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
        if self.masks:
            m = self.masks
            out.append(f"  masks: {m.get('masks_segmented', 0)} segmented ({m.get('segmenter_images_encoded', 0)} images "
                       f"through the segmenter), {m.get('mask_cache_hits', 0)} from the cache")
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

    def take_stats(self, stats: dict) -> None:
        """Take an executor's counters (``stats()``) into the summary."""
        self.images_encoded, self.cache_hits = stats.get("images_encoded", 0), stats.get("cache_hits", 0)
        self.lost_workers = stats.get("lost_workers", 0)
        self.masks = {k: stats[k] for k in MASK_COUNTERS if k in stats}

    def counts(self) -> dict:
        """The counts recorded in ``<out>.meta.json``."""
        return {"rows": self.rows, "ok": self.ok, "resumed": self.resumed, "statuses": dict(self.statuses),
                "duplicate_rows": len(self.duplicates), "images_encoded": self.images_encoded,
                "cache_hits": self.cache_hits}


class PairsJob:
    """Score rows of a pairs file, or in-memory pairs, with one :class:`Scorer`.

    Every pair goes through :meth:`score_decoded`: masc-run's rows (:meth:`score_rows`, files
    decoded by path in :meth:`load`), one in-memory pair (:meth:`score_item`) and masc-serve's
    request items (:meth:`decode_pair` in its decode threads, then :meth:`score_decoded` on a
    micro-batch) get the same statuses, notes and scores.

    Each distinct image (by content) is encoded once: ``cache`` (an
    :class:`~masc_engine.runtime.cache.EncodingCache`, by default an LRU of ``cache_items``
    encodings in front of ``store``, a persistent content-keyed store shared across runs and
    processes). Files are decoded and reduced (jobs/items.py) by ``io_workers`` threads, each
    file under ``decode_budget`` when one is given.

    With a ``segmenter``, a pair without a mask (an empty or absent mask cell, a ``None`` mask)
    gets the segmenter's mask of its image for its ``object_name``
    (:class:`~masc_engine.jobs.mask_source.SegmenterMasks`: an in-memory LRU, then the
    persistent store, then the segmenter), computed while the image is decoded.

    Raises:
        ValueError: ``settings.save_masks`` without a segmenter.
    """

    def __init__(self, scorer: Scorer, settings: RunSettings = RunSettings(), store: EncodingStore | None = None,
                 io_workers: int = 4, cache_items: int = 512, cache: EncodingCache | None = None,
                 decode_budget: ByteBudget | None = None, segmenter: Segmenter | None = None):
        if settings.save_masks is not None and segmenter is None:
            raise ValueError("save_masks (--save-masks) needs a segmenter (--segmenter)")
        self.scorer = scorer
        self.settings = settings
        self.io_workers = io_workers
        self.cache = cache if cache is not None else EncodingCache(scorer, cache_items, store)
        self.decode_budget = decode_budget
        #: The segmenter's masks for pairs without one, or None (every mask from a file).
        self.masks = None if segmenter is None else SegmenterMasks(
            segmenter, settings.exif, store if store is not None else self.cache.store, settings.save_masks)

    @property
    def images_encoded(self) -> int:
        """Images that went through the vision tower for this job."""
        return self.cache.images_encoded

    @property
    def cache_hits(self) -> int:
        """Images served from the disk store for this job."""
        return self.cache.cache_hits

    def stats(self) -> dict:
        """``{"images_encoded", "cache_hits"}`` since this job was made (executor interface), and
        with a segmenter its counters (``masks_segmented``, ``mask_cache_hits``,
        ``segmenter_images_encoded``)."""
        st = {"images_encoded": self.cache.images_encoded, "cache_hits": self.cache.cache_hits}
        if self.masks is not None:
            st.update(self.masks.stats())
        return st

    # ---------------------------------------------------------------- decoding

    def _image(self, v, name: str, subjects=()) -> DecodedImage | InputError:
        """Image bytes or a PIL image -> :class:`DecodedImage` (segmented for ``subjects``), or
        the :class:`InputError`."""
        keep = self.settings.save_maps is not None
        try:
            if isinstance(v, (bytes, bytearray, memoryview)):
                return decode_image(bytes(v), name, self.scorer, self.cache, self.settings.exif, self.decode_budget,
                                    keep_image=keep, masks=self.masks, subjects=subjects)
            return reduce_image(v, name, self.scorer, self.cache, keep_image=keep, masks=self.masks, subjects=subjects)
        except InputError as e:
            return e

    def _subject_error(self, subject: str) -> InputError | None:
        """Why the segmenter cannot make a mask for ``subject`` (``no_mask_source`` without a
        segmenter or a subject name, ``mask_prompt_too_long``), or None."""
        if self.masks is None:
            return InputError("no_mask_source", "no mask given, and no segmenter to compute one (--segmenter)")
        try:
            self.masks.prompt(subject)
        except InputError as e:
            return e
        return None

    def _segmented(self, image, subject: str) -> DecodedMask | InputError:
        """The segmenter's mask of a decoded image for ``subject`` (or why there is none)."""
        e = self._subject_error(subject)
        if e is not None:
            return e
        if not isinstance(image, DecodedImage):
            return image  # the image's own error (check_pair reports the image first)
        return image.segmented[subject]

    def _mask(self, v, name: str, grids) -> DecodedMask | InputError:
        """Mask bytes or a ``[H, W] uint8`` array -> :class:`DecodedMask` on ``grids``, or the error."""
        try:
            if isinstance(v, (bytes, bytearray, memoryview)):
                return decode_mask(bytes(v), name, grids, self.settings.exif, self.decode_budget)
            return array_mask(v, name, grids)
        except InputError as e:
            return e

    def _sides(self, row: dict, base) -> list[tuple[str, str | None]] | None:
        """A row's ``(image path, mask path)`` per side (mask ``None``: the segmenter's), or None
        when the row is a ``bad_row`` (an empty image cell; an empty mask cell and no segmenter)."""
        sides = []
        for im_c, m_c in (("ref_image", "ref_mask"), ("out_image", "out_mask")):
            image, mask = (row.get(im_c) or "").strip(), (row.get(m_c) or "").strip()
            if not image or (not mask and self.masks is None):
                return None
            sides.append((resolve_path(base, row[im_c]), resolve_path(base, row[m_c]) if mask else None))
        return sides

    def _text_error(self, prompt: str, subject: str) -> InputError | None:
        """``prompt_too_long`` / ``object_name_too_long`` for text over the byte budget (nothing
        tokenized; a text with more characters than the budget has bytes is not even encoded)."""
        budget = self.settings.prompt_budget()
        for name, text, reason in (("prompt", prompt, "prompt_too_long"),
                                   ("object_name", subject, "object_name_too_long")):
            try:
                budget.check_text(text, name)
            except InputError as e:
                return InputError(reason, f"{e.detail} (--max-prompt-bytes)")
        return None

    def prepare_text(self, prompt: str, subject: str) -> PreparedPrompt | InputError:
        """A row's PF prompt stripped and tokenized, once its prompt and object name are within the
        byte budget and the object name and the stripped prompt within the token budget; else the
        row's ``prompt_too_long`` / ``object_name_too_long``."""
        e = self._text_error(prompt, subject)
        if e is not None:
            return e
        budget = self.settings.prompt_budget()
        if subject.strip():
            n = self.scorer.tokenizer.encode([subject])[0].n_tokens
            if n > budget.max_tokens:
                return InputError("object_name_too_long", f"object_name: {n} tokens, over the budget of "
                                                          f"{budget.max_tokens} tokens (--max-prompt-tokens)")
        prepared = self.scorer.prepare_prompt(prompt, subject or None)
        try:
            budget.check_tokens(prepared, "prompt")
        except InputError as e:
            return InputError(e.reason, f"{e.detail} (--max-prompt-tokens)")
        return prepared

    def load(self, rows, base: str | Path) -> tuple[dict, dict, dict]:
        """Check and prepare the rows' text (:meth:`prepare_text`, once per distinct prompt and
        object name), then, for the rows whose text is within budget, decode the distinct images
        (each segmented for the subject names of its mask-less rows), then the distinct masks
        (onto the grids of the images they are paired with): ``(images, masks, texts)``, images
        and masks by path, texts by ``(prompt, object_name)``, each value a
        :class:`DecodedImage` / :class:`DecodedMask` / :class:`PreparedPrompt` or the
        :class:`InputError` it raised."""
        paired: dict[str, set[str]] = defaultdict(set)  # mask path -> its images' paths
        subjects: dict[str, set[str]] = defaultdict(set)  # image path -> subject names to segment it for
        image_paths: set[str] = set()
        texts: dict[tuple[str, str], PreparedPrompt | InputError] = {}
        for row in rows:
            subject = row.get("object_name") or ""
            text = _row_text(row)
            if text not in texts:
                texts[text] = self.prepare_text(*text)
            if isinstance(texts[text], InputError):
                continue  # the row's status: none of its files is read
            for image, mask in self._sides(row, base) or ():
                image_paths.add(image)
                if mask is not None:
                    paired[mask].add(image)
                elif self._subject_error(subject) is None:
                    subjects[image].add(subject)

        cap = self.settings.file_cap()

        def image(p: str) -> DecodedImage:
            return _raise(self._image(read_bytes(p, "image", cap), p, sorted(subjects.get(p, ()))))

        images = load_all(image_paths, image, self.io_workers)

        def mask(p: str) -> DecodedMask:
            grids = {images[i].grid for i in paired[p] if isinstance(images[i], DecodedImage)}
            return _raise(self._mask(read_bytes(p, "mask", cap), p, sorted(grids)))

        return images, load_all(paired, mask, self.io_workers), texts

    def decode_pair(self, files: dict, prompt: str, object_name: str | None = None, names: dict | None = None,
                    stripper: str | None = None, row_index: int = 1, cells: dict | None = None) -> DecodedPair:
        """Decode one in-memory pair (each file an independent result, as masc-run's loader) and
        make its PF prompt ready (stripped with ``stripper``, tokenized): everything but
        inference, for a thread other than the one that batches inference.

        Args:
            files: ``ref_image``/``out_image`` -> encoded image bytes or a PIL image;
                ``ref_mask``/``out_mask`` -> encoded mask bytes or a ``[H, W] uint8`` array, or
                None / absent: the segmenter's mask for ``object_name`` (``no_mask_source``
                without a segmenter or a subject name).
            prompt, object_name: the pair's prompt and subject (None or ``""``: not stripped).
            names: how each file is named in messages (default: the field name).
            stripper: ``regex``, ``spacy`` or ``none`` (default: the scorer's).
            row_index, cells: the record's ``row_index`` and other cells to carry through.

        Returns:
            a :class:`DecodedPair`; a bad file is that file's :class:`InputError` in it, never an
            exception.
        """
        names = {**{c: c for c in FILE_COLUMNS}, **(names or {})}
        subject = object_name or ""
        decoded, sources = {}, []
        for im_c, m_c in (("ref_image", "ref_mask"), ("out_image", "out_mask")):
            given = files.get(m_c) is not None
            segment = not given and self._subject_error(subject) is None
            im = self._image(files[im_c], names[im_c], [subject] if segment else ())
            decoded[im_c] = im
            if given:
                decoded[m_c] = self._mask(files[m_c], names[m_c], [im.grid] if isinstance(im, DecodedImage) else [])
            else:
                decoded[m_c] = self._segmented(im, subject)
            sources.append("file" if given else (SEGMENTER if segment else ""))
        prepared = self.scorer.prepare_prompt(prompt or "", object_name or None, stripper)
        return DecodedPair(**decoded, prompt=prompt or "", object_name=subject, names=names, prepared=prepared,
                           row_index=row_index, cells=dict(cells or {}), mask_sources=tuple(sources))

    # ---------------------------------------------------------------- encoding

    def encode(self, images: list[DecodedImage]) -> dict:
        """Encodings by content hash; only images in neither cache level go through the vision tower."""
        encs: dict = {}
        sources: dict = {}
        for d in images:
            if d.encoding is not None:
                encs[d.sha256] = d.encoding
        for d in images:
            if d.sha256 not in encs:
                sources.setdefault(d.sha256, d.pre)
        encs.update(self.cache.encode(sources))
        return encs

    # ---------------------------------------------------------------- scoring

    def _save_maps(self, row_index: int, ref: DecodedImage, out: DecodedImage, it: EncodedPair, sc) -> dict:
        """Write the pair's CP and PF overlays; returns their paths (absolute; run_pairs makes
        them relative to the output file).

        Raises:
            OutputWriteError: the maps folder cannot be written (full, read-only, no permission).
        """
        from ..runtime.maps import cp_map, pf_map

        d = Path(self.settings.save_maps)
        cp_path, pf_path = d / f"{row_index:07d}_cp.png", d / f"{row_index:07d}_pf.png"
        with output_errors(d, "--save-maps folder"):
            d.mkdir(parents=True, exist_ok=True)
            cp_map(ref.image, it.ref_enc.grid, sc.arrays["cp_best"], it.ref_weights, self.scorer.fg_threshold).save(cp_path)
            pf_map(out.image, it.out_enc.grid, sc.arrays["pf_attention"], sc.arrays["pf_hidden"]).save(pf_path)
        return {"cp_map": str(cp_path.resolve()), "pf_map": str(pf_path.resolve())}

    def score_rows(self, rows: list[dict], base: str | Path, first_index: int = 1, loaded=None,
                   indices: list[int] | None = None) -> list[dict]:
        """Score rows; ``indices`` are their 1-based row indices (default ``first_index``,
        ``first_index + 1``, ...). Results in input order."""
        images, masks, texts = loaded if loaded is not None else self.load(rows, base)
        indices = indices if indices is not None else list(range(first_index, first_index + len(rows)))
        return self.score_decoded([self._row_pair(i, row, base, images, masks, texts[_row_text(row)])
                                   for i, row in zip(indices, rows)])

    def _row_pair(self, index: int, row: dict, base, images: dict, masks: dict,
                  text: PreparedPrompt | InputError) -> DecodedPair:
        """One row's :class:`DecodedPair` from the loaded files and its prepared ``text`` (the
        text's error first: its files were not read; then a ``bad_row`` for an empty cell the run
        cannot fill)."""
        prompt, obj = _row_text(row)
        if isinstance(text, InputError):
            return DecodedPair(text, text, text, text, prompt, obj, row_index=index, cells=row, error=text)
        sides = self._sides(row, base)
        if sides is None:
            empty = [c for c in FILE_COLUMNS if not (row.get(c) or "").strip()]
            e = InputError("bad_row", f"empty column(s): {', '.join(empty)}")
            return DecodedPair(e, e, e, e, prompt, obj, row_index=index, cells=row, error=e)
        objs, names, sources = {}, {}, []
        for (image, mask), im_c, m_c in zip(sides, ("ref_image", "out_image"), ("ref_mask", "out_mask")):
            names[im_c], objs[im_c] = image, images[image]
            if mask is not None:
                names[m_c], objs[m_c] = mask, masks[mask]
            else:
                names[m_c], objs[m_c] = f"segmenter mask of {image}", self._segmented(images[image], obj)
            sources.append("file" if mask is not None else (SEGMENTER if self._subject_error(obj) is None else ""))
        return DecodedPair(**objs, prompt=prompt, object_name=obj, names=names, prepared=text, row_index=index,
                           cells=row, mask_sources=tuple(sources))

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
            ref_image, out_image (bytes | PIL.Image.Image): encoded image bytes (PNG, JPEG, ...) or a PIL image (converted
                to RGB; an 8-bit image is used as it is).
            ref_mask, out_mask (bytes | numpy.ndarray): encoded mask bytes, or a ``[H, W]`` uint8 array (foreground
                non-zero), as masc-run decodes mask files.
            prompt, object_name: the row's ``prompt`` and ``object_name`` cells.
            row_index: the record's ``row_index`` (a service's request item number).
            extra: other cells to carry through (as a pairs file's extra columns).

        Returns:
            a dict with ``RESULT_COLUMNS`` (``row_key`` empty) and the carried cells; a bad input
            gives its status and detail (naming the field), never an exception.
        """
        cells = {**(extra or {}), **{c: c for c in FILE_COLUMNS}, "prompt": prompt, "object_name": object_name}
        files = {"ref_image": ref_image, "ref_mask": ref_mask, "out_image": out_image, "out_mask": out_mask}
        res = self.score_decoded([self.decode_pair(files, prompt, object_name, row_index=row_index, cells=cells)])[0]
        res["row_key"] = ""
        return res

    def check_pair(self, item: DecodedPair) -> list[str]:
        """Whether a decoded pair can be scored (before any inference): its notes if so.

        Raises:
            PairError: a file that could not be read, a mask whose size does not fit its image
                (``mask_size_mismatch``, ``mask_orientation_mismatch``) or an empty cell
                (``bad_row``); ``field`` names the file at fault.
        """
        if item.error is not None:
            raise PairError(item.error.reason, item.error.detail, None)
        for c in FILE_COLUMNS:
            e = item.file(c)
            if isinstance(e, InputError):  # name the column: the same file can be in two
                raise PairError(e.reason, e.detail if c in e.detail else f"{c}: {e.detail}", c)
        st, notes = self.settings, []
        for im_c, m_c, what in (("ref_image", "ref_mask", "reference"), ("out_image", "out_mask", "output")):
            try:
                notes.append(check_mask(item.file(im_c), item.file(m_c), what, item.names[m_c],
                                        st.mask_size_tolerance, st.exif))
            except InputError as e:
                raise PairError(e.reason, e.detail, m_c) from None
        return [n for n in notes if n] + list(item.ref_image.notes) + list(item.out_image.notes)

    def score_decoded(self, items: list[DecodedPair], stripper: str | None = None) -> list[dict]:
        """Score decoded pairs; one masc-run record per item, in order.

        Each score gets its own outcome (``cp_status``, ``pf_status``; ``status`` is the first
        that is not ``ok``): a pair that cannot be read costs both, a reference mask without a
        usable foreground costs CP only, an output mask hiding every patch costs PF only. Results
        do not depend on which other items are in the call (batches of one patch count only,
        Scorer.encode_preprocessed).

        Args:
            items: pairs from :meth:`decode_pair` or :meth:`load`.
            stripper: PF prompt stripper for items whose prompt is not ``prepared`` (default: the
                scorer's).

        Returns:
            dicts with the item's ``cells``, ``row_index`` and the result columns; NaN scores
            where undefined, with their status (:meth:`RowOutcome.record`).
        """
        outcomes = [RowOutcome(it) for it in items]
        if self.masks is not None:
            for o in outcomes:
                o.values.update(self._mask_columns(o.item))
        encs = self.encode([o for it in items for o in (it.ref_image, it.out_image) if isinstance(o, DecodedImage)])
        ready = [o for o in outcomes if self._admit(o, encs)]
        scored = self.scorer.score_encoded([o.pair for o in ready], baselines=self.settings.baselines,
                                           with_arrays=self.settings.save_maps is not None, stripper=stripper)
        for o, sc in zip(ready, scored):
            self._fill(o, sc)
        return [o.record() for o in outcomes]

    def _mask_columns(self, it: DecodedPair) -> dict:
        """A pair's mask source columns (and with ``save_masks`` the saved PNGs of its segmenter masks)."""
        d = dict(zip(MASK_SOURCE_COLUMNS, it.mask_sources))
        if self.settings.save_masks is not None:
            for col, m in zip(SAVED_MASK_COLUMNS, (it.ref_mask, it.out_mask)):
                d[col] = m.saved if isinstance(m, DecodedMask) else ""
        return d

    def _admit(self, o: RowOutcome, encs: dict) -> bool:
        """Check one pair (files, masks, the coverage filter) and make its :class:`EncodedPair`;
        False (with the row's failure in ``o``) when it cannot be scored."""
        st, it = self.settings, o.item
        try:
            o.notes = list(self.check_pair(it))
            o.coverage = (it.ref_mask.coverage, it.out_mask.coverage)
            for frac, cov, reason, what in (
                    (st.min_reference_mask_frac, it.ref_mask.coverage, "filtered_reference_mask", "reference"),
                    (st.min_output_mask_frac, it.out_mask.coverage, "filtered_output_mask", "output")):
                if frac is not None and cov < frac:
                    raise InputError(reason, f"{what} mask covers {cov:.2%} < {frac:.2%} of the image")
            r, out = encs[it.ref_image.sha256], encs[it.out_image.sha256]
            o.pair = EncodedPair(r, it.ref_mask.weights[r.grid], out, it.out_mask.weights[out.grid], it.prompt,
                                 it.object_name or None, it.prepared)
            return True
        except InputError as e:
            o.fail(e)
            return False

    def _fill(self, o: RowOutcome, sc) -> None:
        """Put one scored pair's values, statuses and notes into its outcome."""
        s, st, ex, it, pair = self.scorer, self.settings, sc.extras, o.item, o.pair
        o.cp, o.pf = sc.cp, sc.pf
        o.values.update({k: ex[k] for k in SCORED_COLUMNS})
        if st.baselines:
            o.values.update({k: ex[k] for k in BASELINE_COLUMNS})
        if st.save_maps is not None:
            o.values.update(self._save_maps(it.row_index, it.ref_image, it.out_image, pair, sc))
        if math.isnan(sc.cp):
            if not it.ref_mask.any_foreground:
                o.cp_status = "empty_reference_mask"
                o.notes.append(f"{it.names['ref_mask']} has no foreground pixel: CP undefined, PF scored")
            else:
                g = pair.ref_enc.grid
                o.cp_status = "reference_mask_below_threshold"
                o.notes.append(f"{it.names['ref_mask']}: no patch of the {g[0]}x{g[1]} grid has mask weight > "
                               f"{s.fg_threshold}: CP undefined, PF scored")
        if math.isnan(sc.pf):
            o.pf_status = "no_background"
            o.notes.append("the output mask hides every patch: PF undefined, CP scored")
        if not it.object_name.strip():
            o.notes.append("no object_name: the PF prompt was not stripped")
        if not ex["prompt_text"].strip():
            o.prompt_empty = True
            o.notes.append("prompt_empty: PF compares with an empty text" + (
                "" if not it.prompt.strip() else f" (the prompt is only the subject {it.object_name!r})"))
        if ex["prompt_truncated"]:
            o.notes.append(f"prompt truncated to {s.text_settings.max_length} tokens")


#: Result columns every scored pair fills from its ``MaSCResult.extras``, in order.
SCORED_COLUMNS = ("prompt_text", "prompt_stripped", "prompt_truncated", "cp_n_ref_fg", "cp_n_ref_total",
                  "pf_n_bg_pooled", "pf_n_total")


@dataclass
class RowOutcome:
    """One pair's result while :meth:`PairsJob.score_decoded` works on it.

    Attributes:
        item: the decoded pair.
        cp, pf: the scores (NaN until scored, or where undefined).
        cp_status, pf_status: ``ok`` or why that score is undefined.
        notes: the parts of ``status_detail`` (conversions, notes, why a score is undefined).
        prompt_empty: PF compared with an empty text.
        coverage: ``(reference, output)`` mask coverage, once the masks were checked.
        values: the other result columns (:data:`SCORED_COLUMNS`, baselines, map paths).
        pair: the pair ready for the heads, once admitted.
        error: the failure that keeps the row from being scored (both scores), if any.
    """

    item: DecodedPair
    cp: float = float("nan")
    pf: float = float("nan")
    cp_status: str = "ok"
    pf_status: str = "ok"
    notes: list = field(default_factory=list)
    prompt_empty: bool = False
    coverage: tuple[float, float] | None = None
    values: dict = field(default_factory=dict)
    pair: EncodedPair | None = None
    error: InputError | None = None

    def fail(self, e: InputError) -> None:
        """The row cannot be scored: both scores get ``e``'s reason, ``status_detail`` its detail."""
        self.error = e
        self.cp_status = self.pf_status = e.reason

    @property
    def status(self) -> str:
        """``ok``, or the first reason a score is undefined (CP's, then PF's)."""
        return next((x for x in (self.cp_status, self.pf_status) if x != "ok"), "ok")

    def record(self) -> dict:
        """The row's masc-run record: the item's cells, ``row_index`` and the result columns."""
        it = self.item
        detail = self.error.detail if self.error is not None else "; ".join(n for n in self.notes if n)
        rec = {**it.cells, "row_index": it.row_index, "cp": self.cp, "pf": self.pf, "status": self.status,
               "status_detail": detail, "cp_status": self.cp_status, "pf_status": self.pf_status,
               "prompt_empty": self.prompt_empty}
        if self.coverage is not None:
            rec["ref_mask_coverage"], rec["out_mask_coverage"] = self.coverage
        rec.update(self.values)
        return rec


def _row_text(row: dict) -> tuple[str, str]:
    """A row's ``(prompt, object_name)`` cells (``""`` when empty)."""
    return row.get("prompt") or "", row.get("object_name") or ""


def _raise(v):
    """A loader's result, raising it when it is an :class:`InputError` (load_all keeps it)."""
    if isinstance(v, InputError):
        raise v
    return v


def build_pairs_job(bundle_dir: str, config: ScorerConfig, settings: dict, io_workers: int,
                    cache_dir: str | None = None, cache_size_limit: int | None = None,
                    segmenter: SegmenterConfig | None = None) -> PairsJob:
    """A :class:`PairsJob` on a fresh scorer with the driver's resolved ``config`` (and a fresh
    segmenter from the driver's resolved ``segmenter`` config): the factory Ray workers call
    (picklable through :func:`functools.partial`, so executors need not know this module). The
    bundles are loaded unverified: the driver hashed the files the workers load. With
    ``cache_dir`` the worker reads and writes the same persistent store as the driver (diskcache
    is safe across processes; on several nodes the folder must be shared storage)."""
    scorer = Scorer(bundle_dir, config, verify=False)
    run_settings = RunSettings(**settings)
    store = RunOptions(cache_dir=cache_dir, cache_size_limit=cache_size_limit).store(scorer, run_settings.exif)
    scorer.text_store = store
    seg = None if segmenter is None else segmenter.load(verify=False)
    return PairsJob(scorer, run_settings, store=store, io_workers=io_workers, segmenter=seg)


def _ray_factory(scorer: Scorer, settings: RunSettings, io_workers: int, cache_dir=None, cache_size_limit=None,
                 segmenter: Segmenter | None = None):
    if scorer.bundle.verify:
        # The workers load the bundle unverified (one hash per run, not per worker): the driver
        # checks every graph file (and weights) they will load, the text graph included, which the
        # driver itself may never load. (TensorRT engines are hashed by their loader.)
        for g in ("vision", "pool", "text", "cp"):
            scorer.bundle.graph_file(g, scorer.config.graph_variant)
    if segmenter is not None and segmenter.bundle.verify:
        segmenter.check_graphs()
    return functools.partial(build_pairs_job, str(Path(scorer.bundle.path).resolve()), scorer.config, settings.as_dict(),
                             io_workers, None if cache_dir is None else str(Path(cache_dir).resolve()), cache_size_limit,
                             None if segmenter is None else segmenter.config)


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
    return {"bundle": scorer.bundle.fingerprint, "exif": exif, **scorer.config.encoding_identity()}


@dataclass(frozen=True)
class RunOptions:
    """How :func:`run_pairs` runs (none of these changes a row's result).

    Attributes:
        chunk_size: rows decoded, scored and journaled per step.
        io_workers: decoding threads per job.
        cache_dir: the persistent encoding store's folder (``--cache-dir``), or None.
        cache_size_limit: its bound in bytes (None: the store's default).
        executor: ``local`` or ``ray``.
        ray_address, ray_workers: the Ray cluster and its number of actors.
        progress: draw a progress bar.
        overwrite: replace results made with other settings.
        max_pairs_bytes: the pairs file's byte budget (``--max-pairs-mb``; None: none).
    """

    chunk_size: int = 64
    io_workers: int = 4
    cache_dir: str | None = None
    cache_size_limit: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    ray_workers: int | None = None
    progress: bool = True
    overwrite: bool = False
    max_pairs_bytes: int | None = DEFAULT_MAX_PAIRS_BYTES

    def store(self, scorer: Scorer, exif: str) -> EncodingStore | None:
        """The persistent encoding store these options name, or None."""
        if self.cache_dir is None:
            return None
        return EncodingStore(self.cache_dir, encoding_namespace(scorer, exif),
                             **({"size_limit": self.cache_size_limit} if self.cache_size_limit else {}))


def run_pairs(csv_path: str | Path, scorer: Scorer, out_path: str | Path, settings: RunSettings = RunSettings(),
              chunk_size: int = 64, io_workers: int = 4, cache_dir: str | Path | None = None,
              cache_size_limit: int | None = None, executor: str = "local", ray_address: str | None = None,
              ray_workers: int | None = None, progress: bool = True, log=print, overwrite: bool = False,
              segmenter: Segmenter | None = None, max_pairs_bytes: int | None = DEFAULT_MAX_PAIRS_BYTES) -> Summary:
    """Score every row of ``csv_path`` into ``out_path`` (format by extension), resumably.

    With a ``segmenter`` the mask columns are optional: a side without a mask gets the segmenter's
    mask for the row's ``object_name`` (module docstring), cached in ``cache_dir``'s store too.

    One writer per output: the run holds ``<out>.lock`` (jobs/results.py :class:`OutputLock`)
    from before it reads anything at ``out_path`` until the output is complete. Rows already in
    the journal (or in a complete previous output) with the same ``row_key`` are not scored
    again, provided the results there were made with the same settings; results made with other
    settings are neither reused nor replaced unless ``overwrite`` (then the run starts afresh).
    Decoding of the next chunk overlaps inference on the current one. The keyword arguments are
    the fields of :class:`RunOptions`.

    Raises:
        PairsFileError: the pairs file is unusable or over ``max_pairs_bytes`` (nothing is written
            then).
        ValueError: an unsupported output extension.
        OutputBusyError: another run holds the output's lock (nothing is written).
        SettingsChangedError: results at ``out_path`` were made with other settings, named in the
            message, and ``overwrite`` is False (nothing is written).
        OutputWriteError: the output, journal, sidecar or maps cannot be written (full disk,
            read-only, permission); the rows journaled so far are kept for the next run.
    """
    out_path = Path(out_path)
    output_format(out_path)
    opts = RunOptions(chunk_size, io_workers, None if cache_dir is None else str(cache_dir), cache_size_limit,
                      executor, ray_address, ray_workers, progress, overwrite, max_pairs_bytes)
    with OutputLock(out_path):
        return _run_locked(Path(csv_path), scorer, out_path, settings, opts, log, segmenter)


def _run_locked(csv_path: Path, scorer: Scorer, out_path: Path, settings: RunSettings, opts: RunOptions,
                log, segmenter: Segmenter | None) -> Summary:
    """The run, once the output's lock is held: resume, score what is missing, write the output."""
    t0 = time.time()
    if settings.save_masks is not None and segmenter is None:
        raise ValueError("save_masks (--save-masks) needs a segmenter (--segmenter)")
    fieldnames, rows = read_pairs(csv_path, masks_optional=segmenter is not None, max_bytes=opts.max_pairs_bytes)
    base = csv_path.resolve().parent
    keys = [row_key(r, base) for r in rows]
    summary = Summary(duplicates=_duplicates(rows))
    journal = Journal(out_path)
    prior = resume(journal, settings.fingerprint(scorer, segmenter), settings.identity(scorer, segmenter), keys,
                   str(csv_path), opts.overwrite, log)
    summary.journal_repaired, summary.resumed = prior.repaired, len(prior.done)
    done = prior.done
    todo = [i for i in range(1, len(rows) + 1) if i not in done]
    # Chunks are runs of consecutive row indices only where nothing was done.
    chunks = [Chunk(tuple(c), tuple(rows[i - 1] for i in c), tuple(keys[i - 1] for i in c), str(base))
              for c in (todo[i:i + opts.chunk_size] for i in range(0, len(todo), opts.chunk_size))]
    store = opts.store(scorer, settings.exif)
    if store is not None:
        scorer.text_store = store
    try:
        runner = choose_executor(scorer, settings, opts, store, segmenter)
        run = RunRecord(prior.next_run, t0, runner, opts.executor, summary.resumed)
        _score_chunks(runner, chunks, journal, run, done, len(rows), opts.progress)
    finally:
        if store is not None:
            store.close()
            scorer.text_store = None
    summary.take_stats(runner.stats())  # Ray: summed over the workers' reports
    _write_output(out_path, settings.result_columns(segmenter is not None), fieldnames, rows, done, summary)
    summary.seconds = time.time() - run.t0
    write_sidecar(csv_path, scorer, out_path, settings, summary, prior.earlier_runs, run,
                  {"executor": opts.executor, "chunk_size": opts.chunk_size}, segmenter)
    journal.remove()  # last: a fault before this leaves the journal, and the same command finishes the job
    return summary


def choose_executor(scorer: Scorer, settings: RunSettings, opts: RunOptions, store: EncodingStore | None,
                    segmenter: Segmenter | None = None):
    """The executor ``opts.executor`` names (jobs/executors.py): a :class:`LocalExecutor` over one
    :class:`PairsJob` on ``scorer``, ``store`` and ``segmenter``, or a :class:`RayExecutor` whose
    workers each build their own job (:func:`build_pairs_job`: the same settings, store folder and
    resolved scorer and segmenter configs), on a GPU slot when the scorer's backend computes on one."""
    if opts.executor == "ray":
        factory = _ray_factory(scorer, settings, opts.io_workers, opts.cache_dir, opts.cache_size_limit, segmenter)
        return RayExecutor(factory, gpu=get_backend(scorer.backend).is_gpu(scorer.provider), address=opts.ray_address,
                           workers=opts.ray_workers)
    return LocalExecutor(PairsJob(scorer, settings, store=store, io_workers=opts.io_workers, segmenter=segmenter))


def _duplicates(rows: list[dict]) -> list[tuple[int, int]]:
    """``(row, first row with the same cells)`` for each repeated input row (1-based)."""
    seen: dict[str, int] = {}
    dups = []
    for i, r in enumerate(rows, start=1):
        k = json.dumps(r, sort_keys=True)
        if k in seen:
            dups.append((i, seen[k]))
        else:
            seen[k] = i
    return dups


def _score_chunks(runner, chunks: list[Chunk], journal: Journal, run: RunRecord, done: dict, total: int,
                  progress: bool) -> None:
    """Score the chunks, journaling each one's rows (tagged with the run) and then the run's figures."""
    from tqdm import tqdm

    # disable=None: tqdm draws only when stderr is a terminal (a log file or pipe gets no bar lines)
    bar = tqdm(total=total, initial=len(done), unit="pair", disable=None if progress else True, desc="masc-run")
    try:
        for results in runner.run(chunks):
            run.scored += len(results)
            # The run's figures so far travel in the journal, so a killed run's work stays on record.
            journal.append(results, run)
            for r in results:
                done[int(r["row_index"])] = r
            bar.update(len(results))
    finally:
        bar.close()


def _write_output(out_path: Path, result_cols: tuple[str, ...], fieldnames: list[str], rows: list[dict],
                  done: dict, summary: Summary) -> None:
    """Write the output in input order (input columns, then ``result_cols``) and count each row
    into ``summary``; map and saved-mask paths relative to the output's folder."""
    method_col = "method" if "method" in fieldnames else None
    ordered = []
    for i in range(1, len(rows) + 1):
        r = {**rows[i - 1], **{k: v for k, v in done[i].items() if k in result_cols}}
        r["cp"], r["pf"] = _num(r.get("cp")), _num(r.get("pf"))
        for k in MAP_COLUMNS + SAVED_MASK_COLUMNS:
            if r.get(k) and os.path.isabs(r[k]):
                r[k] = os.path.relpath(r[k], out_path.resolve().parent)
        ordered.append(r)
        summary.add(r, r.get(method_col) if method_col else None)
    columns = fieldnames + [c for c in result_cols if c not in fieldnames]
    with output_errors(out_path, "output"):
        write_output(out_path, ordered, columns)


def write_sidecar(csv_path: Path, scorer: Scorer, out_path: Path, settings: RunSettings, summary: Summary,
                  earlier_runs: list[dict], run: RunRecord, how: dict, segmenter: Segmenter | None = None) -> dict:
    """Write ``<out>.meta.json`` (:func:`sidecar`) with this run's finished record appended to
    the earlier runs'; returns it.

    Raises:
        OutputWriteError: the sidecar cannot be written.
    """
    this_run = {k: v for k, v in run(True).items() if k != "type"}
    this_run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = sidecar(csv_path, scorer, out_path, settings, summary, earlier_runs + [this_run], how, segmenter)
    with output_errors(meta_path(out_path), "sidecar"):
        write_meta(meta_path(out_path), meta)
    return meta


def sidecar(csv_path: Path, scorer: Scorer, out_path: Path, settings: RunSettings, summary: Summary,
            all_runs: list[dict], how: dict, segmenter: Segmenter | None = None) -> dict:
    """The sidecar ``<out>.meta.json``: cumulative over every run that produced this output (a
    resumed or repeated command adds its record to ``runs`` and never erases what the earlier
    ones measured). With a segmenter it is described under ``segmenter`` (its bundle, identity and
    the whole mask recipe) and its counters are summed under ``counts``."""
    total_s = sum(float(r.get("seconds") or 0.0) for r in all_runs)
    total_scored = sum(int(r.get("rows_scored") or 0) for r in all_runs)
    counts = summary.counts()
    counted = ("images_encoded", "cache_hits") + (MASK_COUNTERS if segmenter is not None else ())
    counts.update({k: sum(int(r.get(k) or 0) for r in all_runs) for k in counted})
    b = scorer.bundle
    meta = {"fingerprint": settings.fingerprint(scorer, segmenter), "identity": settings.identity(scorer, segmenter),
            "input": str(csv_path.resolve()), "output": str(out_path.resolve()), "bundle": str(b.path),
            "bundle_fingerprint": b.fingerprint, "source_model": b.manifest["source"],
            "bundle_versions": b.manifest.get("versions"), "runtime_versions": _versions(),
            "settings": {**settings.as_dict(), **scorer.config.to_dict(), **how},
            # Reduced precision (fp16/bf16/int8 graphs, bf16 on OpenVINO): what the scores are certified to.
            "precision_certificate": _certificate_summary(scorer.certificate),
            "counts": counts, "seconds": round(total_s, 2),
            "pairs_per_second": round(total_scored / total_s, 3) if total_s > 0 and total_scored else None,
            "runs": all_runs, "finished": all_runs[-1]["finished"]}
    if segmenter is not None:
        meta["segmenter"] = segmenter.describe()
    return meta


def _certificate_summary(cert: dict | None) -> dict | None:
    """The parts of a bundle's precision record a reader of the sidecar needs (not the search log)."""
    if cert is None:
        return None
    return {k: cert[k] for k in ("mode", "claim", "gates", "keep_fp32", "backend") if k in cert}


def _num(v) -> float:
    if v is None or v == "":
        return float("nan")
    return float(v)
