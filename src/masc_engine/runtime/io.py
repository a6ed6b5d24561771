"""Reading images and masks from files or bytes, with a reason for every failure.

Every failure raises :class:`InputError` whose ``reason`` is a short machine-readable status
(``missing_file``, ``bad_path``, ``file_too_large``, ``unreadable_image``, ``unreadable_mask``,
``image_too_large``), which
``masc-run`` writes into the row's ``status`` and masc-serve answers with 422; one bad file never
stops a run or fails a neighbour item.

Policies (docs/input-policies.md):

- **File size before reading** (:func:`read_bytes`): a file's size is checked (``os.stat``) against
  a byte cap before any of it is read, and the read is bounded (cap + 1 bytes): ``file_too_large``.
  The default cap follows the pixel budget (:func:`default_max_file_bytes`: 4 bytes a pixel plus
  16 MiB). A path the operating system refuses (a NUL byte, a name too long) is ``bad_path``; a
  directory, FIFO or device is never opened.
- **Formats: an allowlist.** Only :data:`IMAGE_FORMATS` (JPEG, PNG, WebP, TIFF, BMP) are opened,
  through ``Image.open(..., formats=IMAGE_FORMATS)``. Pillow's other plugins are never tried:
  EPS/PS/PDF would make Pillow run Ghostscript (an external interpreter) on the bytes, and
  rarely used decoders (DDS, ICNS, FLI, ...) are a larger attack surface than a scoring service
  needs. Anything else is ``unreadable_image`` / ``unreadable_mask``.
- **Any decoder failure is the file's status.** Pillow's decoders raise more than ``OSError``
  on hostile bytes (``NotImplementedError``, ``struct.error``, ``IndexError``, ``KeyError``,
  ``ZeroDivisionError``, ``MemoryError``, ...): every ``Exception`` raised while opening,
  decoding or orienting one file becomes that file's :class:`InputError`.
- **Pixel budget before decoding**: Pillow's decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``,
  about 89.5 Mpixel by default; masc-serve sets ``--max-pixels``) is checked from the header by
  ``Image.open``: ``image_too_large``, nothing decoded. :func:`open_image` stops there, so a
  caller can reserve memory (:func:`decode_cost`) before :func:`image_from_opened` decodes.
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
"""

from __future__ import annotations

import errno
import io
import os
import re
import stat
import warnings
from types import TracebackType
from typing import Literal

import numpy as np
from PIL import Image, ImageOps

from ..engine.stage_clock import timed
from ..errors import InputError
from .masks import mask_coverage  # noqa: F401  (re-exported: coverage lives beside the mask rule)

EXIF_POLICIES = ("apply", "ignore")

#: Pillow format ids of the images masc-run and masc-serve read. Everything else is refused
#: before any decoder runs (see the module docstring).
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "TIFF", "BMP")
_FORMAT_NAMES = "JPEG, PNG, WebP, TIFF or BMP"


#: Bytes a file may hold beyond 4 bytes a pixel of the pixel budget (headers, EXIF, ICC profiles, XMP).
FILE_HEADER_ALLOWANCE = 16 * 2**20


def default_max_file_bytes(max_pixels: int | None = None) -> int:
    """The default byte cap of a file named as an image or mask: enough for an image at the pixel
    budget stored uncompressed at 4 bytes a pixel (8-bit RGBA, the widest that is decoded at one
    byte a sample), plus :data:`FILE_HEADER_ALLOWANCE` for headers and metadata.

    Args:
        max_pixels: the pixel budget (default: Pillow's ``Image.MAX_IMAGE_PIXELS``, about 89.5
            Mpixel unless set; its default when it is disabled with ``None``).

    Returns:
        bytes (about 357 MiB at Pillow's default budget).
    """
    if max_pixels is None:
        max_pixels = Image.MAX_IMAGE_PIXELS or 1024 * 1024 * 1024 // 4 // 3
    return 4 * int(max_pixels) + FILE_HEADER_ALLOWANCE


def _refused_path(e: Exception, path: str, kind: str) -> InputError:
    """The status of a path ``os.stat`` or ``os.open`` refused with ``e``."""
    if isinstance(e, ValueError):  # an embedded NUL byte, or a name the file system encoding cannot hold
        what = "holds a NUL byte" if "\0" in path else f"cannot be a file name ({e})"
        return InputError("bad_path", f"{kind} path {path!r} {what}: the operating system refuses it")
    if isinstance(e, FileNotFoundError) or getattr(e, "errno", None) == errno.ENOTDIR:
        return InputError("missing_file", f"{kind} {path} does not exist")
    if getattr(e, "errno", None) == errno.ENAMETOOLONG:
        return InputError(
            "bad_path", f"{kind} path {path[:60]!r}... ({len(path)} characters): {getattr(e, 'strerror', None)}"
        )
    return InputError(f"unreadable_{kind}", f"{path}: {getattr(e, 'strerror', None) or e}")


