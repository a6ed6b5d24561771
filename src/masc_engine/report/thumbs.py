"""Thumbnails of the report's images, and the rules for which files it may read.

A score file (and its sidecar) may come from someone else, and the page is made to be shared, so
only images under the score file's folder and the ``--image-root`` folders
(``ReportOptions.image_root`` / ``image_roots``) are read: the real path of each file (every
symlink resolved) must lie under one of them (:func:`confined`); any other file, ``../`` and
absolute paths included, is the placeholder :data:`OUTSIDE`. An image past masc-run's pixel limit
(:func:`pixel_limit`) is refused from its header ("too large"), and only runtime/io.py's formats
(``IMAGE_FORMATS``) are opened, for images and masks alike.

Image paths: ``ref_image`` / ``out_image`` are relative to the pairs CSV's folder (the sidecar's
``input``; see :func:`image_root`), ``cp_map`` / ``pf_map`` relative to the score file's folder;
absolute paths are used as they are. An image that cannot be read shows a placeholder.
:func:`side_figure` and :func:`map_figure` turn a row's cells into :class:`Figure` records (a
thumbnail, or the reason for its placeholder) for the page.
"""

from __future__ import annotations

import base64
import io
import os
import warnings
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.io import IMAGE_FORMATS
from .data import SIDES, cell_text, map_column

__all__ = [
    "OUTSIDE",
    "UNREADABLE_PATH",
    "MASK_EDGE",
    "image_root",
    "pixel_limit",
    "allowed_roots",
    "confined",
    "Thumbnails",
    "Figure",
    "side_figure",
    "map_figure",
    "row_figures",
]


def image_root(meta: Mapping[str, Any] | None, scores_path: str | Path | None) -> Path | None:
    """The folder relative ``ref_image`` / ``out_image`` paths are resolved against: the folder of
    the pairs CSV recorded as ``input`` in the sidecar. A relative ``input`` is relative to where
    masc-run ran, which we do not know: the first of (current directory, score file's folder)
    where the pairs file exists wins; else the score file's folder."""
    scores_dir = Path(scores_path).resolve().parent if scores_path is not None else None
    inp = cell_text((meta or {}).get("input")).strip()
    if inp:
        p = Path(inp)
        if p.is_absolute():
            return p.parent
        for base in (Path.cwd(), scores_dir):
            if base is not None and (base / p).is_file():
                return (base / p).resolve().parent
    return scores_dir


#: The placeholder of an image outside the folders the report may read (:func:`allowed_roots`).
OUTSIDE = "not shown: outside the allowed folders"
#: The placeholder of a cell no file can have: a NUL byte, a name past the system's length limit.
UNREADABLE_PATH = "not shown: unreadable path"


def pixel_limit() -> int:
    """The largest image, in pixels, a thumbnail is made of: masc-run's own limit, Pillow's
    decompression-bomb limit ``Image.MAX_IMAGE_PIXELS`` (runtime/io.py refuses every image past
    it as ``image_too_large``; 89,478,485 by default), read when called."""
    from PIL import Image

    return int(Image.MAX_IMAGE_PIXELS or 0) or 89_478_485


def allowed_roots(scores_path: str | Path | None, extra: Sequence[str | Path] = ()) -> tuple[str, ...]:
    """The folders the report reads images from: the score file's folder and each of ``extra``
    (``--image-root``), as real paths (symlinks resolved)."""
    roots = [os.path.dirname(os.path.realpath(scores_path))] if scores_path is not None else []
    roots += [os.path.realpath(r) for r in extra]
    return tuple(dict.fromkeys(roots))


def confined(path: str | Path, roots: Sequence[str]) -> str | None:
    """``path``'s real path (every symlink resolved) when it lies under one of ``roots`` (real
    paths), else None: a ``../`` step, an absolute path or a symlink that leads out of them is
    refused."""
    real = os.path.realpath(path)
    for root in roots:
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            return real
    return None


