"""The encoding cache: an in-memory LRU of image encodings (:class:`EncodingCache`) in front of a
persistent, content-keyed store of patch tokens and text embeddings (:class:`EncodingStore`).

The store is backed by `diskcache` (SQLite index + files): safe for several worker processes on one machine to
share, with a size bound enforced by least-recently-used eviction. SQLite runs with a rollback
journal (``journal_mode=delete``) and without memory-mapped I/O (``mmap_size=0``): WAL mode maps
its ``-shm`` index into memory, and a storage fault on a mapped page (a file made unwritable or
truncated, a full or vanished disk) kills the process with SIGBUS instead of raising an error.

A store that stops working (a storage error from SQLite or the file system, a disk full, a
corrupt database) is logged once and bypassed: lookups miss and writes are dropped, so scoring
goes on without it; :attr:`EncodingStore.fault` says why and :attr:`EncodingStore.faults` counts
the failed operations. A folder that cannot be opened and written at all is refused up front
(:class:`CacheError`, one line). Keys are content, never paths:

- image: sha256 of the file bytes + the bundle fingerprint + the preprocessing settings (patch
  budget, EXIF policy) -> ``ImageEncoding`` (tokens ``[Hp*Wp, D] float32`` + grid);
- text: sha256 of the encoded prompt string + the bundle fingerprint -> ``[P] float32``;
- mask (a segmenter's, runtime/segmenter.py): the mask's own content key
  (``mask_cache_key``: image content hash, prompt, segmenter fingerprint, recipe identity, EXIF
  policy) scoped by the segmenter's backend and provider -> ``[H, W] uint8`` 0/255, stored as
  packed bits. Masks do not depend on the scorer, so they live outside its namespace: runs with
  another SigLIP2 bundle or patch budget reuse them.

A hit returns exactly the stored arrays, so scores from a hit are identical to a miss.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import numpy as np

from ..errors import MascEngineError
from .preprocess import PreprocessedImage
from .scorer import ImageEncoding

DEFAULT_SIZE_LIMIT = 8 * 2**30  # 8 GiB
#: diskcache settings: a rollback journal and no memory map, so a storage fault is an error, not SIGBUS.
SQLITE_SETTINGS = {"sqlite_journal_mode": "delete", "sqlite_mmap_size": 0}

log = logging.getLogger("masc_engine.cache")


class CacheError(MascEngineError):
    """The ``--cache-dir`` folder cannot be opened or written (one line, naming the folder)."""


def _storage_errors() -> tuple[type[BaseException], ...]:
    """What a failing store raises: SQLite's errors (not OSErrors), the file system's, diskcache's
    lock timeout, and an unreadable stored value."""
    import diskcache

    return (sqlite3.Error, OSError, diskcache.Timeout, pickle.UnpicklingError, EOFError)


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data`` (the content key of an image file)."""
    return hashlib.sha256(data).hexdigest()