def _check_stat(st: os.stat_result, path: str, kind: str, cap: int) -> None:
    """Refuse what is not a regular file, or is over ``cap`` bytes."""
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"unreadable_{kind}", f"{kind} {path} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"unreadable_{kind}", f"{kind} {path} is not a regular file")
    if st.st_size > cap:
        raise InputError(
            "file_too_large", f"{kind} {path}: {st.st_size} bytes, over the cap of {cap} bytes (--max-file-mb)"
        )


def read_bytes(path: str, kind: str, max_bytes: int | None = None) -> bytes:
    """A file's bytes, its size checked before it is opened and the read bounded; ``kind``
    (``image`` / ``mask``) names it in errors.

    Args:
        path: the file.
        kind: ``image`` or ``mask``.
        max_bytes: the byte cap (default :func:`default_max_file_bytes`): a larger file is refused
            from its size (``os.stat``), before any of it is read, and at most ``max_bytes + 1``
            bytes are ever read (a file that grows after the check is refused too).

    Raises:
        InputError: ``missing_file``, ``bad_path`` (a NUL byte, a name too long: a path the
            operating system refuses), ``file_too_large`` or ``unreadable_<kind>`` (a directory,
            not a regular file, a read error).
    """
    cap = default_max_file_bytes() if max_bytes is None else int(max_bytes)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise _refused_path(e, path, kind) from None
    _check_stat(st, path, kind, cap)
    try:
        # O_NONBLOCK: a FIFO swapped in after the check cannot block the open (no effect on files).
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise _refused_path(e, path, kind) from None
    with os.fdopen(fd, "rb") as f:
        _check_stat(os.fstat(fd), path, kind, cap)
        try:
            data = f.read(cap + 1)
        except OSError as e:
            raise InputError(f"unreadable_{kind}", f"{path}: {e.strerror or e}") from None
    if len(data) > cap:
        raise InputError("file_too_large", f"{kind} {path}: more than {cap} bytes, the cap (--max-file-mb)")
    return data


def _one_line(e: BaseException) -> str:
    """An exception as one line, without Pillow's naming of our in-memory file object."""
    msg = re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(e))
    msg = " ".join(msg.split())
    return msg if msg else type(e).__name__


