"""Threaded decoding shared by the jobs: each distinct path read once, errors kept per path.

Decoding (Pillow, file reads) releases the GIL for most of its time, so a few threads keep a
batch's images coming while the inference engine works on the previous one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..errors import InputError

T = TypeVar("T")


def load_all(paths: Iterable[str], loader: Callable[[str], T], workers: int) -> dict[str, T | InputError]:
    """Run ``loader`` on each distinct path with ``workers`` threads.

    Args:
        paths: paths (duplicates are loaded once).
        loader: path -> decoded object; raises :class:`InputError` for a bad file.
        workers: number of threads (at least 1).

    Returns:
        ``{path: object or the InputError it raised}``, in sorted path order. Any other
        exception propagates (a bug, not a bad file).
    """
    def one(p: str):
        try:
            return p, loader(p)
        except InputError as e:
            return p, e

    with ThreadPoolExecutor(max(1, int(workers))) as ex:
        return dict(ex.map(one, sorted(set(paths))))