class EncodingStore:
    """Tokens and text embeddings on disk.

    Args:
        directory: cache folder (created); share it between processes and runs.
        namespace: what makes entries reusable: the bundle fingerprint and preprocessing settings.
        size_limit: bytes; least-recently-used entries are evicted past it.

    Attributes:
        fault: why the store stopped working (one line), or None while it works.
        faults: store operations not served because of a storage fault (the first failure
            disables the store; each later lookup or write counts as bypassed).

    Raises:
        CacheError: the folder cannot be created, opened or written.
    """

    def __init__(self, directory: str | Path, namespace: dict, size_limit: int = DEFAULT_SIZE_LIMIT):
        self.cache = open_cache(directory, size_limit)
        self.directory = str(directory)
        self.ns = hashlib.sha256(json.dumps(namespace, sort_keys=True).encode()).hexdigest()[:16]
        self.hits = 0
        self.misses = 0
        self.fault: str | None = None
        self.faults = 0
        self._errors = _storage_errors()

    def _do(self, op, *args):
        """``op(*args)`` on the store; a storage error disables the store (logged once) and gives None."""
        if self.fault is not None:
            self.faults += 1
            return None
        try:
            return op(*args)
        except self._errors as e:
            self.faults += 1
            if self.fault is None:
                self.fault = f"{type(e).__name__}: {e}"
                log.error("masc cache: the persistent cache in %s failed (%s); scoring goes on without it",
                          self.directory, self.fault)
            return None

    def _key(self, kind: str, digest: str) -> str:
        return f"{kind}:{self.ns}:{digest}"

    def get_image(self, digest: str) -> ImageEncoding | None:
        v = self._do(self.cache.get, self._key("img", digest))
        if v is None:
            self.misses += 1
            return None
        self.hits += 1
        tokens = np.frombuffer(v["tokens"], dtype=np.float32).reshape(v["shape"])
        return ImageEncoding(tokens, tuple(v["grid"]))

    def put_image(self, digest: str, enc: ImageEncoding) -> None:
        t = np.ascontiguousarray(enc.tokens, dtype=np.float32)
        self._do(self.cache.set, self._key("img", digest), {"tokens": t.tobytes(), "shape": t.shape, "grid": list(enc.grid)})

    def get_text(self, text: str) -> np.ndarray | None:
        v = self._do(self.cache.get, self._key("txt", sha256_bytes(text.encode())))
        if v is None:
            return None
        return np.frombuffer(v, dtype=np.float32)

    def put_text(self, text: str, embedding: np.ndarray) -> None:
        self._do(self.cache.set, self._key("txt", sha256_bytes(text.encode())),
                 np.asarray(embedding, np.float32).tobytes())

    @staticmethod
    def _mask_key(key: str, scope: str) -> str:
        return f"mask:{scope}:{key}"

    def get_mask(self, key: str, scope: str = "") -> np.ndarray | None:
        """The ``[H, W] uint8`` 0/255 mask stored under ``key`` in ``scope``, or None.

        Args:
            key: the mask's content key (runtime/segmenter.py ``mask_cache_key``).
            scope: what else decides its pixels (the segmenter's backend and provider).
        """
        v = self._do(self.cache.get, self._mask_key(key, scope))
        if v is None:
            return None
        h, w = v["shape"]
        bits = np.unpackbits(np.frombuffer(v["bits"], dtype=np.uint8), count=h * w)
        return (bits.reshape(h, w) * np.uint8(255)).astype(np.uint8)

    def put_mask(self, key: str, mask: np.ndarray, scope: str = "") -> None:
        """Store a 0/255 (or boolean) ``[H, W]`` mask under ``key`` in ``scope``, 1 bit per pixel."""
        m = np.asarray(mask) > 0
        self._do(self.cache.set, self._mask_key(key, scope), {"shape": list(m.shape), "bits": np.packbits(m).tobytes()})

    def close(self) -> None:
        try:
            self.cache.close()
        except self._errors:
            pass


def open_cache(directory: str | Path, size_limit: int = DEFAULT_SIZE_LIMIT):
    """The ``diskcache.Cache`` in ``directory`` (rollback journal, no memory map), checked writable.

    Args:
        directory: the cache folder (created).
        size_limit: bytes; least-recently-used entries are evicted past it.

    Returns:
        the open ``diskcache.Cache``.

    Raises:
        CacheError: the folder cannot be created, opened or written (one line naming it).
    """
    import diskcache

    cache = None
    try:
        cache = diskcache.Cache(str(directory), size_limit=int(size_limit), eviction_policy="least-recently-used",
                                **SQLITE_SETTINGS)
        cache.set("masc:probe", b"", expire=1)  # a folder SQLite can read but not write fails here
        return cache
    except _storage_errors() as e:
        if cache is not None:
            cache.close()
        why = getattr(e, "strerror", None) or e
        raise CacheError(f"the cache folder {directory} cannot be used ({type(e).__name__}: {why}); "
                         "give a writable --cache-dir or none") from None


