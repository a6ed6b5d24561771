"""The pairs job's inputs, decoded and reduced to what scoring needs.

A file is decoded, EXIF-oriented and reduced at once, one file at a time, so no full-resolution
image or mask outlives its own decoding:

- an image becomes a :class:`DecodedImage`: its content hash, size, patch grid, conversion notes
  and its preprocessed patches (``[max_num_patches, 3 * p * p] float32``), or the encoding the
  memory cache already held for it; the PIL image itself is kept only when attribution maps are
  drawn (``RunSettings.save_maps``);
- a mask becomes a :class:`DecodedMask`: its size, its coverage (runtime/masks.py
  ``mask_coverage``) and its weights on the patch grid of each image it is paired with
  (``mask_to_patch_grid``); what the size checks and both scores read, nothing more;
- with a segmenter (jobs/mask_source.py), an image whose pairs come without a mask is segmented
  while it is decoded, for each subject name asked for, and each mask reduced at once onto the
  image's own grid (:attr:`DecodedImage.segmented`);
- with embedders (the classic metrics, ``masc-run --metrics``), the file is preprocessed by each
  embedder's recipe while decoded (:attr:`DecodedImage.embed_pixels`), under the same budget: the
  recipe applies its own EXIF transpose and alpha compositing to the file as opened, as its
  reference pipeline does, whatever ``--exif`` says for the scorer.

With a :class:`~masc_engine.jobs.loading.ByteBudget`, each file reserves its cost (:func:`reservation`:
decoding, known from the header, and preprocessing, bounded by the patch budget) before any
pixel is decoded, so decoding memory is bounded by configuration, not by input (masc-serve's
``--max-decoded-mb``).

A :class:`DecodedPair` is what :meth:`masc_engine.jobs.pairs.PairsJob.score_decoded` scores:
masc-run builds one per row from files, masc-serve one per request item from bytes.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError
from ..runtime.cache import sha256_bytes
from ..runtime.io import decode_cost, image_from_opened, mask_from_opened, open_image
from ..runtime.masks import MaskPolicy, mask_coverage, mask_to_patch_grid
from ..runtime.preprocess import PreprocessedImage, patch_grid
from ..runtime.scorer import ImageEncoding
from ..runtime.text import PreparedPrompt

if TYPE_CHECKING:
    from PIL import Image

#: The four file fields of a pair, in a pairs file's column order.
FILE_FIELDS = ("ref_image", "ref_mask", "out_image", "out_mask")


@dataclass
class DecodedImage:
    """An image reduced to what scoring needs.

    Attributes:
        sha256: content hash of the file's bytes (the encoding caches' key).
        size: ``(width, height)`` in pixels, after EXIF orientation.
        grid: its patch grid ``(Hp, Wp)``.
        notes: conversions worth a note in ``status_detail`` (alpha dropped, 16-bit scaled).
        pre: the preprocessed image, unless ``encoding`` is set.
        encoding: the encoding the memory cache held when the image was decoded (held here, so
            an eviction before scoring costs nothing).
        image: the RGB PIL image, kept only for attribution maps.
        segmented: ``{subject name: DecodedMask or InputError}``: the segmenter's masks of this
            image (source ``segmenter``), for the subject names its mask-less pairs asked for.
        embed_pixels: ``{embedder name: [3, H, W] float32}``: the image preprocessed by each
            embedder's recipe (runtime/embedder.py ``Embedder.preprocess_image``).
    """

    sha256: str
    size: tuple[int, int]
    grid: tuple[int, int]
    notes: tuple[str, ...] = ()
    pre: PreprocessedImage | None = None
    encoding: ImageEncoding | None = None
    image: Image.Image | None = None
    segmented: dict = field(default_factory=dict)
    embed_pixels: dict = field(default_factory=dict)


@dataclass
class DecodedMask:
    """A mask reduced to what scoring needs.

    Attributes:
        size: ``(width, height)`` in pixels, after EXIF orientation.
        coverage: foreground share under the scoring rule (runtime/masks.py ``mask_coverage``).
        any_foreground: whether any pixel is non-zero (an empty reference mask's status).
        weights: ``{grid: [Hp * Wp] float32}`` patch weights on each grid it was reduced for.
        source: ``file`` (a mask file or request field) or ``segmenter``.
        saved: the PNG a segmenter mask was saved as (``--save-masks``), else ``""``.
    """

    size: tuple[int, int]
    coverage: float
    any_foreground: bool
    weights: dict = field(default_factory=dict)
    source: str = "file"
    saved: str = ""


@dataclass
class DecodedPair:
    """One pair's inputs, decoded: what :meth:`PairsJob.score_decoded` scores.

    Attributes:
        ref_image, out_image: :class:`DecodedImage`, or the :class:`InputError` decoding raised.
        ref_mask, out_mask: :class:`DecodedMask`, or the :class:`InputError`.
        prompt, object_name: the generation prompt and the subject stripped from it for PF
            (``""``: not stripped).
        names: how each file field is named in messages (a path in masc-run, a request field
            such as ``items[2].out_mask`` in masc-serve).
        prepared: the PF prompt already stripped and tokenized (``Scorer.prepare_prompt``), or
            None (stripped when scored).
        row_index: the record's ``row_index``.
        cells: other cells carried into the record (masc-run: the whole input row).
        error: a problem of the row itself (``bad_row``: an empty file cell), checked first.
        mask_sources: ``(reference, output)``: where each mask comes from (``file``,
            ``segmenter``; ``""`` when there is none).
    """

    ref_image: DecodedImage | InputError
    ref_mask: DecodedMask | InputError
    out_image: DecodedImage | InputError
    out_mask: DecodedMask | InputError
    prompt: str = ""
    object_name: str = ""
    names: dict = field(default_factory=lambda: {f: f for f in FILE_FIELDS})
    prepared: PreparedPrompt | None = None
    row_index: int = 1
    cells: dict = field(default_factory=dict)
    error: InputError | None = None
    mask_sources: tuple[str, str] = ("file", "file")

    def file(self, name: str):
        """The decoded object (or error) of file field ``name``."""
        return getattr(self, name)


class PairError(InputError):
    """A pair that cannot be scored, naming the file field at fault (``field``: e.g. ``out_mask``,
    or None for the row itself)."""

    def __init__(self, reason: str, detail: str, field: str | None):
        super().__init__(reason, detail)
        self.field = field


def _budget(budget, cost: int):
    return budget.reserve(cost) if budget is not None else nullcontext()


#: Bytes per value of the preprocessed image that preprocessing holds at its peak: the resized
#: uint8 image, its float64 rescaled copy and the float32 arrays of normalisation, patchify and
#: the padded ``pixel_values`` (runtime/preprocess.py); measured about 24 with
#: bench/decode_memory.py.
_PREPROCESS_BYTES_PER_VALUE = 32
#: What any file holds besides its pixels: decoder and zlib buffers, Python objects (measured
#: up to 2.4 MB for a 300 x 300 mask).
_PER_FILE_BYTES = 4 * 2**20


def reservation(opened, kind: str, image_settings) -> int:
    """Bytes a file reserves from a decoded-bytes budget before it is decoded: its decoding cost
    (runtime/io.py ``decode_cost``), a fixed 4 MiB for buffers and, for an image, preprocessing
    to the patch grid, which at most fills the patch budget (``max_num_patches * 3 * p * p``
    values; fixed-size models: the model's image). bench/decode_memory.py measures the peaks
    against it (bench/results/decode_memory.json)."""
    cost = decode_cost(opened, kind) + _PER_FILE_BYTES
    if kind == "image":
        s = image_settings
        values = 3 * s.image_size[0] * s.image_size[1] if s.mode == "fixed" else s.max_num_patches * 3 * s.patch_size**2
        cost += values * _PREPROCESS_BYTES_PER_VALUE
    return cost


def embed_cost(size: tuple[int, int], embedders) -> int:
    """Bytes preprocessing a ``(width, height)`` image by each embedder's recipe holds at its peak:
    the resized image's values at the preprocessing rate (``_PREPROCESS_BYTES_PER_VALUE``)."""
    from ..runtime.recipes import resized_size

    w, h = size
    return sum(
        3 * np.prod(resized_size(h, w, e.recipe)) * _PREPROCESS_BYTES_PER_VALUE for e in (embedders or {}).values()
    )


def _embed_pixels(im, embedders) -> dict:
    """``{name: [3, H, W] float32}``: ``im`` preprocessed by each embedder's recipe."""
    return {k: e.preprocess_image(im) for k, e in (embedders or {}).items()}


def decode_image(
    data: bytes,
    name: str,
    scorer,
    cache=None,
    exif: str = "apply",
    budget=None,
    keep_image: bool = False,
    masks=None,
    subjects=(),
    embedders=None,
) -> DecodedImage:
    """Decode, orient and reduce one image file.

    Args:
        data: the file's bytes.
        name: the file's name in messages.
        scorer (Scorer): the :class:`~masc_engine.runtime.scorer.Scorer` whose preprocessing applies.
        cache (EncodingCache | None): an :class:`~masc_engine.runtime.cache.EncodingCache`: an image whose encoding it
            holds in memory is not preprocessed.
        exif: ``apply`` or ``ignore`` (runtime/io.py).
        budget (ByteBudget | None): a :class:`~masc_engine.jobs.loading.ByteBudget` reserved around decoding (and
            segmenting, when ``subjects`` are given).
        keep_image: keep the RGB PIL image (attribution maps).
        masks (SegmenterMasks | None): a :class:`~masc_engine.jobs.mask_source.SegmenterMasks`, to segment the image.
        subjects (Sequence[str]): subject names to segment it for (:attr:`DecodedImage.segmented`).
        embedders (dict | None): name -> ``Embedder`` whose recipes preprocess it
            (:attr:`DecodedImage.embed_pixels`).

    Raises:
        InputError: ``unreadable_image`` or ``image_too_large``.
        OutputWriteError: ``--save-masks`` cannot be written.
    """
    opened = open_image(data, name, "image")
    sha = sha256_bytes(data)
    cost = reservation(opened, "image", scorer.image_settings)
    if masks is not None and subjects:
        cost += masks.reserve_bytes(opened.size)
    cost += int(embed_cost(opened.size, embedders))
    with _budget(budget, cost):
        im, notes = image_from_opened(opened, name, exif)
        # Each embedder's recipe reads the file as its reference pipeline does (its own EXIF
        # transpose and alpha compositing), not the scorer's RGB image.
        embed_pixels = _embed_pixels(opened, embedders)
        del opened
        grid = patch_grid(im.height, im.width, scorer.image_settings)
        enc = cache.cached(sha) if cache is not None else None
        pre = scorer.preprocess(im) if enc is None else None
        return DecodedImage(
            sha,
            im.size,
            grid,
            notes,
            pre,
            enc,
            im if keep_image else None,
            _segmented(masks, subjects, im, sha, name, grid),
            embed_pixels,
        )


def _segmented(masks, subjects, im, sha: str, name: str, grid) -> dict:
    """The segmenter's masks of a decoded image, each reduced onto its own ``grid`` at once (the
    full-size mask is not kept)."""
    if masks is None or not subjects:
        return {}
    out: dict[str, DecodedMask | InputError] = {}
    for subject, m in masks(im, sha, name, subjects).items():
        if isinstance(m, InputError):
            out[subject] = m
        else:
            d = reduce_mask(m.mask, [grid])
            d.source, d.saved = "segmenter", m.saved
            out[subject] = d
    return out


def reduce_image(
    im, name: str, scorer, cache=None, keep_image: bool = False, masks=None, subjects=(), embedders=None
) -> DecodedImage:
    """A PIL image (an in-memory input) reduced as :func:`decode_image` reduces a file (and
    segmented for ``subjects`` with ``masks``); its content key hashes its RGB pixels.

    Raises:
        InputError: ``unreadable_image`` (not a PIL image).
    """
    from PIL import Image

    if not isinstance(im, Image.Image):
        raise InputError("unreadable_image", f"{name}: expected image bytes or a PIL image, got {type(im).__name__}")
    rgb = im if im.mode == "RGB" else im.convert("RGB")
    sha = sha256_bytes(b"pil:%d:%d:" % rgb.size + np.asarray(rgb).tobytes())
    enc = cache.cached(sha) if cache is not None else None
    notes = () if im.mode == "RGB" else (f"{im.mode} converted to RGB",)
    grid = patch_grid(rgb.height, rgb.width, scorer.image_settings)
    return DecodedImage(
        sha,
        rgb.size,
        grid,
        notes,
        scorer.preprocess(rgb) if enc is None else None,
        enc,
        rgb if keep_image else None,
        _segmented(masks, subjects, rgb, sha, name, grid),
        _embed_pixels(rgb, embedders),
    )


def reduce_mask(mask: np.ndarray, grids) -> DecodedMask:
    """A decoded ``[H, W]`` mask reduced to its size, coverage and weights on ``grids``."""
    h, w = mask.shape
    return DecodedMask(
        (int(w), int(h)),
        round(mask_coverage(mask), 6),
        bool(np.any(mask)),
        {tuple(g): mask_to_patch_grid(mask, tuple(g)) for g in grids},
    )


def decode_mask(data: bytes, name: str, grids, exif: str = "apply", budget=None) -> DecodedMask:
    """Decode, orient and reduce one mask file onto the patch grids of the images it is paired
    with (``grids``: ``(Hp, Wp)`` tuples; none when no paired image could be read).

    Raises:
        InputError: ``unreadable_mask`` or ``image_too_large``.
    """
    opened = open_image(data, name, "mask")
    with _budget(budget, reservation(opened, "mask", None)):
        mask = mask_from_opened(opened, name, exif)
        del opened
        return reduce_mask(mask, grids)


def array_mask(m, name: str, grids) -> DecodedMask:
    """A ``[H, W] uint8`` mask array (an in-memory input) reduced as a decoded mask.

    Raises:
        InputError: ``unreadable_mask`` (another dtype or rank).
    """
    a = np.asarray(m)
    if a.ndim != 2 or a.dtype != np.uint8:
        raise InputError(
            "unreadable_mask", f"{name}: expected mask bytes or a [H, W] uint8 array, got {a.dtype} {list(a.shape)}"
        )
    return reduce_mask(a, grids)


#: What a masc-run / masc-serve size refusal suggests (RunSettings.mask_size_tolerance).
TOLERANCE_REMEDY = "--mask-size-tolerance N stretches masks up to N pixels off"


def check_mask(image: DecodedImage, mask: DecodedMask, what: str, name: str, tolerance: int, exif: str) -> str | None:
    """masc-run's and masc-serve's mask size check: runtime/masks.py :class:`MaskPolicy` with
    ``size_tolerance`` = ``RunSettings.mask_size_tolerance`` (a mask at most ``tolerance``
    pixels off is stretched, with a note; 0 refuses any difference).

    Returns:
        ``None``, or the note for ``status_detail`` (the mask was stretched).

    Raises:
        InputError: ``mask_orientation_mismatch`` (it fits only rotated by 90 degrees) or
            ``mask_size_mismatch``.
    """
    (w, h), (iw, ih) = mask.size, image.size
    return MaskPolicy(size_tolerance=tolerance).check((ih, iw), (h, w), what, name, exif=exif, remedy=TOLERANCE_REMEDY)