class Thumbnails:
    """Downscaled JPEG data URIs of image files, each path read once.

    ``get(path)`` returns ``(data_uri, None)`` or ``(None, reason)``; it never raises.

    Confinement: with ``roots`` (real folder paths, :func:`allowed_roots`), a file is read only
    when its real path lies under one of them (:func:`confined`); any other is the placeholder
    :data:`OUTSIDE`, whether it exists or not. ``roots=None`` reads any path (the caller's own
    files). Images past ``max_pixels`` (default :func:`pixel_limit`, masc-run's) are refused
    from their header, before any pixel is decoded: ``too large (...)``. Only the formats of
    runtime/io.py ``IMAGE_FORMATS`` are opened, masks included.
    """

    def __init__(
        self, px: int = 144, quality: int = 80, max_pixels: int | None = None, roots: Sequence[str] | None = None
    ):
        self.px, self.quality = px, quality
        self.max_pixels = int(max_pixels) if max_pixels else pixel_limit()
        self.roots = tuple(roots) if roots is not None else None
        self._cache: dict[str, tuple[str | None, str | None]] = {}
        #: Distinct paths refused as outside the allowed folders (the command says so once).
        self.outside: set[str] = set()

    def get(self, path: str | Path | None) -> tuple[str | None, str | None]:
        if path is None or str(path).strip() == "":
            return None, "no path"
        key = str(path)
        if key not in self._cache:
            self._cache[key] = self._make(Path(key))
        return self._cache[key]

    def with_mask(self, path: str | Path | None, mask: str | Path | None) -> tuple[str | None, str | None, str]:
        """The image's thumbnail with ``mask`` drawn over it: ``(data_uri, None, note)`` or
        ``(None, reason, note)``. ``note`` is ``""`` when the mask was drawn, else why not
        (``mask: missing file``): the plain thumbnail is returned then. Never raises."""
        if mask is None or str(mask).strip() == "":
            return (*self.get(path), "")
        key = f"{path}\0{mask}"
        if key not in self._cache:
            self._cache[key] = self._make(Path(str(path)), Path(str(mask))) if path else (None, "no path")
        uri, reason = self._cache[key]
        if uri is None and reason is not None and reason.startswith("mask: "):
            return (*self.get(path), reason)
        return uri, reason, ""

    def _readable(self, path: Path, what: str = "") -> tuple[Path | None, str | None]:
        """The real path to open, or why not (outside the allowed folders; missing; a path the
        system cannot even look up: a NUL byte, a name too long)."""
        try:
            if self.roots is not None:
                real = confined(path, self.roots)
                if real is None:
                    self.outside.add(str(path))
                    return None, f"{what}{OUTSIDE}"
                path = Path(real)
            if not path.is_file():
                return None, f"{what}missing file"
        except (OSError, ValueError):
            return None, f"{what}{UNREADABLE_PATH}"
        return path, None

    def _thumb(self, path: Path, what: str = ""):
        """The image at ``path`` as an RGB thumbnail (EXIF orientation applied, transparency on
        white), or the reason it cannot be read (prefixed ``what``)."""
        from PIL import Image, ImageOps

        real, why = self._readable(path, what)
        if real is None:
            return None, why
        try:
            with _open_image(real, self.max_pixels, what) as im:
                im.draft("RGB", (self.px * 2, self.px * 2))  # JPEG: decode at a reduced scale
                im = ImageOps.exif_transpose(im)
                if im.mode in ("RGBA", "LA", "PA") or (im.mode == "P" and "transparency" in im.info):
                    im = im.convert("RGBA")
                    bg = Image.new("RGBA", im.size, (255, 255, 255, 255))
                    im = Image.alpha_composite(bg, im)
                im = im.convert("RGB")
                im.thumbnail((self.px, self.px), Image.Resampling.LANCZOS)
                return im, None
        except _TooLarge as e:
            return None, str(e)
        except Exception as e:  # noqa: BLE001 - any unreadable image becomes a placeholder
            return None, f"{what}unreadable ({type(e).__name__})"

    def _make(self, path: Path, mask: Path | None = None) -> tuple[str | None, str | None]:
        im, reason = self._thumb(path)
        if im is None:
            return None, reason
        if mask is not None:
            real, reason = self._readable(mask, "mask: ")
            if real is None:
                return None, reason
            im, reason = _draw_mask(im, real, self.max_pixels)
            if im is None:
                return None, reason
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=self.quality, optimize=True)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii"), None


class _TooLarge(Exception):
    """An image past the pixel limit (its message is the placeholder's reason)."""