def _refuse(e: Exception, path: str, kind: str) -> InputError:
    """The one mapping from a Pillow failure to the file's status."""
    if isinstance(e, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return InputError("image_too_large", f"{kind} {path}: {_one_line(e)}")
    if isinstance(e, MemoryError):
        return InputError("image_too_large", f"{kind} {path}: out of memory while decoding it")
    if isinstance(e, Image.UnidentifiedImageError):
        # Pillow's own message names our BytesIO object (a memory address), not the file.
        return InputError(f"unreadable_{kind}", f"{path}: not a {_FORMAT_NAMES} image (other formats are refused)")
    if isinstance(e, (OSError, ValueError, SyntaxError)):
        return InputError(f"unreadable_{kind}", f"{path}: {_one_line(e)}")
    # NotImplementedError, struct.error, IndexError, ...: a decoder's bug on hostile bytes.
    return InputError(f"unreadable_{kind}", f"{path}: the {kind} decoder failed ({type(e).__name__}: {_one_line(e)})")


class _Guard:
    """Pillow's warnings as errors where they mean "refuse", silence where they are notices; any
    exception raised inside becomes the file's :class:`InputError`."""

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind
        self._w = warnings.catch_warnings()

    def __enter__(self) -> _Guard:
        self._w.__enter__()
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        warnings.simplefilter("ignore", UserWarning)  # palette-transparency and EXIF notices
        return self

    def __exit__(
        self, tp: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        self._w.__exit__(tp, e, tb)
        if e is not None and isinstance(e, Exception) and not isinstance(e, InputError):
            raise _refuse(e, self.path, self.kind) from e
        return False


def open_image(data: bytes, path: str = "<bytes>", kind: str = "image") -> Image.Image:
    """Identify ``data`` as one of :data:`IMAGE_FORMATS` and read its header only (nothing is
    decoded yet): the pixel budget is checked here.

    Args:
        data: the file's bytes.
        path: how the file is named in messages (a path, or a request field such as
            ``items[2].out_image``).
        kind: ``image`` or ``mask`` (the ``unreadable_<kind>`` status).

    Raises:
        InputError: ``unreadable_<kind>`` (not an accepted format, or a broken header) or
            ``image_too_large``.
    """
    with _Guard(path, kind):
        return Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)


def decode_cost(im: Image.Image, kind: str = "image") -> int:
    """Upper bound, in bytes, of the memory that decoding and reducing the opened image ``im``
    holds at once (what a decoded-bytes budget reserves before :func:`image_from_opened` or
    :func:`mask_from_opened` runs).

    Pillow stores a pixel in 1 byte (``1``, ``L``, ``P``), 2 (16-bit) or 4 (every multi-band
    mode, RGB included). Counted per pixel: the decoded image and one rotated or converted copy
    of it plus a byte of decoder buffers; for an image, its RGB copy (4); for 16-bit or 32-bit
    input, the float64 scaling arrays (24); for a mask, its uint8 array (1) and the float32
    arrays of mask normalisation (``runtime/masks.py``: 9). Measured peaks of one 6000 x 6000
    file (RSS high-water mark, Pillow 13): RGB image 8.5 bytes a pixel (bound 13), greyscale
    image 6.0 (7), greyscale mask 7.0 (13), RGB mask 11.0 (19), 16-bit image (4000 x 4000)
    24.1 (33) and mask 24.1 (39). The script: bench/decode_memory.py.
    """
    w, h = im.size
    stored = 1 if im.mode in ("1", "L", "P") else 2 if im.mode.startswith("I;16") else 4
    per_pixel = 2 * stored + 1
    if im.mode.startswith("I;16") or im.mode == "I":
        per_pixel += 24
    per_pixel += 1 + 9 if kind == "mask" else 4
    return int(w) * int(h) * per_pixel


def _orient(im: Image.Image, exif: str) -> Image.Image:
    if exif == "apply":
        return ImageOps.exif_transpose(im)
    return im


def _to_8bit(im: Image.Image) -> Image.Image:
    """16-bit / 32-bit integer greyscale -> 8-bit 'L' by scaling (not clipping)."""
    arr = np.asarray(im)
    top = 65535.0 if im.mode.startswith("I;16") or arr.max() > 255 else 255.0
    return Image.fromarray(np.clip(np.round(arr.astype(np.float64) * (255.0 / top)), 0, 255).astype(np.uint8), "L")


@timed("decode:image")
def image_from_opened(
    im: Image.Image, path: str = "<bytes>", exif: str = "apply"
) -> tuple[Image.Image, tuple[str, ...]]:
    """Decode an image opened by :func:`open_image` to an RGB PIL image: ``(image, notes)``.

    Raises:
        InputError: ``unreadable_image`` or ``image_too_large`` (any decoder failure).
    """
    with _Guard(path, "image"):
        im.load()
        im = _orient(im, exif)
        notes = []
        if im.mode in ("I;16", "I;16B", "I;16L", "I"):
            im = _to_8bit(im)
            notes.append("16-bit image scaled to 8 bits")
        if im.mode != "RGB":
            if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
                notes.append(f"{im.mode} alpha dropped")
            im = im.convert("RGB")
        return im, tuple(notes)


@timed("decode:mask")
def mask_from_opened(im: Image.Image, path: str = "<bytes>", exif: str = "apply") -> np.ndarray:
    """Decode a mask opened by :func:`open_image` to ``[H, W] uint8`` (foreground = non-zero).

    Raises:
        InputError: ``unreadable_mask`` or ``image_too_large`` (any decoder failure).
    """
    with _Guard(path, "mask"):
        im.load()
        im = _orient(im, exif)
        if im.mode == "P":  # palette: the indices are the labels
            return np.where(np.asarray(im) != 0, 255, 0).astype(np.uint8)
        if im.mode in ("I;16", "I;16B", "I;16L", "I"):
            labels = np.asarray(im)
            if labels.size and 0 <= labels.min() and labels.max() <= 1:  # a 0/1 label mask: its 1s are
                return labels.astype(np.uint8)  # the foreground, read as 0..1 (runtime/masks.py), as 8-bit 0/1
            im = _to_8bit(im)
        return np.asarray(im.convert("L"))


def image_from_bytes(data: bytes, path: str = "<bytes>", exif: str = "apply") -> tuple[Image.Image, tuple[str, ...]]:
    """Decode image bytes to an RGB PIL image; returns ``(image, notes)``.

    Raises:
        InputError: ``unreadable_image`` or ``image_too_large``.
    """
    return image_from_opened(open_image(data, path, "image"), path, exif)


def mask_from_bytes(data: bytes, path: str = "<bytes>", exif: str = "apply") -> np.ndarray:
    """Decode mask bytes to ``[H, W] uint8`` (foreground = non-zero).

    Raises:
        InputError: ``unreadable_mask`` or ``image_too_large``.
    """
    return mask_from_opened(open_image(data, path, "mask"), path, exif)


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
