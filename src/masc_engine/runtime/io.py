"""Reading images and masks from files, with a reason for every failure.

Images are opened as the reference's examples do (``Image.open``; RGB conversion happens in
preprocessing) and masks as ``np.array(Image.open(mask).convert("L"))`` (masc-metric 0.3.0
README). Every failure raises :class:`InputError` whose ``reason`` is a short machine-readable
status (``missing_file``, ``unreadable_image``, ``unreadable_mask``, ``image_too_large``...),
which ``masc-run`` writes into the row's ``status``.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from PIL import Image

from ..errors import InputError

#: Pillow's decompression-bomb guard, kept at its default (about 89.5 Mpixel) and turned from a
#: warning into a per-row error, so one huge file cannot exhaust memory in a long run.
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS


def _open(path: str, kind: str) -> Image.Image:
    if not os.path.isfile(path):
        raise InputError("missing_file", f"{kind} {path} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(path)
            im.load()
        return im
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError("image_too_large", f"{kind} {path}: {e}") from e
    except (OSError, ValueError, SyntaxError) as e:
        raise InputError(f"unreadable_{kind}", f"{path}: {e}") from e


def load_image(path: str) -> Image.Image:
    """Decode an image file fully (so errors surface here, not in a worker).

    Raises:
        InputError: ``missing_file``, ``unreadable_image`` or ``image_too_large``.
    """
    return _open(path, "image")


def load_mask(path: str) -> np.ndarray:
    """A mask file as ``[H, W] uint8`` (``convert("L")``; foreground = non-zero).

    Raises:
        InputError: ``missing_file``, ``unreadable_mask`` or ``image_too_large``.
    """
    return np.asarray(_open(path, "mask").convert("L"))
