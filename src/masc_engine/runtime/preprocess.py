"""Torch-free image preprocessing that reproduces transformers' SigLIP / SigLIP2 image processors.

Ported from transformers 5.24.0 (Apache-2.0):

- ``models/siglip2/image_processing_pil_siglip2.py``: NaFlex target size
  (``get_image_size_for_max_num_patches``), patchify (``convert_image_to_patches``), padding to the
  patch budget (``pad_along_first_dim``), ``pixel_attention_mask`` and ``spatial_shapes``.
- ``image_processing_backends.py`` ``PilBackend`` + ``image_transforms.py``: resize with Pillow
  (uint8 in, uint8 out), rescale in float64 then cast to float32, normalize in float32.

Every setting comes from the bundle manifest (:class:`ImageSettings`), never from a model name.
The reference's *torchvision* backend (what a default ``masc-metric`` install uses when torchvision
is importable) resizes differently; docs/fidelity.md gives the measured difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image

from ..engine.manifest import RESAMPLE_NAMES

# PIL filter names as stored in the manifest (the names engine/manifest.py accepts) -> Pillow constants.
_PIL_FILTERS = {name: Image.Resampling[name.upper()] for name in RESAMPLE_NAMES}


@dataclass(frozen=True)
class ImageSettings:
    """Image preprocessing settings, read from ``manifest.json["image"]``.

    Attributes:
        mode: ``"naflex"`` (aspect-preserving resize to a patch budget) or ``"fixed"``
            (resize to ``image_size``).
        patch_size: patch side in pixels.
        max_num_patches: NaFlex patch budget (sequence length after padding); for fixed-size
            models, the number of patches of the fixed grid.
        image_size: ``(height, width)`` in pixels for fixed-size models, else ``None``.
        resample: Pillow filter name (``"bilinear"``, ``"bicubic"``...).
        rescale_factor: multiplier applied to uint8 values (1/255 for SigLIP2).
        image_mean, image_std: per-channel normalisation, applied after rescale.
    """

    mode: str
    patch_size: int
    max_num_patches: int
    image_size: tuple[int, int] | None
    resample: str
    rescale_factor: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    @classmethod
    def from_manifest(cls, d: dict[str, Any]) -> "ImageSettings":
        """The settings of a manifest's ``image`` section."""
        size = d.get("image_size")
        return cls(
            mode=d["mode"],
            patch_size=int(d["patch_size"]),
            max_num_patches=int(d["max_num_patches"]),
            image_size=tuple(size) if size else None,
            resample=d["resample"],
            rescale_factor=float(d["rescale_factor"]),
            image_mean=tuple(d["image_mean"]),
            image_std=tuple(d["image_std"]),
        )

    @property
    def fixed_size(self) -> tuple[int, int]:
        """``image_size`` of a fixed-size model.

        Raises:
            ValueError: these settings have no ``image_size`` (a NaFlex model's).
        """
        if self.image_size is None:
            raise ValueError(f"image mode {self.mode!r} has no fixed image_size")
        return self.image_size

    def with_budget(self, max_num_patches: int) -> "ImageSettings":
        """The same settings with another NaFlex patch budget (``--max-num-patches``)."""
        if self.mode != "naflex":
            raise ValueError("a patch budget applies to NaFlex models only")
        return ImageSettings(
            self.mode,
            self.patch_size,
            int(max_num_patches),
            None,
            self.resample,
            self.rescale_factor,
            self.image_mean,
            self.image_std,
        )


@dataclass
class PreprocessedImage:
    """One image, ready for the vision tower.

    Attributes:
        pixel_values: NaFlex ``[max_num_patches, 3 * p * p] float32`` (patch-major, channels last
            inside a patch, zero rows for padding slots); fixed ``[3, H, W] float32``.
        pixel_attention_mask: ``[max_num_patches] int32``, 1 for a real patch, 0 for padding.
        spatial_shape: the patch grid ``(Hp, Wp)``; ``Hp * Wp`` real patches, row-major.
    """

    pixel_values: np.ndarray
    pixel_attention_mask: np.ndarray
    spatial_shape: tuple[int, int]


@lru_cache(maxsize=4096)
def naflex_target_size(
    height: int, width: int, patch_size: int, max_num_patches: int, eps: float = 1e-5
) -> tuple[int, int]:
    """Resized ``(height, width)`` in pixels for a NaFlex image: the largest scale whose patch grid
    fits ``max_num_patches``, each side a multiple of ``patch_size`` and at least one patch.

    Ported bit for bit (binary search on the scale, same bounds and eps) from transformers 5.24.0
    ``image_processing_pil_siglip2.get_image_size_for_max_num_patches``.
    """

    def scaled(scale: float, size: int) -> int:
        s = math.ceil(size * scale / patch_size) * patch_size
        return int(max(patch_size, s))

    lo, hi = eps / 10, 100.0
    while (hi - lo) >= eps:
        mid = (lo + hi) / 2
        th, tw = scaled(mid, height), scaled(mid, width)
        if (th / patch_size) * (tw / patch_size) <= max_num_patches:
            lo = mid
        else:
            hi = mid
    return scaled(lo, height), scaled(lo, width)


