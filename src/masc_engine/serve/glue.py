"""The one place where masc-serve meets the library: request bytes in, masc-run's row record out.

Every scoring rule (mask checks, undefined scores and their statuses, notes in ``status_detail``,
the encoding cache and the on-disk store) is masc-run's own: items are scored by
:meth:`masc_engine.jobs.pairs.PairsJob.score_rows`, fed with images decoded from request
bytes instead of files (its ``loaded`` argument), so a request gets exactly the ``cp``, ``pf``,
``status`` and extras that masc-run writes for the same files. When the job layer exposes a
function that scores one in-memory item, this module is what changes; the app and the batcher
do not.

Two things are added for the service:

- **Reference-encoding cache bounded in bytes.** Encodings of reference images are kept by
  content hash in an LRU whose size is the patch tokens' bytes (``cachetools.LRUCache`` with
  ``getsizeof``), in front of masc-run's optional on-disk store. Output encodings are held only
  for the batch that needs them (evaluation traffic repeats references, not outputs).
- **Batches that cannot change a result.** The vision graph pads a batch to its longest
  sequence and the pooling head pads to the longest output; padding and batch size change
  reduction order in ONNX Runtime by a few ulps (tolerances.BATCH_INVARIANCE_ATOL). So the
  images of a micro-batch are encoded in groups of equal patch count and the pairs are pooled in
  groups of equal output patch count: no tensor is ever padded, and every request gets the bits
  it would get alone (tests/test_serve.py checks equality, not closeness).
"""

from __future__ import annotations

import base64
import binascii
import copy
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from ..errors import InputError
from ..jobs.pairs import FILE_COLUMNS, LoadedImage, PairsJob, RunSettings
from ..runtime.cache import EncodingCache as _JobCache
from ..runtime.cache import EncodingStore, sha256_bytes
from ..runtime.io import image_from_bytes, mask_from_bytes
from ..runtime.scorer import ImageEncoding, Scorer
from ..runtime.stripping import STRIPPERS

IMAGE_FIELDS = ("ref_image", "out_image")
MASK_FIELDS = ("ref_mask", "out_mask")
#: The four byte fields of a request, in masc-run's column order.
BYTE_FIELDS = FILE_COLUMNS
#: Row keys of masc-run's record that are not part of a service response.
_ROW_ONLY = set(FILE_COLUMNS) | {"prompt", "object_name", "row_index", "row_key"}


class FieldError(InputError):
    """A request field is unusable: ``reason`` (machine-readable), ``field`` (e.g.
    ``"ref_image"`` or ``"items[3].out_mask"``) and ``detail`` (one line)."""

    def __init__(self, reason: str, field: str, detail: str):
        super().__init__(reason, detail)
        self.field = field


