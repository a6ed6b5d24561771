"""Image encoding with host work and device work overlapped (double buffering).

:func:`encode_images_overlapped` gives the encodings :meth:`Scorer.encode_images` gives, bit for
bit (the same batches, through the same vision call), but decodes and preprocesses batch n+1 on a
worker thread while batch n runs on the device (engine/device.py :func:`overlapped`). With the
TensorRT runner, batch n's own copies are on the engine's stream from pinned buffers, so the GPU
sees copy, compute, copy back, and the host meanwhile prepares the next batch. The batches are
planned before any pixel is decoded: an image's patch grid follows from its size
(:func:`~masc_engine.runtime.preprocess.naflex_target_size`), which Pillow reads from the header.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from PIL import Image

from ..engine.device import overlapped
from .preprocess import PreprocessedImage, naflex_target_size

if TYPE_CHECKING:
    from .scorer import ImageEncoding, Scorer


def patch_count(image: Image.Image, scorer: Scorer) -> int:
    """Real patches ``Hp * Wp`` of an image under the scorer's settings, without decoding it."""
    s = scorer.image_recipe
    if s.mode == "fixed":
        return (s.fixed_size[0] // s.patch_size) * (s.fixed_size[1] // s.patch_size)
    h, w = naflex_target_size(image.height, image.width, s.patch_size, s.max_num_patches)
    return (h // s.patch_size) * (w // s.patch_size)


def plan_batches(images: Sequence[Image.Image], scorer: Scorer) -> list[tuple[int, list[int]]]:
    """``(patch count, image indices)`` per vision call, as :meth:`Scorer.encode_preprocessed`
    forms them: grouped by patch count in order of first appearance, ``batch_size`` each."""
    groups: dict[int, list[int]] = {}
    for i, im in enumerate(images):
        groups.setdefault(patch_count(im, scorer), []).append(i)
    return [
        (n, members[s : s + scorer.batch_size])
        for n, members in groups.items()
        for s in range(0, len(members), scorer.batch_size)
    ]


def encode_images_overlapped(scorer: Scorer, images: Sequence[Image.Image]) -> list[ImageEncoding]:
    """:meth:`Scorer.encode_images` with preprocessing of the next batch overlapped with the
    current batch's vision call. Returns one ``ImageEncoding`` per image, in order.

    Raises:
        TypeError: an item is not a PIL image (checked before any work).
    """
    images = list(images)
    for i, im in enumerate(images):
        if not isinstance(im, Image.Image):
            raise TypeError(f"images[{i}] must be a PIL.Image.Image, got {type(im).__name__}")
    batches = plan_batches(images, scorer)
    out: list[Any] = [None] * len(images)  # every slot filled below

    def prepare(batch: tuple[int, list[int]]) -> tuple[int, list[int], list[PreprocessedImage]]:
        n, idx = batch
        return n, idx, [scorer.preprocess(images[i]) for i in idx]

    def run(prepared: tuple[int, list[int], list[PreprocessedImage]]) -> None:
        n, idx, items = prepared
        for i, enc in zip(idx, scorer._encode_batch(items, n)):
            out[i] = enc

    overlapped(batches, prepare, run)
    return out