def to_rgb(image: Image.Image) -> Image.Image:
    """The reference's ``image.convert("RGB")`` (masc-metric 0.3.0 ``metric.py``: ``_encode_image``)."""
    return image if image.mode == "RGB" else image.convert("RGB")


def _resize_normalize(image: Image.Image, height: int, width: int, s: ImageSettings) -> np.ndarray:
    """Pillow resize, then rescale (float64 -> float32) and normalize (float32): ``[3, H, W]``."""
    if image.size != (width, height):
        image = image.resize((width, height), resample=_PIL_FILTERS[s.resample])
    return rescale_normalise(np.asarray(image), s.rescale_factor, s.image_mean, s.image_std)


def rescale_normalise(
    pixels: np.ndarray, rescale_factor: float, mean: tuple[float, ...], std: tuple[float, ...]
) -> np.ndarray:
    """The reference's rescale and normalize of ``[H, W, 3] uint8`` pixels: ``[3, H, W] float32``.

    transformers' ``PilBackend`` (``image_transforms.py`` ``rescale`` then ``normalize``) computes
    ``float32(float64(v) * rescale_factor)``, then ``(x - mean[c]) / std[c]`` in float32, per
    element. The result depends only on the byte ``v`` and the channel ``c``, so it is computed
    once for the 3 x 256 possible inputs (:func:`_normalise_table`, the same operations in the
    same precision: bit-identical) and each pixel is a table lookup: about 1 ms on a 512 x 512
    image against 12-17 ms for the element-wise arithmetic, which made up most of the
    preprocessing (2-core Xeon with AMX).

    Args:
        pixels: ``[H, W, 3] uint8``.
        rescale_factor: multiplier of the uint8 values (1/255 in every reference recipe).
        mean: 3 per-channel means (after rescaling).
        std: 3 per-channel standard deviations.

    Returns:
        ``[3, H, W] float32``, C-contiguous.

    Raises:
        ValueError: ``pixels`` not ``[H, W, 3] uint8``.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected [H, W, 3] uint8 pixels, got {pixels.dtype} {list(pixels.shape)}")
    table = _normalise_table(float(rescale_factor), tuple(map(float, mean)), tuple(map(float, std)))
    out = np.empty((3, pixels.shape[0], pixels.shape[1]), dtype=np.float32)
    for c in range(3):
        # mode="clip": a uint8 index is always inside the 256-entry table, and numpy buffers
        # ``out`` under the default mode="raise" (6.1 -> 0.94 ms for 512 x 512 x 3).
        np.take(table[c], pixels[:, :, c], out=out[c], mode="clip")
    return out


@lru_cache(maxsize=64)
def _normalise_table(rescale_factor: float, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """``[3, 256] float32``: :func:`rescale_normalise`'s result for every byte value per channel."""
    scaled = (np.arange(256, dtype=np.float64) * rescale_factor).astype(np.float32)
    m = np.asarray(mean, dtype=np.float32)[:, None]
    sd = np.asarray(std, dtype=np.float32)[:, None]
    table = (scaled[None, :] - m) / sd
    table.setflags(write=False)
    return table


def patch_grid(height: int, width: int, s: ImageSettings) -> tuple[int, int]:
    """The patch grid ``(Hp, Wp)`` :func:`preprocess_image` gives an image of ``height x width``
    pixels (known from the size alone, so a mask can be put on its image's grid without the
    image's pixels)."""
    p = s.patch_size
    if s.mode == "fixed":
        h, w = s.fixed_size
        return h // p, w // p
    if s.mode != "naflex":
        raise ValueError(f"unknown image mode {s.mode!r}")
    h, w = naflex_target_size(height, width, p, s.max_num_patches)
    return h // p, w // p


def preprocess_image(image: Image.Image, s: ImageSettings) -> PreprocessedImage:
    """Reproduce the reference image processor for one RGB image.

    Args:
        image: a PIL image; converted to RGB first, as the reference does.
        s: the bundle's :class:`ImageSettings`.

    Returns:
        :class:`PreprocessedImage` (see its shapes).
    """
    image = to_rgb(image)
    p = s.patch_size
    if s.mode == "fixed":
        h, w = s.fixed_size
        x = _resize_normalize(image, h, w, s)
        n = (h // p) * (w // p)
        return PreprocessedImage(x, np.ones(n, dtype=np.int32), (h // p, w // p))
    if s.mode != "naflex":
        raise ValueError(f"unknown image mode {s.mode!r}")
    hp, wp = patch_grid(image.height, image.width, s)
    x = _resize_normalize(image, hp * p, wp * p, s)
    # (C, H, W) -> (Hp*Wp, p*p*C): the reference's convert_image_to_patches.
    patches = x.reshape(3, hp, p, wp, p).transpose(1, 3, 2, 4, 0).reshape(hp * wp, p * p * 3)
    pixel_values = np.zeros((s.max_num_patches, p * p * 3), dtype=np.float32)
    pixel_values[: hp * wp] = patches
    mask = np.zeros(s.max_num_patches, dtype=np.int32)
    mask[: hp * wp] = 1
    return PreprocessedImage(pixel_values, mask, (hp, wp))
