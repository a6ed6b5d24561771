"""Masks from a segmenter for pairs that come without one (``masc-run --segmenter``, masc-serve
started with ``--segmenter``, masc-rank's queries).

A pair's side whose mask cell is empty or absent (a request field left out) gets the mask the
segmenter computes for its image, prompted by the row's ``object_name`` through the recipe
(runtime/segmenter.py :class:`~masc_engine.runtime.segmenter.MaskRecipe`). The mask is computed
while the image is decoded (jobs/items.py ``decode_image``: the decoded image is at hand, and the
decoded-bytes budget reserves the segmentation's memory too), at the image's own size after the
EXIF policy, so the mask size check and both scores read it as they read a mask file.

Each mask is computed once: :class:`SegmenterMasks` looks it up by its content key
(:func:`~masc_engine.runtime.segmenter.mask_cache_key`: image content hash, prompt, segmenter
fingerprint, recipe identity, EXIF policy) in an in-memory LRU (bounded in bytes, 1 bit per pixel)
and then in the persistent encoding store (``--cache-dir``, runtime/cache.py ``get_mask``), and only
then runs the segmenter (the vision graph once per image, the decoder once per prompt). A
reference shared by nine prompts of one subject is segmented once per run, and not at all by a
second run on the same ``--cache-dir``.

A row with no mask and no subject name gets the status ``no_mask_source``; a subject name whose
prompt is over the segmenter's budget ``mask_prompt_too_long``: that row only, never the run.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from ..errors import InputError
from ..runtime.segmenter import Segmenter, mask_cache_key, save_mask_png
from .results import output_errors

#: Where a pair's mask came from: its mask file (or request field), or the segmenter.
FILE, SEGMENTER = "file", "segmenter"
#: masc-run's result columns with a segmenter: each mask's source.
MASK_SOURCE_COLUMNS = ("ref_mask_source", "out_mask_source")
#: masc-run's result columns with ``--save-masks``: the PNG of each computed mask (paths relative to
#: the output file's folder; empty for a mask that came from a file).
SAVED_MASK_COLUMNS = ("ref_mask_saved", "out_mask_saved")
#: Default bound of the in-memory mask LRU, bytes of packed masks (32 KiB per 512 x 512 mask).
DEFAULT_MEMORY_BYTES = 64 * 2**20


@dataclass(frozen=True)
class ComputedMask:
    """One mask from the segmenter (or from its cache).

    Attributes:
        mask: ``[H, W] uint8``, 0 background / 255 foreground, the image's size.
        saved: the PNG ``--save-masks`` wrote (or found) for it, absolute; ``""`` when not saved.
    """

    mask: np.ndarray
    saved: str = ""


def _slug(text: str) -> str:
    """A prompt as a folder name: lowercase letters, digits and dashes, at most 60 characters."""
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60].strip("-")
    return s or "prompt"


class SegmenterMasks:
    """The masks a job computes with a :class:`~masc_engine.runtime.segmenter.Segmenter`.

    Args:
        segmenter: the segmenter.
        exif: the EXIF policy images are read with (``apply`` / ``ignore``): part of each key.
        store (EncodingStore | None): the persistent :class:`~masc_engine.runtime.cache.EncodingStore` (``--cache-dir``),
            or None.
        save_dir: write each mask as a PNG here (``--save-masks``): ``<save_dir>/<prompt>/<image
            stem>-<key>.png``, 0/255 greyscale, readable as a mask file. An existing file of that
            name (the same image, prompt and rule) is kept, not rewritten.
        memory_bytes: bound of the in-memory LRU (packed masks), bytes.

    Attributes:
        masks_segmented: masks computed by the segmenter.
        mask_cache_hits: masks found in the persistent store.
        memory_hits: masks found in the in-memory LRU.

    Thread-safe: loader threads call it at once (the segmenter's sessions are).
    """

    def __init__(
        self,
        segmenter: Segmenter,
        exif: str = "apply",
        store=None,
        save_dir: str | Path | None = None,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ):
        self.segmenter = segmenter
        self.exif = exif
        self.store = store
        self.save_dir = None if save_dir is None else Path(save_dir)
        self.memory: LRUCache[str, tuple[tuple[int, ...], bytes]] = LRUCache(
            maxsize=max(1, int(memory_bytes)), getsizeof=lambda v: len(v[1]) + 64
        )
        self.scope = f"{segmenter.config.backend}/{segmenter.config.provider}"
        self._lock = threading.Lock()
        self._prompts: dict = {}  # subject name -> its prompt, or the InputError it gives
        self.masks_segmented = self.mask_cache_hits = self.memory_hits = 0

    def stats(self) -> dict:
        """``masks_segmented``, ``mask_cache_hits`` and the segmenter's ``segmenter_images_encoded``."""
        return {
            "masks_segmented": self.masks_segmented,
            "mask_cache_hits": self.mask_cache_hits,
            "segmenter_images_encoded": self.segmenter.images_encoded,
        }

    def prompt(self, subject_name: str) -> str:
        """The segmenter's prompt for a row's subject name.

        Raises:
            InputError: ``no_mask_source`` (no subject name: the row has no mask and nothing to
                prompt the segmenter with) or ``mask_prompt_too_long``.
        """
        found = self._prompts.get(subject_name)
        if found is None:
            try:
                found = self.segmenter.prompt(subject_name)
            except InputError as e:
                found = (
                    InputError("no_mask_source", "no mask given and no object_name to prompt the segmenter with")
                    if e.reason == "empty_prompt"
                    else InputError("mask_prompt_too_long", f"object_name as the segmenter's prompt: {e.detail}")
                )
            if len(self._prompts) >= 65536:  # a bound, not an LRU: distinct subject names are few
                self._prompts.clear()
            self._prompts[subject_name] = found
        if isinstance(found, InputError):
            raise InputError(found.reason, found.detail)
        return found

    def reserve_bytes(self, size: tuple[int, int]) -> int:
        """What segmenting one image of ``size`` ``(width, height)`` holds at once, bytes."""
        return self.segmenter.work_bytes(size)

    def key(self, digest: str, prompt: str) -> str:
        """The content key of the mask of image ``digest`` for ``prompt`` under this rule."""
        s = self.segmenter
        return mask_cache_key(digest, prompt, s.fingerprint, s.recipe.identity(), self.exif)

    def __call__(self, image, digest: str, name: str, subject_names: Iterable[str]) -> dict:
        """The masks of one decoded image for each subject name.

        Args:
            image (PIL.Image.Image): the decoded RGB PIL image (after the EXIF policy).
            digest: its content hash (the encoding caches' key).
            name: how the image is named (its path: the saved PNG's stem).
            subject_names: the rows' ``object_name`` values that need a mask of this image.

        Returns:
            ``{subject name: ComputedMask or the InputError of its prompt}``.

        Raises:
            OutputWriteError: ``--save-masks`` cannot be written.
        """
        out: dict = {}
        todo: list[tuple[str, str, str]] = []
        for subject in dict.fromkeys(subject_names):
            try:
                prompt = self.prompt(subject)
            except InputError as e:
                out[subject] = e
                continue
            key = self.key(digest, prompt)
            mask = self._lookup(key)
            if mask is None:
                todo.append((subject, prompt, key))
            else:
                out[subject] = ComputedMask(mask, self._save(mask, name, prompt, key))
        if todo:
            computed = self.segmenter.segment_image(image, [t[0] for t in todo])
            for (subject, prompt, key), sm in zip(todo, computed):
                self._remember(key, sm.mask)
                if self.store is not None:
                    self.store.put_mask(key, sm.mask, self.scope)
                out[subject] = ComputedMask(sm.mask, self._save(sm.mask, name, prompt, key))
            with self._lock:
                self.masks_segmented += len(todo)
        return out

    def _lookup(self, key: str) -> np.ndarray | None:
        """The mask under ``key`` from memory, else from the persistent store (then remembered)."""
        with self._lock:
            packed = self.memory.get(key)
            if packed is not None:
                self.memory_hits += 1
        if packed is not None:
            (h, w), bits = packed
            return np.unpackbits(np.frombuffer(bits, np.uint8), count=h * w).reshape(h, w) * np.uint8(255)
        mask = self.store.get_mask(key, self.scope) if self.store is not None else None
        if mask is not None:
            with self._lock:
                self.mask_cache_hits += 1
            self._remember(key, mask)
        return mask

    def _remember(self, key: str, mask: np.ndarray) -> None:
        packed = (tuple(mask.shape), np.packbits(mask > 0).tobytes())
        with self._lock:
            self.memory[key] = packed

    def saved_path(self, name: str, prompt: str, key: str) -> Path | None:
        """Where ``--save-masks`` puts the mask of image ``name`` for ``prompt`` (None: not saving)."""
        if self.save_dir is None:
            return None
        return self.save_dir / _slug(prompt) / f"{Path(name).stem or 'image'}-{key[:10]}.png"

    def _save(self, mask: np.ndarray, name: str, prompt: str, key: str) -> str:
        path = self.saved_path(name, prompt, key)
        if path is None:
            return ""
        assert self.save_dir is not None  # saved_path is None without it
        if not path.is_file():  # the same name is the same image, prompt and rule: written once
            with output_errors(self.save_dir, "--save-masks folder"):
                save_mask_png(mask, path, overwrite=True)
        return str(path.resolve())