def b64decode_field(value: str, name: str) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padding required) of one field.

    Raises:
        FieldError: reason ``bad_base64`` naming the field.
    """
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise FieldError("bad_base64", name, f"{name} is not valid base64: {e}") from e


@dataclass
class DecodedItem:
    """One request item, decoded in a request thread, ready for a micro-batch.

    Attributes:
        images: ``ref_image``/``out_image`` -> :class:`LoadedImage` or the :class:`InputError`
            its bytes raised (masc-run's ``loaded`` values).
        masks: ``ref_mask``/``out_mask`` -> ``[H, W] uint8`` or the :class:`InputError`.
        prompt, object_name, stripper: as sent (stripper resolved to the server default).
        label: prefix naming the item in messages (``""`` or ``"items[3]."``).
        error: the first unusable field as a :class:`FieldError` (``/v1/score`` answers 4xx with
            it; ``/v1/score_batch`` returns masc-run's row status instead), else ``None``.
    """

    images: dict
    masks: dict
    prompt: str
    object_name: str | None
    stripper: str
    label: str = ""
    error: FieldError | None = None
    uid: int = 0


def _seq_len(li: LoadedImage) -> int:
    h, w = li.pre.spatial_shape
    return int(h) * int(w)


class _SharedCache(_JobCache):
    """The pairs job's encoding cache (runtime/cache.py) with the service's memory level: the
    batch's own encodings, then the shared byte-bounded reference LRU; misses go to masc-run's
    on-disk store and the vision tower as in masc-run."""

    def __init__(self, scorer: Scorer, store, shared: "EncodingCache"):
        super().__init__(scorer, items=0, store=store)
        self.shared = shared

    def in_memory(self, key: str) -> bool:
        return self.shared.peek(key)

    def _lru_get(self, key: str) -> ImageEncoding | None:
        return self.shared.get(key)

    def _lru_put(self, key: str, enc: ImageEncoding) -> None:
        self.shared.put(key, enc)


class _ServiceJob(PairsJob):
    """masc-run's :class:`PairsJob` with the service's cache policy (see module docstring)."""

    def __init__(self, scorer: Scorer, settings: RunSettings, store, cache: "EncodingCache"):
        super().__init__(scorer, settings, io_workers=1, cache=_SharedCache(scorer, store, cache))
        self.shared = cache


class EncodingCache:
    """Encodings by content hash: the current batch's (all of them) and a byte-bounded LRU of
    reference encodings shared by every request.

    Args:
        max_bytes: bound on the LRU's patch-token bytes (``[N, D] float32`` -> ``4 * N * D``);
            0 disables it.
    """

    def __init__(self, max_bytes: int):
        self.lru = LRUCache(maxsize=max(1, int(max_bytes)), getsizeof=lambda e: int(e.tokens.nbytes))
        self.enabled = max_bytes > 0
        self.lock = threading.Lock()
        self.batch: dict[str, ImageEncoding] = {}
        self.cacheable: set[str] = set()
        self.hits = 0
        self.misses = 0

    def peek(self, key: str) -> bool:
        with self.lock:
            return key in self.lru

    def get(self, key: str, count: bool = False) -> ImageEncoding | None:
        """The batch's encoding, else the LRU's; ``count``: a reference lookup for the
        hit/miss counters (once per distinct reference and batch)."""
        with self.lock:
            if key in self.batch:
                return self.batch[key]
            v = self.lru.get(key)
            if count:
                self.hits += v is not None
                self.misses += v is None
            return v

    def put(self, key: str, enc: ImageEncoding) -> None:
        with self.lock:
            self.batch[key] = enc
            if self.enabled and key in self.cacheable and enc.tokens.nbytes <= self.lru.maxsize:
                self.lru[key] = enc

    def begin_batch(self, reference_keys: set[str]) -> None:
        with self.lock:
            self.batch = {}
            self.cacheable = set(reference_keys)

    def end_batch(self) -> None:
        with self.lock:
            self.batch = {}
            self.cacheable = set()

    @property
    def nbytes(self) -> int:
        return int(self.lru.currsize) if self.enabled else 0

    def __len__(self) -> int:
        return len(self.lru)


class ServiceScorer:
    """Decode request items and score micro-batches of them with masc-run's row logic.

    Args:
        scorer: the loaded :class:`Scorer` (its ``stripper`` is the server default).
        settings: masc-run's :class:`RunSettings` (EXIF policy, mask size tolerance).
        cache_bytes: bound of the in-memory reference-encoding LRU, bytes.
        store: masc-run's on-disk :class:`EncodingStore` (``--cache-dir``), or ``None``.
        strippers: strippers a request may ask for (the default is always allowed).
    """

    def __init__(self, scorer: Scorer, settings: RunSettings = RunSettings(), cache_bytes: int = 512 * 2**20,
                 store: EncodingStore | None = None, strippers: tuple[str, ...] = ("regex", "none")):
        self.scorer = scorer
        self.settings = settings
        self.store = store
        self.cache = EncodingCache(cache_bytes)
        self.default_stripper = scorer.stripper
        self.strippers = tuple(dict.fromkeys((scorer.stripper, *strippers)))
        self.jobs: dict[str, _ServiceJob] = {}
        if len(self.strippers) > 1:
            scorer.text  # make the lazy text session now, so the per-stripper copies share it
        for name in self.strippers:
            s = scorer
            if name != scorer.stripper:
                # Same sessions, tokenizer and caches; only the PF prompt stripper differs.
                s = copy.copy(scorer)
                s.stripper = name
            self.jobs[name] = _ServiceJob(s, settings, store, self.cache)
        self._next_uid = 0
        self._uid_lock = threading.Lock()

    # ------------------------------------------------------------------ decoding (request threads)

    def decode(self, data: dict[str, bytes], prompt: str, object_name: str | None, stripper: str | None,
               label: str = "") -> DecodedItem:
        """Decode one item's four files (each an independent result, as masc-run's loader) and
        check each mask against its image with masc-run's rule.

        Raises:
            FieldError: ``unknown_stripper`` (a request-shape error, never a row status).
        """
        stripper = stripper or self.default_stripper
        if stripper not in self.jobs:
            why = (f"'{stripper}' is not enabled on this server (enabled: {', '.join(self.strippers)})"
                   if stripper in STRIPPERS else f"must be one of {', '.join(STRIPPERS)}")
            raise FieldError("bad_stripper", f"{label}stripper", f"{label}stripper {why}")
        exif = self.settings.exif
        images, masks, error = {}, {}, None
        for f in IMAGE_FIELDS:
            name = label + f
            try:
                im, notes = image_from_bytes(data[f], name, exif)
                sha = sha256_bytes(data[f])
                # Preprocess here, in the request's thread, unless the reference is cached.
                pre = None if (f == "ref_image" and self.cache.peek(sha)) else self.scorer.preprocess(im)
                images[f] = LoadedImage(im, sha, notes, pre)
            except InputError as e:
                images[f] = e
                error = error or FieldError(e.reason, name, e.detail)
        for f in MASK_FIELDS:
            name = label + f
            try:
                masks[f] = mask_from_bytes(data[f], name, exif)
            except InputError as e:
                masks[f] = e
                error = error or FieldError(e.reason, name, e.detail)
        if error is None:
            job = self.jobs[stripper]
            for im_f, m_f, what in (("ref_image", "ref_mask", "reference"), ("out_image", "out_mask", "output")):
                try:
                    job._check_mask(images[im_f].image, masks[m_f], what, label + m_f)
                except InputError as e:
                    error = FieldError(e.reason, label + m_f, e.detail)
                    break
        with self._uid_lock:
            self._next_uid += 1
            uid = self._next_uid
        return DecodedItem(images, masks, prompt, object_name, stripper, label, error, uid)

    # ------------------------------------------------------------------ scoring (the batch thread)

    def score(self, items: list[DecodedItem]) -> list[dict]:
        """Score a micro-batch; one record per item, in order (masc-run's row record without
        the input cells, ``row_index`` and ``row_key``; NaN as ``None``).

        Images are encoded in groups of equal patch count and pairs scored in groups of equal
        output patch count, so no tensor is padded and results equal scoring each item alone.
        Not thread-safe: one batch at a time (the batcher's single worker).
        """
        refs = {li.sha256 for it in items for f, li in it.images.items()
                if f == "ref_image" and isinstance(li, LoadedImage)}
        self.cache.begin_batch(refs)
        try:
            return self._score(items)
        finally:
            self.cache.end_batch()

    def _score(self, items: list[DecodedItem]) -> list[dict]:
        s = self.scorer
        # 1. the vision tower, one call group per patch count (no padding in any call)
        by_len: dict[int, dict[str, LoadedImage]] = defaultdict(dict)
        seen: set[str] = set()
        for it in items:
            for f, li in it.images.items():
                if not isinstance(li, LoadedImage) or li.sha256 in seen:
                    continue
                seen.add(li.sha256)
                if self.cache.get(li.sha256, count=f == "ref_image") is not None:
                    continue
                if li.pre is None:  # was cached when decoded, evicted since
                    li.pre = s.preprocess(li.image)
                by_len[_seq_len(li)].setdefault(li.sha256, li)
        job0 = self.jobs[self.default_stripper]
        for group in by_len.values():
            job0.encode(list(group.values()))  # masc-run's encode: memory cache, disk store, tower
        # 2. the heads, one score_rows call per (stripper, output patch count)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, it in enumerate(items):
            out = it.images.get("out_image")
            n_out = self.cache.get(out.sha256).tokens.shape[0] if isinstance(out, LoadedImage) else -1
            groups[(it.stripper, n_out)].append(i)
        records: list[dict | None] = [None] * len(items)
        for (stripper, _), idx in groups.items():
            rows, images, masks = [], {}, {}
            for i in idx:
                it = items[i]
                key = f"/{it.uid}/"  # a path-like key masc-run's row logic resolves to itself
                row = {f: key + f for f in BYTE_FIELDS}
                row.update(prompt=it.prompt, object_name=it.object_name or "")
                rows.append(row)
                images.update({key + f: v for f, v in it.images.items()})
                masks.update({key + f: v for f, v in it.masks.items()})
            results = self.jobs[stripper].score_rows(rows, Path("/"), loaded=(images, masks), indices=idx)
            for i, res in zip(idx, results):
                records[i] = _record(res, f"/{items[i].uid}/", items[i].label)
        return records


def _record(res: dict, key: str, label: str) -> dict:
    out = {}
    for k, v in res.items():
        if k in _ROW_ONLY:
            continue
        if isinstance(v, float) and np.isnan(v):
            v = None
        elif isinstance(v, str):
            v = v.replace(key, label)  # messages name the request field, not the internal key
        elif isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out
