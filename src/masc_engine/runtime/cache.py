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
  another SigLIP2 bundle or patch budget reuse them;
- embedding (an embedder's, runtime/embedder.py, for the classic metrics): the image's content
  hash (or the prompt's sha256) scoped by the embedder's identity (bundle fingerprint, backend,
  provider, precision and image recipe: ``embedding_scope``) -> ``[D] float32``. Embeddings do not
  depend on the scorer either: they live outside its namespace.

A hit returns exactly the stored arrays, so scores from a hit are identical to a miss.

The store never unpickles: every value is bytes in the store's own format (a header naming the
kind and the array dimensions, then the raw little-endian buffer), and keys are strings. An entry
that is not in that format (a pickle, a value of another type, a shape or length that does not
add up, a file outside the store's layout) is refused: a miss, counted in
:attr:`EncodingStore.refused`, logged once; the next write of that key replaces it. Entries
written by versions before this format are therefore misses once, and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sqlite3
import stat
import struct
import threading
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ..errors import MascEngineError
from .preprocess import PreprocessedImage
from .encoder import LRU
from .scorer import ImageEncoding, Scorer

if TYPE_CHECKING:
    from PIL import Image

T = TypeVar("T")

DEFAULT_SIZE_LIMIT = 8 * 2**30  # 8 GiB
#: diskcache settings: a rollback journal and no memory map, so a storage fault is an error, not SIGBUS.
SQLITE_SETTINGS = {"sqlite_journal_mode": "delete", "sqlite_mmap_size": 0}

log = logging.getLogger("masc_engine.cache")


class CacheError(MascEngineError):
    """The ``--cache-dir`` folder cannot be opened or written (one line, naming the folder)."""


def _storage_errors() -> tuple[type[BaseException], ...]:
    """What a failing store raises: SQLite's errors (not OSErrors), the file system's and
    diskcache's lock timeout."""
    import diskcache

    return (sqlite3.Error, OSError, diskcache.Timeout, EOFError)


class StoreValueError(ValueError):
    """A stored key or value the store does not read (not its own format): a miss."""


#: The names diskcache gives value files (``ab/cd/<28 hex>.val``); any other is refused.
_VALUE_FILE = re.compile(r"[0-9a-f]{2}[/\\][0-9a-f]{2}[/\\][0-9a-f]{28}\.val")


def _safe_disk() -> type[Any]:
    """A ``diskcache.Disk`` that stores and reads bytes only and never unpickles a key or a value."""
    import diskcache
    from diskcache.core import MODE_BINARY, MODE_RAW, UNKNOWN

    class SafeDisk(diskcache.Disk):  # type: ignore[misc]  # diskcache ships no types: its Disk is Any
        def put(self, key: object) -> Any:
            if type(key) is not str:
                raise TypeError(f"the encoding store's keys are strings, not {type(key).__name__}")
            return super().put(key)

        def get(self, key: object, raw: bool) -> str:
            if not raw or type(key) is not str:
                raise StoreValueError("a stored key is not a string")
            return key

        def store(self, value: object, read: bool, key: object = UNKNOWN) -> Any:
            if type(value) is not bytes:
                raise TypeError(f"the encoding store keeps bytes, not {type(value).__name__}")
            return super().store(value, read, key)

        def fetch(self, mode: int, filename: object, value: object, read: bool) -> bytes:
            if mode == MODE_RAW and isinstance(value, (bytes, memoryview)) and not read:
                return bytes(value)
            if mode == MODE_BINARY and not read:
                return self._read_file(filename)
            raise StoreValueError(f"a stored value of mode {mode} is not bytes of this store")

        def _inside(self, filename: object) -> str | None:
            """The full path of a value file of this store's layout inside its folder, else None."""
            if not isinstance(filename, str) or not _VALUE_FILE.fullmatch(filename):
                return None
            full = os.path.join(self._directory, filename)
            root = os.path.realpath(self._directory)
            return full if os.path.realpath(full).startswith(root + os.sep) else None

        def _read_file(self, filename: object) -> bytes:
            full = self._inside(filename)
            if full is None or not stat.S_ISREG(os.stat(full).st_mode):
                raise StoreValueError("a stored value file is outside the store or not a regular file")
            with open(full, "rb") as f:
                return f.read()

        def remove(self, file_path: object) -> None:
            if self._inside(file_path) is not None:  # never delete outside the store's own files
                super().remove(file_path)

    return SafeDisk


_MAGIC = b"masc-store/1\n"


def _pack(kind: bytes, dims: tuple[int, ...], payload: bytes) -> bytes:
    """``magic + kind (3 bytes) + ndim (uint8) + dims (uint64 LE each) + payload``."""
    return _MAGIC + kind + struct.pack(f"<B{len(dims)}Q", len(dims), *dims) + payload


def _unpack(
    blob: bytes, kind: bytes, ndim: int, nbytes: Callable[[tuple[int, ...]], int]
) -> tuple[tuple[int, ...], memoryview]:
    """``(dims, payload)`` of a value written by :func:`_pack`.

    Raises:
        StoreValueError: another format or kind, or a payload whose length is not ``nbytes(dims)``.
    """
    head = _MAGIC + kind
    off = len(head) + 1 + 8 * ndim
    if type(blob) is not bytes or not blob.startswith(head) or len(blob) < off or blob[len(head)] != ndim:
        raise StoreValueError(f"not a {kind.decode()} entry of this store's format")
    dims = struct.unpack_from(f"<{ndim}Q", blob, len(head) + 1)
    payload = memoryview(blob)[off:]
    if len(payload) != nbytes(dims):
        raise StoreValueError(f"a {kind.decode()} entry's length does not match its dimensions {dims}")
    return dims, payload


def _f32(payload: memoryview, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(payload, dtype="<f4").reshape(shape).astype(np.float32, copy=False)


def _image_nbytes(dims: tuple[int, ...]) -> int:
    n, d, gh, gw = dims
    return 4 * n * d if n == gh * gw and n > 0 and d > 0 else -1


def pack_image(enc: ImageEncoding) -> bytes:
    """An ``ImageEncoding`` (host ``[Hp*Wp, D]`` tokens + grid) as bytes of the store's format."""
    t = np.ascontiguousarray(enc.tokens, dtype="<f4")
    return _pack(b"img", (*t.shape, *(int(g) for g in enc.grid)), t.tobytes())


def unpack_image(blob: bytes) -> ImageEncoding:
    """Inverse of :func:`pack_image`. Raises StoreValueError on anything else."""
    (n, d, gh, gw), payload = _unpack(blob, b"img", 4, _image_nbytes)
    return ImageEncoding(_f32(payload, (n, d)), (gh, gw))


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

    def __init__(self, directory: str | Path, namespace: dict[str, Any], size_limit: int = DEFAULT_SIZE_LIMIT) -> None:
        self.cache = open_cache(directory, size_limit)
        self.directory = str(directory)
        self.ns = hashlib.sha256(json.dumps(namespace, sort_keys=True).encode()).hexdigest()[:16]
        self.hits = 0
        self.misses = 0
        self.fault: str | None = None
        self.faults = 0
        self.refused = 0
        self.widths: dict[str, int | None] = {}
        self._errors = _storage_errors()

    def expect(self, image_width: int | None = None, text_width: int | None = None) -> None:
        """The widths entries must have: ``D`` of image tokens ``[N, D]`` and ``P`` of text
        embeddings ``[P]`` (None: any); an entry of another width is refused (a miss)."""
        self.widths = {"img": image_width, "txt": text_width}

    def _fits(self, kind: str, arr: np.ndarray, axis: int) -> None:
        want = self.widths.get(kind)
        if want is not None and arr.shape[axis] != want:
            raise StoreValueError(f"a {kind} entry of width {arr.shape[axis]}, not {want}")

    def _failed(self, e: BaseException) -> None:
        self.faults += 1
        if self.fault is None:
            self.fault = f"{type(e).__name__}: {e}"
            log.error(
                "masc cache: the persistent cache in %s failed (%s); scoring goes on without it",
                self.directory,
                self.fault,
            )

    def _do(self, op: Callable[..., T], *args: object) -> T | None:
        """``op(*args)`` on the store; a storage error disables the store (logged once) and gives None."""
        if self.fault is not None:
            self.faults += 1
            return None
        try:
            return op(*args)
        except self._errors as e:
            self._failed(e)
            return None

    def _read(self, key: str, parse: Callable[[bytes], T]) -> T | None:
        """``parse(stored bytes)`` under ``key``, or None: absent, a storage fault (:meth:`_do`),
        or an entry not of this store's format (refused: a miss, counted and logged once)."""
        if self.fault is not None:
            self.faults += 1
            return None
        try:
            blob = self.cache.get(key)
            return None if blob is None else parse(blob)
        except StoreValueError as e:
            self.faults += 1
            self.refused += 1
            if self.refused == 1:
                log.warning(
                    "masc cache: an entry in %s is not in this store's format and was not read (%s); "
                    "such entries are misses and are rewritten",
                    self.directory,
                    e,
                )
            return None
        except self._errors as e:
            self._failed(e)
            return None

    def _key(self, kind: str, digest: str) -> str:
        return f"{kind}:{self.ns}:{digest}"

    def get_image(self, digest: str) -> ImageEncoding | None:
        enc = self._read(self._key("img", digest), self._image)
        if enc is None:
            self.misses += 1
            return None
        self.hits += 1
        return enc

    def _image(self, blob: bytes) -> ImageEncoding:
        enc = unpack_image(blob)
        self._fits("img", enc.tokens, 1)
        return enc

    def _text(self, blob: bytes) -> np.ndarray:
        emb = _unpack_text(blob)
        self._fits("txt", emb, 0)
        return emb

    def put_image(self, digest: str, enc: ImageEncoding) -> None:
        self._do(self.cache.set, self._key("img", digest), pack_image(enc))

    def get_text(self, text: str) -> np.ndarray | None:
        return self._read(self._key("txt", sha256_bytes(text.encode())), self._text)

    def put_text(self, text: str, embedding: np.ndarray) -> None:
        e = np.ascontiguousarray(embedding, dtype="<f4").reshape(-1)
        self._do(self.cache.set, self._key("txt", sha256_bytes(text.encode())), _pack(b"txt", e.shape, e.tobytes()))

    @staticmethod
    def _mask_key(key: str, scope: str) -> str:
        return f"mask:{scope}:{key}"

    def get_mask(self, key: str, scope: str = "") -> np.ndarray | None:
        """The ``[H, W] uint8`` 0/255 mask stored under ``key`` in ``scope``, or None.

        Args:
            key: the mask's content key (runtime/segmenter.py ``mask_cache_key``).
            scope: what else decides its pixels (the segmenter's backend and provider).
        """
        return self._read(self._mask_key(key, scope), _unpack_mask)

    def put_mask(self, key: str, mask: np.ndarray, scope: str = "") -> None:
        """Store a 0/255 (or boolean) ``[H, W]`` mask under ``key`` in ``scope``, 1 bit per pixel."""
        m = np.asarray(mask) > 0
        self._do(self.cache.set, self._mask_key(key, scope), _pack(b"msk", m.shape, np.packbits(m).tobytes()))

    @staticmethod
    def _embedding_key(scope: str, key: str) -> str:
        return f"emb:{scope}:{key}"

    def get_embedding(self, scope: str, key: str, width: int | None = None) -> np.ndarray | None:
        """The ``[D] float32`` embedding stored under ``key`` in ``scope``, or None (absent, a
        storage fault, or an entry not of this store's format or not ``width`` wide: refused as
        :meth:`get_image` refuses one).

        Args:
            scope: the embedder and side (:func:`embedding_scope`).
            key: the image's content hash, or the prompt's sha256.
            width: the width D an entry must have (None: any).
        """

        def parse(blob: bytes) -> np.ndarray:
            (d,), payload = _unpack(blob, b"emb", 1, lambda dims: 4 * dims[0] if dims[0] > 0 else -1)
            if width is not None and d != width:
                raise StoreValueError(f"an emb entry of width {d}, not {width}")
            return _f32(payload, (d,))

        return self._read(self._embedding_key(scope, key), parse)

    def put_embedding(self, scope: str, key: str, embedding: np.ndarray) -> None:
        """Store a ``[D]`` embedding (as little-endian float32) under ``key`` in ``scope``."""
        e = np.ascontiguousarray(embedding, dtype="<f4").reshape(-1)
        self._do(self.cache.set, self._embedding_key(scope, key), _pack(b"emb", e.shape, e.tobytes()))

    def close(self) -> None:
        try:
            self.cache.close()
        except self._errors:
            pass


def embedding_scope(identity: dict[str, Any], side: str) -> str:
    """The store scope of an embedder's embeddings of one side (``image`` or ``text``): 16 hex
    digits of the sha256 of its identity (runtime/embedder.py ``Embedder.identity``: bundle
    fingerprint, backend, provider, precision, image recipe), then the side."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return f"{digest}:{side}"


def _unpack_text(blob: bytes) -> np.ndarray:
    (p,), payload = _unpack(blob, b"txt", 1, lambda d: 4 * d[0] if d[0] > 0 else -1)
    return _f32(payload, (p,))


def _unpack_mask(blob: bytes) -> np.ndarray:
    (h, w), payload = _unpack(blob, b"msk", 2, lambda d: (d[0] * d[1] + 7) // 8 if d[0] * d[1] > 0 else -1)
    bits = np.unpackbits(np.frombuffer(payload, dtype=np.uint8), count=h * w)
    mask: np.ndarray = (bits.reshape(h, w) * np.uint8(255)).astype(np.uint8)
    return mask


def open_cache(directory: str | Path, size_limit: int = DEFAULT_SIZE_LIMIT) -> Any:
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
        cache = diskcache.Cache(
            str(directory),
            size_limit=int(size_limit),
            eviction_policy="least-recently-used",
            disk=_safe_disk(),
            **SQLITE_SETTINGS,
        )
        cache.set("masc:probe", b"", expire=1)  # a folder SQLite can read but not write fails here
        return cache
    except _storage_errors() as e:
        if cache is not None:
            cache.close()
        why = getattr(e, "strerror", None) or e
        raise CacheError(
            f"the cache folder {directory} cannot be used ({type(e).__name__}: {why}); "
            "give a writable --cache-dir or none"
        ) from None


def _widths(scorer: Scorer) -> dict[str, int]:
    """``{image_width, text_width}`` of ``scorer``'s bundle (its manifest's architecture), or {}."""
    try:
        arch = scorer.bundle.manifest["architecture"]
        return {"image_width": int(arch["vision_width"]), "text_width": int(arch["text_projection"])}
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}


class EncodingCache:
    """Image encodings by content hash: an in-memory LRU in front of an optional disk store.

    One object for both levels, so a job (masc-run, the service) asks one thing for an image's
    tokens. Device-resident scorers keep LRU entries on their token device; the disk store always
    holds host float32 copies, so a hit from disk is bit-identical to a fresh encoding.

    Args:
        scorer: the :class:`~masc_engine.runtime.scorer.Scorer` that encodes misses (and moves
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

    def __init__(
        self,
        scorer: Scorer,
        items: int = 512,
        store: EncodingStore | None = None,
        memory: MutableMapping[str, ImageEncoding] | None = None,
    ) -> None:
        self.scorer = scorer
        self.items = int(items)
        self.store = store
        # Any mapping with its own eviction policy may be the memory level (masc-serve's holds the
        # batch in flight and a byte-bounded reference LRU, serve/glue.py); by default an LRU of
        # ``items`` encodings.
        self.memory: MutableMapping[str, ImageEncoding] = memory if memory is not None else LRU(self.items)
        if store is not None:
            store.expect(**_widths(scorer))  # a stored entry of another width is a miss, not a crash
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

    def encode(self, sources: Mapping[str, PreprocessedImage | Image.Image]) -> dict[str, ImageEncoding]:
        """Encodings by content hash; only images in neither level go through the vision tower.

        Args:
            sources: ``{digest: PreprocessedImage or PIL image}``; a PIL image is preprocessed
                here when it is not cached.

        Returns:
            ``{digest: ImageEncoding}`` for every key of ``sources``.
        """
        out: dict[str, ImageEncoding] = {}
        todo: dict[str, PreprocessedImage | Image.Image] = {}
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
