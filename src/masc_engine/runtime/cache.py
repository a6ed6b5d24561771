"""Persistent, content-keyed cache of patch tokens and text embeddings.

Backed by `diskcache` (SQLite index + files): safe for several worker processes on one machine to
share, with a size bound enforced by least-recently-used eviction. Keys are content, never paths:

- image: sha256 of the file bytes + the bundle fingerprint + the preprocessing settings (patch
  budget, EXIF policy) -> ``ImageEncoding`` (tokens ``[Hp*Wp, D] float32`` + grid);
- text: sha256 of the encoded prompt string + the bundle fingerprint -> ``[P] float32``.

A hit returns exactly the stored float32 arrays, so scores from a hit are identical to a miss.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .scorer import ImageEncoding

DEFAULT_SIZE_LIMIT = 8 * 2**30  # 8 GiB


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class EncodingStore:
    """Tokens and text embeddings on disk.

    Args:
        directory: cache folder (created); share it between processes and runs.
        namespace: what makes entries reusable: the bundle fingerprint and preprocessing settings.
        size_limit: bytes; least-recently-used entries are evicted past it.
    """

    def __init__(self, directory: str | Path, namespace: dict, size_limit: int = DEFAULT_SIZE_LIMIT):
        import diskcache

        self.cache = diskcache.Cache(str(directory), size_limit=int(size_limit),
                                     eviction_policy="least-recently-used")
        self.ns = hashlib.sha256(json.dumps(namespace, sort_keys=True).encode()).hexdigest()[:16]
        self.hits = 0
        self.misses = 0

    def _key(self, kind: str, digest: str) -> str:
        return f"{kind}:{self.ns}:{digest}"

    def get_image(self, digest: str) -> ImageEncoding | None:
        v = self.cache.get(self._key("img", digest))
        if v is None:
            self.misses += 1
            return None
        self.hits += 1
        tokens = np.frombuffer(v["tokens"], dtype=np.float32).reshape(v["shape"])
        return ImageEncoding(tokens, tuple(v["grid"]))

    def put_image(self, digest: str, enc: ImageEncoding) -> None:
        t = np.ascontiguousarray(enc.tokens, dtype=np.float32)
        self.cache.set(self._key("img", digest), {"tokens": t.tobytes(), "shape": t.shape, "grid": list(enc.grid)})

    def get_text(self, text: str) -> np.ndarray | None:
        v = self.cache.get(self._key("txt", sha256_bytes(text.encode())))
        if v is None:
            return None
        return np.frombuffer(v, dtype=np.float32)

    def put_text(self, text: str, embedding: np.ndarray) -> None:
        self.cache.set(self._key("txt", sha256_bytes(text.encode())), np.asarray(embedding, np.float32).tobytes())

    def close(self) -> None:
        self.cache.close()