@contextmanager
def _open_image(path: Path, max_pixels: int, what: str = ""):
    """``Image.open`` through runtime/io.py's format allowlist (no Ghostscript, no rare
    decoders), refused from the header alone past ``max_pixels`` (:class:`_TooLarge`)."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit is checked below
        try:
            im = Image.open(path, formats=IMAGE_FORMATS)
        except Image.DecompressionBombError as e:
            raise _TooLarge(f"{what}too large (over {max_pixels:,} pixels)") from e
    with im:
        if im.width * im.height > max_pixels:
            raise _TooLarge(f"{what}too large ({im.width}x{im.height} pixels, over {max_pixels:,})")
        yield im


#: The outline of a mask's foreground in a thumbnail (cyan: apart from the plots' colours).
MASK_EDGE = (0, 229, 255)


def _draw_mask(thumb, mask_path: Path, max_pixels: int):
    """``thumb`` with the mask drawn over it: the background dimmed to 40%, the foreground's edge
    outlined in :data:`MASK_EDGE` (left out when the edge would cover more than a fifth of the
    thumbnail: a speckled mask, e.g. a random-weight segmenter's, is shown by the dimming alone).
    The mask's foreground is its non-zero pixels, as masc-run reads them, brought to the
    thumbnail's size by area averaging and a majority. ``(image, None)`` or ``(None, "mask: why")``."""
    from PIL import Image, ImageChops, ImageFilter, ImageOps

    if not mask_path.is_file():
        return None, "mask: missing file"
    try:
        with _open_image(mask_path, max_pixels, "mask: ") as m:
            m = ImageOps.exif_transpose(m).convert("L")
            fg = m.point(lambda v: 255 if v else 0).resize(thumb.size, Image.Resampling.BOX)
            fg = fg.point(lambda v: 255 if v >= 128 else 0)
    except _TooLarge as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - an unreadable mask leaves the plain thumbnail
        return None, f"mask: unreadable ({type(e).__name__})"
    dim = Image.blend(Image.new("RGB", thumb.size, (0, 0, 0)), thumb, 0.4)
    out = Image.composite(thumb, dim, fg)
    edge = ImageChops.difference(fg.filter(ImageFilter.MaxFilter(3)), fg.filter(ImageFilter.MinFilter(3)))
    if sum(edge.histogram()[1:]) <= 0.2 * thumb.width * thumb.height:
        out.paste(Image.new("RGB", thumb.size, MASK_EDGE), (0, 0), edge)
    return out, None


def _resolve(base: Path | None, p: str) -> Path | None:
    p = p.strip()
    if not p:
        return None
    q = Path(p)
    if q.is_absolute() or base is None:
        return q
    return base / q


@dataclass(frozen=True)
class Figure:
    """One image of a pair on the page: its thumbnail, or the placeholder saying why not.

    Attributes:
        label: what the image is (``reference``, ``output``, ``CP map``): the image's alt text.
        uri: the thumbnail as a ``data:image/jpeg;base64,`` URI, or None (a placeholder).
        reason: why there is no thumbnail (``missing file``, :data:`OUTSIDE`, ...); None with a URI.
        tip: the file's path as the row names it (shown on hover; ``""`` without a path).
        name: the file's name (under a placeholder; ``no path`` without a path).
        caption: the text under the image.
        mask_source: where the drawn mask came from (``file``, ``segmenter``, ``none``); None
            for an image that carries no mask (an attribution map).
    """

    label: str
    uri: str | None
    reason: str | None
    tip: str
    name: str
    caption: str
    mask_source: str | None = None


def _make_figure(
    label: str,
    uri: str | None,
    reason: str | None,
    path: Path | None,
    caption: str | None = None,
    mask_source: str | None = None,
) -> Figure:
    return Figure(
        label=label,
        uri=uri,
        reason=None if uri is not None else (reason or "unavailable"),
        tip=str(path) if path is not None else "",
        name=path.name if path is not None else "no path",
        caption=label if caption is None else caption,
        mask_source=mask_source,
    )


def side_figure(
    r: Mapping[str, Any], side: tuple[str, str, str], thumbs: Thumbnails, img_root: Path | None, map_root: Path | None
) -> Figure:
    """One side of a pair (an entry of :data:`~masc_engine.report.data.SIDES`): its image with its
    mask drawn over it, captioned with the mask's source (``file``, ``segmenter`` or ``none``).

    A file mask is read from the ``ref_mask`` / ``out_mask`` cell (resolved against ``img_root``,
    as the images are); a segmenter's from ``ref_mask_saved`` / ``out_mask_saved`` (resolved
    against ``map_root``, the score file's folder), or named "not saved". Never raises.
    """
    image_col, mask_col, label = side
    p = _resolve(img_root, cell_text(r.get(image_col)))
    source = cell_text(r.get(f"{mask_col}_source")) if f"{mask_col}_source" in r else "file"
    if source == "segmenter":
        mask = _resolve(map_root, cell_text(r.get(f"{mask_col}_saved")))
        what = "segmenter mask" + ("" if mask is not None else " (not saved)")
    else:
        mask = _resolve(img_root, cell_text(r.get(mask_col))) if source == "file" else None
        what = "file mask" if source == "file" else "no mask"
    uri, reason, note = thumbs.with_mask(p, mask)
    caption = f"{label} · {what}" + (f" ({note})" if note else "")
    return _make_figure(label, uri, reason, p, caption, source or "none")


def map_figure(r: Mapping[str, Any], metric: str, thumbs: Thumbnails, map_root: Path | None) -> Figure:
    """The row's attribution overlay of ``metric`` (its ``<metric>_map`` cell, resolved against
    ``map_root``, the score file's folder). Never raises."""
    p = _resolve(map_root, cell_text(r.get(map_column(metric))))
    return _make_figure(f"{metric.upper()} map", *thumbs.get(p), p)


def row_figures(
    r: Mapping[str, Any], metric: str | None, thumbs: Thumbnails, img_root: Path | None, map_root: Path | None
) -> list[Figure]:
    """The figures of one row: each side of the pair, then the ``metric``'s map (None: no map)."""
    figs = [side_figure(r, side, thumbs, img_root, map_root) for side in SIDES]
    if metric is not None:
        figs.append(map_figure(r, metric, thumbs, map_root))
    return figs
