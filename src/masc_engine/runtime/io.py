"""Reading images and masks from files, with a reason for every failure.

Every failure raises :class:`InputError` whose ``reason`` is a short machine-readable status
(``missing_file``, ``unreadable_image``, ``unreadable_mask``, ``image_too_large``), which
``masc-run`` writes into the row's ``status``; one bad file never stops a run.

Policies (documented in README "Input policies"):

- **EXIF orientation** (``exif="apply"``, the default): the image and its mask are each rotated
  by their own EXIF orientation tag (``ImageOps.exif_transpose``), so both are read as a viewer
  shows them. ``exif="ignore"`` reads the stored pixels, as masc-metric 0.3.0 does (it never
  applies EXIF). A mask that matches its image only in the other orientation is caught by the
  size check (``mask_orientation_mismatch``).
- **Colour modes**: images are converted to RGB as the reference does (``convert("RGB")``: alpha
  and palette transparency dropped, CMYK converted by Pillow); 16-bit greyscale (``I;16``/``I``)
  is scaled to 8 bits first (Pillow's plain conversion clips it to white).
- **Masks**: read as ``convert("L")`` (the reference's README), except palette PNGs, whose
  *indices* are the labels (index 0 = background, as in VOC/DAVIS-style masks), and 16-bit masks,
  scaled to 8 bits. JPEG masks are accepted; their compression noise stays below the 0.5 patch
  threshold, and mask coverage (:func:`masc_engine.runtime.masks.mask_coverage`) is measured at 0.5
  of the normalised mask, the rule scoring reads masks with, not at "non-zero".
- **Decompression bombs**: Pillow's pixel limit (about 89.5 Mpixel) is an error for that row.
"""

from __future__ import annotations

import io
import os
import re
import warnings

import numpy as np
from PIL import Image, ImageOps

from ..errors import InputError
from .masks import mask_coverage  # noqa: F401  (re-exported: coverage lives beside the mask rule)

EXIF_POLICIES = ("apply", "ignore")


def read_bytes(path: str, kind: str) -> bytes:
    if os.path.isdir(path):
        raise InputError(f"unreadable_{kind}", f"{kind} {path} is a directory, not a file")
    if not os.path.isfile(path):
        raise InputError("missing_file", f"{kind} {path} does not exist")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"unreadable_{kind}", f"{path}: {e}") from e


def _decode(data: bytes, path: str, kind: str, exif: str) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            warnings.simplefilter("ignore", UserWarning)  # palette-transparency notices
            im = Image.open(io.BytesIO(data))
            im.load()
            if exif == "apply":
                im = ImageOps.exif_transpose(im)
        return im
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError("image_too_large", f"{kind} {path}: {e}") from e
    except Image.UnidentifiedImageError:
        # Pillow's own message names our BytesIO object (a memory address), not the file.
        raise InputError(f"unreadable_{kind}", f"{path}: not an image Pillow can identify (unknown format, "
                                               "or not an image file)") from None
    except (OSError, ValueError, SyntaxError) as e:
        msg = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e))
        raise InputError(f"unreadable_{kind}", f"{path}: {msg}") from e


def _to_8bit(im: Image.Image) -> Image.Image:
    """16-bit / 32-bit integer greyscale -> 8-bit 'L' by scaling (not clipping)."""
    arr = np.asarray(im)
    top = 65535.0 if im.mode.startswith("I;16") or arr.max() > 255 else 255.0
    return Image.fromarray(np.clip(np.round(arr.astype(np.float64) * (255.0 / top)), 0, 255).astype(np.uint8), "L")


def image_from_bytes(data: bytes, path: str = "<bytes>", exif: str = "apply") -> tuple[Image.Image, tuple[str, ...]]:
    """Decode image bytes to an RGB PIL image; returns ``(image, notes)``.

    Raises:
        InputError: ``unreadable_image`` or ``image_too_large``.
    """
    im = _decode(data, path, "image", exif)
    notes = []
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        im = _to_8bit(im)
        notes.append("16-bit image scaled to 8 bits")
    if im.mode != "RGB":
        if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
            notes.append(f"{im.mode} alpha dropped")
        im = im.convert("RGB")
    return im, tuple(notes)


def mask_from_bytes(data: bytes, path: str = "<bytes>", exif: str = "apply") -> np.ndarray:
    """Decode mask bytes to ``[H, W] uint8`` (foreground = non-zero).

    Raises:
        InputError: ``unreadable_mask`` or ``image_too_large``.
    """
    im = _decode(data, path, "mask", exif)
    if im.mode == "P":  # palette: the indices are the labels
        return np.where(np.asarray(im) != 0, 255, 0).astype(np.uint8)
    if im.mode in ("I;16", "I;16B", "I;16L", "I"):
        im = _to_8bit(im)
    return np.asarray(im.convert("L"))


def load_image(path: str, exif: str = "apply") -> Image.Image:
    """Decode an image file fully to RGB (so errors surface here, not in a worker).

    Raises:
        InputError: ``missing_file``, ``unreadable_image`` or ``image_too_large``.
    """
    return image_from_bytes(read_bytes(path, "image"), path, exif)[0]


def load_mask(path: str, exif: str = "apply") -> np.ndarray:
    """A mask file as ``[H, W] uint8`` (foreground = non-zero).

    Raises:
        InputError: ``missing_file``, ``unreadable_mask`` or ``image_too_large``.
    """
    return mask_from_bytes(read_bytes(path, "mask"), path, exif)