class _LRU(OrderedDict):
    """The default memory level: the ``items`` most recently used encodings."""

    def __init__(self, items: int):
        super().__init__()
        self.items = items

    def get(self, key, default=None):
        if key not in self:
            return default
        self.move_to_end(key)
        return self[key]

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        while len(self) > self.items:
            self.popitem(last=False)


class EncodingCache:
    """Image encodings by content hash: an in-memory LRU in front of an optional disk store.

    One object for both levels, so a job (masc-run, the service) asks one thing for an image's
    tokens. Device-resident scorers keep LRU entries on their token device; the disk store always
    holds host float32 copies, so a hit from disk is bit-identical to a fresh encoding.

    Args:
        scorer (Scorer): the :class:`~masc_engine.runtime.scorer.Scorer` that encodes misses (and moves
            encodings between host and its token device).
        items: in-memory LRU size in images (so400m at 1,024 patches: 4.7 MB each).
        store: an :class:`EncodingStore` (``--cache-dir``), or None for memory only.
        memory: the memory level, a mapping ``digest -> ImageEncoding`` that evicts by its own
            policy (e.g. ``cachetools.LRUCache`` bounded in bytes); default: an LRU of ``items``.

    Attributes:
        images_encoded: images that went through the vision tower.
        cache_hits: images served from the disk store (memory hits are not counted: within one
            run each distinct image is encoded once either way).

    Thread-safe for lookups; :meth:`encode` is called by one thread at a time per cache.
    """

    def __init__(self, scorer, items: int = 512, store: EncodingStore | None = None,
                 memory: MutableMapping | None = None):
        self.scorer = scorer
        self.items = int(items)
        self.store = store
        # Any mapping with its own eviction policy may be the memory level (masc-serve's holds the
        # batch in flight and a byte-bounded reference LRU, serve/glue.py); by default an LRU of
        # ``items`` encodings.
        self.memory: MutableMapping = memory if memory is not None else _LRU(self.items)
        self._lock = threading.Lock()
        self.images_encoded = 0
        self.cache_hits = 0

    def in_memory(self, digest: str) -> bool:
        """Whether the memory level holds ``digest`` (loader threads skip preprocessing such images)."""
        with self._lock:
            return digest in self.memory

    def cached(self, digest: str) -> ImageEncoding | None:
        """The memory level's encoding of ``digest``, or None (the disk store is not asked):
        a loader holds it so that an image found here needs no preprocessing."""
        return self._lru_get(digest)

    def _lru_get(self, digest: str) -> ImageEncoding | None:
        with self._lock:
            return self.memory.get(digest)

    def _lru_put(self, digest: str, enc: ImageEncoding) -> None:
        with self._lock:
            self.memory[digest] = enc

    def get(self, digest: str) -> ImageEncoding | None:
        """The encoding of the image with content hash ``digest`` from memory, else from disk."""
        enc = self._lru_get(digest)
        if enc is None and self.store is not None:
            enc = self.store.get_image(digest)
            if enc is not None:
                enc = self.scorer.device_encoding(enc)  # device-resident runs keep tokens there
                self.cache_hits += 1
                self._lru_put(digest, enc)
        return enc

    def encode(self, sources: Mapping[str, object]) -> dict[str, ImageEncoding]:
        """Encodings by content hash; only images in neither level go through the vision tower.

        Args:
            sources: ``{digest: PreprocessedImage or PIL image}``; a PIL image is preprocessed
                here when it is not cached.

        Returns:
            ``{digest: ImageEncoding}`` for every key of ``sources``.
        """
        out: dict[str, ImageEncoding] = {}
        todo: dict[str, object] = {}
        for digest, src in sources.items():
            enc = self.get(digest)
            if enc is None:
                todo[digest] = src
            else:
                out[digest] = enc
        if todo:
            s = self.scorer
            pre = [src if isinstance(src, PreprocessedImage) else s.preprocess(src) for src in todo.values()]
            for digest, enc in zip(todo, s.encode_preprocessed(pre)):
                out[digest] = enc
                self._lru_put(digest, enc)
                if self.store is not None:
                    self.store.put_image(digest, s.host_encoding(enc))
            self.images_encoded += len(todo)
        return out
