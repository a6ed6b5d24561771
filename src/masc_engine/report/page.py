"""``masc-report``: one self-contained HTML file from a ``masc-run`` score file.

The page makes no request of its own: plots are matplotlib SVG inlined in the page (report/plots.py),
images are downscaled JPEG data URIs, the CSS is inline, and a Content-Security-Policy
(``default-src 'none'``) tells the browser to refuse anything else. Every piece of text that
comes from the data (prompts, keys, paths, metadata) goes through :func:`html.escape`.

Sections (each an element with that ``id``):

- ``random-weights`` (a banner, only when the sidecar says the bundle has random weights): these
  scores test the pipeline, not the subjects;
- ``summary``: the file, the number of rows, status counts (``ok`` and each failure reason) and
  the run's bundle / model / settings / versions from the ``<scores>.meta.json`` sidecar;
- ``methods``: per method (the ``method`` column; methods in order of first appearance, then the
  pooled row labelled ``pooled``, as masc-eval's rows: :func:`masc_engine.metrics.agreement.groups_in_order`)
  n, mean CP and mean PF with percentile-bootstrap 95% CIs
  (:func:`masc_engine.metrics.agreement.bootstrap_ci`, fixed seed);
- ``distributions``: per-method CP and PF box + strip plots;
- ``within-cross``: CP and PF histograms of within- vs cross-subject pairs, overlaid, with the
  ROC AUC and its stratified bootstrap CI: the pooled row of
  :func:`masc_engine.jobs.evaluation.auc_table`, the function behind ``masc-eval auc``;
- ``extremes``: the best and worst K pairs by CP and by PF with thumbnails of the reference and
  output images, each with its mask drawn over it (the background dimmed, the foreground's edge
  outlined) and captioned with the mask's source, and, when the score file has ``cp_map`` /
  ``pf_map`` columns, the attribution overlay of that score.

Masks: a run with a segmenter (``masc-run --segmenter``) records each mask's source
(``ref_mask_source`` / ``out_mask_source``: ``file`` or ``segmenter``); the summary then counts the
sources per side and names the segmenter and its rule (the sidecar's ``segmenter``). A file mask
is read from the ``ref_mask`` / ``out_mask`` cell (resolved as the images are); a segmenter's mask
from ``ref_mask_saved`` / ``out_mask_saved`` (``--save-masks``, relative to the score file's
folder), or is named "not saved" when the run did not save it.

Image paths: ``ref_image`` / ``out_image`` are relative to the pairs CSV's folder (the sidecar's
``input``; see :func:`image_root`), ``cp_map`` / ``pf_map`` relative to the score file's folder;
absolute paths are used as they are. An image that cannot be read shows a placeholder.

What is read: a score file (and its sidecar) may come from someone else, and the page is made to
be shared, so only images under the score file's folder and the ``--image-root`` folders
(``ReportOptions.image_root`` / ``image_roots``) are read: the real path of each file (every
symlink resolved) must lie under one of them (:func:`confined`); any other file, ``../`` and
absolute paths included, is the placeholder "not shown: outside the allowed folders". An image
past masc-run's pixel limit (:func:`pixel_limit`) is refused from its header ("too large"), and
only runtime/io.py's formats are opened, for images and masks alike.

Everything here is a function of its arguments (rows, metadata, paths to read thumbnails from);
only :func:`load_scores` and :func:`write_report` touch files besides the thumbnails.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..jobs import evaluation as ev
from ..jobs.evaluation import POOLED
from ..jobs.results import meta_path, read_output
from ..jobs.tables import DEFAULT_MAX_PAIRS_BYTES, Table, TableError
from ..metrics import agreement as ag
from ..runtime.io import IMAGE_FORMATS
from .plots import CROSS_COLOR, STRIP_MAX_POINTS, WITHIN_COLOR, svg_box_strip, svg_histograms

__all__ = [
    "POOLED",
    "RANDOM_WEIGHTS_BANNER",
    "ReportOptions",
    "load_scores",
    "prepare_rows",
    "status_counts",
    "method_stats",
    "method_groups",
    "within_cross",
    "random_weights",
    "extremes",
    "mask_sources",
    "image_root",
    "allowed_roots",
    "confined",
    "pixel_limit",
    "OUTSIDE",
    "Thumbnails",
    "svg_box_strip",
    "svg_histograms",
    "build_report",
    "write_report",
]

OK = "ok"
RANDOM_WEIGHTS_BANNER = ("Random-weight bundle: these scores test the pipeline, not subjects "
                         "(cross-subject CP can exceed same-subject).")
METRICS = ("cp", "pf")
#: The pair's two sides: (image column, mask column, label).
SIDES = (("ref_image", "ref_mask", "reference"), ("out_image", "out_mask", "output"))
METRIC_NAMES = {"cp": "CP (concept preservation)", "pf": "PF (prompt following)"}
MAP_COLUMN = {"cp": "cp_map", "pf": "pf_map"}


@dataclass(frozen=True)
class ReportOptions:
    """What the report shows.

    Attributes:
        title: page title (default: ``MaSC report: <file name>``).
        method_column: column grouping rows into methods (order of first appearance); rows
            without a method (no column, an empty cell) count in the pooled row only.
        within_column / within_value: rows whose ``within_column`` equals ``within_value`` are
            within-subject pairs, the others cross-subject; without a value the column is read
            as a boolean (1/0, true/false, yes/no, within/cross, same/different).
        top_k: best and worst pairs shown per score.
        thumb_px: longest side of a thumbnail.
        n_resamples / confidence / seed: the bootstrap of the CIs (deterministic for a seed).
        image_root: folder the relative ``ref_image`` / ``out_image`` paths are resolved against
            (default: :func:`image_root` from the sidecar); images are read from it too.
        image_roots: further folders images may be read from. The report reads images only under
            the score file's folder, ``image_root`` and these (real paths: no symlink leads out
            of them); any other file is a placeholder (:data:`OUTSIDE`).
        max_scores_bytes: largest score file, bytes, checked from its size before it is read
            (every row is held in memory; masc-report ``--max-scores-mb``; None: no limit).
    """

    title: str | None = None
    method_column: str = "method"
    within_column: str | None = None
    within_value: str | None = None
    top_k: int = 5
    thumb_px: int = 144
    n_resamples: int = 1000
    confidence: float = 0.95
    seed: int = 0
    image_root: str | None = None
    image_roots: tuple[str, ...] = ()
    max_scores_bytes: int | None = DEFAULT_MAX_PAIRS_BYTES


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def load_scores(path: str | Path, max_bytes: int | None = None) -> tuple[list[dict], dict | None]:
    """The rows of a score file (CSV / Parquet / JSON Lines) and its sidecar (``None`` if absent
    or unreadable).

    Args:
        path: the score file.
        max_bytes: the score file's byte budget, checked from its size before it is read (None:
            no limit).

    Raises:
        TableError: the file is over ``max_bytes`` (``bad_scores_file``), missing or unparsable.
    """
    p = Path(path)
    if max_bytes is not None and p.is_file() and (size := p.stat().st_size) > max_bytes:
        raise TableError("bad_scores_file", f"{p}: {size} bytes, over the budget of {max_bytes} bytes "
                                            "(--max-scores-mb)")
    rows = read_output(path, max_bytes, "--max-scores-mb")  # the size again, and the rows as they arrive
    return rows, _load_sidecar(meta_path(path))


#: Largest sidecar read, bytes (masc-run writes a few KiB): a larger one is not a sidecar.
MAX_SIDECAR_BYTES = 16 * 2**20


def _load_sidecar(mp: Path) -> dict | None:
    """The sidecar's JSON object, or None when it is absent, not a regular file, over
    :data:`MAX_SIDECAR_BYTES`, unparsable (nesting too deep included) or not an object: the
    page then says no sidecar was found."""
    try:
        if not mp.is_file() or mp.stat().st_size > MAX_SIDECAR_BYTES:
            return None
        with open(mp, "rb") as f:
            meta = json.loads(f.read(MAX_SIDECAR_BYTES + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


def _num(v: Any) -> float:
    """A score cell as float; empty / None / unparsable / infinite -> NaN."""
    if v is None or isinstance(v, bool):
        return float("nan")
    try:
        x = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return x if math.isfinite(x) else float("nan")


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and math.isnan(v):
        return ""
    return str(v)


def prepare_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Copies of the rows with ``cp`` / ``pf`` as floats (NaN when missing), ``status`` as text
    and ``_row`` the row's 1-based index (``row_index`` when present).

    Raises:
        ValueError: there are rows but none has a ``cp`` or ``pf`` column (not a score file).
    """
    out = []
    if rows and not any("cp" in r or "pf" in r for r in rows[:1]):
        raise ValueError(f"not a masc-run score file: no cp/pf columns (columns: {', '.join(map(str, rows[0]))})")
    for i, r in enumerate(rows, start=1):
        d = dict(r)
        d["cp"], d["pf"] = _num(r.get("cp")), _num(r.get("pf"))
        st = _text(r.get("status")).strip()
        d["status"] = st or ("(no status)" if "status" not in r else "(empty)")
        ri = _num(r.get("row_index"))
        d["_row"] = int(ri) if not math.isnan(ri) else i
        out.append(d)
    return out


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------


def status_counts(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """``[(status, n)]``: ``ok`` first (also when 0), then the failure reasons by count, then
    name."""
    c = Counter(r["status"] for r in rows)
    rest = sorted(((s, n) for s, n in c.items() if s != OK), key=lambda t: (-t[1], t[0]))
    return [(OK, c.get(OK, 0))] + rest


def method_groups(rows: Sequence[Mapping[str, Any]], column: str) -> list[tuple[str, str, np.ndarray]]:
    """``[(scope, name, indices)]``: the methods in order of first appearance, then the pooled
    group (``scope`` and ``name`` ``POOLED``): masc-eval's grouping
    (:func:`masc_engine.metrics.agreement.groups_in_order`). Rows without a method (no column,
    an empty cell) are in the pooled group only."""
    labels = [r.get(column) for r in rows] if any(column in r for r in rows) else None
    return ag.groups_in_order(labels, len(rows), "method")


def _mean_ci(x: np.ndarray, opts: ReportOptions) -> dict:
    x = x[~np.isnan(x)]
    if x.size == 0:
        return {"n": 0, "mean": float("nan"), "low": float("nan"), "high": float("nan")}
    ci = ag.bootstrap_ci(np.mean, x, n_resamples=opts.n_resamples, confidence=opts.confidence, seed=opts.seed)
    return {"n": int(x.size), "mean": float(np.mean(x)), "low": ci.low, "high": ci.high}


def method_stats(rows: Sequence[Mapping[str, Any]], opts: ReportOptions = ReportOptions()) -> list[dict]:
    """Per method, then pooled (``method`` and ``scope`` ``POOLED``; left out when one method holds
    every row, as it would repeat that row), grouped by :func:`method_groups`: ``n`` rows,
    ``n_ok``, and for CP and PF ``<m>_n`` (rows with a score), ``<m>_mean``, ``<m>_low``,
    ``<m>_high`` (percentile bootstrap over rows, ``opts.seed``). NaN scores (failed rows; PF of
    ``no_background``) are left out."""
    parts = method_groups(rows, opts.method_column)
    if len(parts) == 2 and parts[0][2].size == len(rows):
        parts = parts[:1]
    out = []
    for scope, name, idx in parts:
        d: dict[str, Any] = {"scope": scope, "method": name, "n": len(idx),
                             "n_ok": sum(rows[i]["status"] == OK for i in idx)}
        for m in METRICS:
            s = _mean_ci(np.asarray([rows[i][m] for i in idx], dtype=np.float64), opts)
            d.update({f"{m}_n": s["n"], f"{m}_mean": s["mean"], f"{m}_low": s["low"], f"{m}_high": s["high"]})
        out.append(d)
    return out


def within_cross(rows: Sequence[Mapping[str, Any]], metric: str, opts: ReportOptions,
                 columns: Sequence[str] | None = None, source: str = "scores") -> ev.AucTable:
    """The within- vs cross-subject AUC of one score: :func:`masc_engine.jobs.evaluation.auc_table`
    (masc-eval auc's function) on the prepared rows, over every row with a defined score (no
    status filter: for a masc-run file, the rows whose ``<metric>_status`` is ``ok``).

    Args:
        rows: rows from :func:`prepare_rows`.
        metric: ``cp`` or ``pf``.
        opts: ``within_column`` (required), ``within_value`` and the bootstrap settings.
        columns: the score file's columns (named in errors); default: the rows' keys.
        source: the file named in errors.

    Raises:
        DataError: the within column is absent, or (boolean reading) a scored row's cell is not
            a boolean.
    """
    if columns is None:
        columns = [c for c in ev.as_table(list(rows), source).columns if c != "_row"]
    # prepare_rows gave every row both scores (NaN when absent): a file without PF has no PF units
    table = Table(Path(source), [*columns, *(m for m in METRICS if m not in columns)], list(rows), None)
    options = ev.AucOptions(score_column=metric, within_column=opts.within_column, within_value=opts.within_value,
                            status_column=None, n_resamples=opts.n_resamples, confidence=opts.confidence,
                            seed=opts.seed)
    return ev.auc_table(table, options)


def random_weights(meta: Mapping[str, Any] | None) -> bool:
    """Whether the sidecar says the scores came from a random-weight bundle: ``source_model``
    (the bundle manifest's ``source``, as masc-run records it) has ``random_weights`` true, or
    names a ``random:`` preset model."""
    src = (meta or {}).get("source_model")
    if isinstance(src, Mapping):
        return bool(src.get("random_weights")) or _text(src.get("model")).startswith("random:")
    return _text(src).startswith("random:")


def extremes(rows: Sequence[Mapping[str, Any]], metric: str, k: int, best: bool) -> list[dict]:
    """The ``k`` rows with the highest (``best``) or lowest ``metric`` among rows that have one;
    ties by row index."""
    have = [r for r in rows if not math.isnan(r[metric])]
    have.sort(key=lambda r: ((-r[metric]) if best else r[metric], r["_row"]))
    return have[:max(0, k)]


def mask_sources(rows: Sequence[Mapping[str, Any]]) -> dict[str, Counter] | None:
    """``{"reference": Counter, "output": Counter}`` of the mask source columns (``file``,
    ``segmenter``; an empty cell counts as ``none``), or None when the file has no such column
    (a run without a segmenter: every mask a file)."""
    if not rows or not any("ref_mask_source" in r for r in rows[:1]):
        return None
    return {label: Counter(_text(r.get(f"{m}_source")) or "none" for r in rows) for _, m, label in SIDES}


# --------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------


def image_root(meta: Mapping[str, Any] | None, scores_path: str | Path | None) -> Path | None:
    """The folder relative ``ref_image`` / ``out_image`` paths are resolved against: the folder of
    the pairs CSV recorded as ``input`` in the sidecar. A relative ``input`` is relative to where
    masc-run ran, which we do not know: the first of (current directory, score file's folder)
    where the pairs file exists wins; else the score file's folder."""
    scores_dir = Path(scores_path).resolve().parent if scores_path is not None else None
    inp = _text((meta or {}).get("input")).strip()
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
    roots = ([os.path.dirname(os.path.realpath(scores_path))] if scores_path is not None else [])
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

    def __init__(self, px: int = 144, quality: int = 80, max_pixels: int | None = None,
                 roots: Sequence[str] | None = None):
        self.px, self.quality = px, quality
        self.max_pixels = int(max_pixels) if max_pixels else pixel_limit()
        self.roots = tuple(roots) if roots is not None else None
        self._cache: dict[str, tuple[str | None, str | None]] = {}

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

        path, why = self._readable(path, what)
        if path is None:
            return None, why
        try:
            with _open_image(path, self.max_pixels, what) as im:
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


# --------------------------------------------------------------------------
# SVG
# --------------------------------------------------------------------------


def _e(v: Any) -> str:
    return html.escape(_text(v), quote=True)


def _f(x: float, nd: int = 4) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


# --------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------

CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1d2330;font:14px/1.45 "DejaVu Sans",Helvetica,Arial,sans-serif}
main{max-width:1220px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:22px;margin:4px 0 2px}
h2{font-size:17px;margin:0 0 10px;padding-bottom:4px;border-bottom:2px solid #e1e4ea}
h3{font-size:14px;margin:14px 0 6px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:14px 18px;margin:14px 0}
.sub{color:#5a6275;font-size:12.5px;margin:0 0 6px;word-break:break-all}
.note{color:#5a6275;font-size:12.5px;margin:6px 0}
.grid{display:flex;flex-wrap:wrap;gap:14px 28px;align-items:flex-start}
.kv{border-collapse:collapse;font-size:12.5px}
.kv th{text-align:left;color:#5a6275;font-weight:normal;padding:2px 10px 2px 0;vertical-align:top;white-space:nowrap}
.kv td{padding:2px 0;word-break:break-all;max-width:520px}
table.data{border-collapse:collapse;font-size:13px;width:100%}
table.data th{background:#eef0f4;text-align:left;padding:5px 8px;border-bottom:1px solid #d3d8e0;white-space:nowrap}
table.data td{padding:4px 8px;border-bottom:1px solid #eceef2;vertical-align:middle}
table.data tr.pooled td{font-weight:bold;background:#fafbfc}
table.data .num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ci{color:#6a7285;font-size:12px}
.pill{display:inline-block;border-radius:10px;padding:1px 8px;font-size:12px;background:#fde8e8;color:#9b1c1c}
.pill.ok{background:#e3f6e8;color:#166534}
.bar{display:inline-block;height:10px;border-radius:2px;vertical-align:middle;background:#d62728}
.bar.ok{background:#2ca02c}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:10px 26px;align-items:start}
svg.plot{background:#fff;width:100%;max-width:640px;height:auto;font-family:"DejaVu Sans",Helvetica,Arial,sans-serif}
svg .tick{font-size:11px;fill:#444}
svg .axis{font-size:12px;fill:#333}
svg .glabel{font-size:12px;fill:#1d2330}
svg .ptitle{font-size:13px;font-weight:bold;fill:#1d2330}
.extremes table.data td{font-size:12.5px}
.extremes table.data td.prompt{width:34%;overflow-wrap:anywhere}
.extremes table.data td.ident{width:22%;overflow-wrap:anywhere}
.ident .dim{color:#5a6275;font-size:11.5px}
.thumbs{display:flex;gap:4px}
figure{margin:0;text-align:center}
figure img{display:block;border-radius:3px;border:1px solid #d3d8e0;max-width:112px;max-height:112px}
figcaption{font-size:10.5px;color:#6a7285}
.banner{margin:10px 0 0;padding:9px 14px;border:1px solid #e0b252;border-left:5px solid #d97706;border-radius:6px;
    background:#fff7e6;color:#7a4a00;font-weight:bold}
.ph{width:112px;height:84px;border:1px dashed #b8bfcc;border-radius:3px;background:#f1f2f5;color:#6a7285;
    font-size:10.5px;display:flex;align-items:center;justify-content:center;text-align:center;padding:3px;
    overflow:hidden;overflow-wrap:anywhere}
"""

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def _kv_table(items: Sequence[tuple[str, Any]]) -> str:
    rows = []
    for k, v in items:
        if v is None or v == "" or v == {}:
            continue
        if isinstance(v, Mapping):
            v = ", ".join(f"{a}={json.dumps(b, default=str) if isinstance(b, (dict, list)) else b}"
                          for a, b in v.items())
        elif isinstance(v, (list, tuple)):
            v = ", ".join(map(str, v))
        rows.append(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>")
    return f'<table class="kv">{"".join(rows)}</table>' if rows else ""


def _summary_section(path_label: str, rows: list[dict], meta: Mapping[str, Any] | None, img_root: Path | None,
                     roots: Sequence[str] = ()) -> str:
    counts = status_counts(rows)
    n = len(rows)
    trs = []
    for st, c in counts:
        cls = "ok" if st == OK else ""
        frac = c / n if n else 0.0
        trs.append(f'<tr data-status="{_e(st)}"><td><span class="pill {cls}">{_e(st)}</span></td>'
                   f'<td class="num" data-count="{c}">{c}</td><td class="num">{100 * frac:.1f}%</td>'
                   f'<td><span class="bar {cls}" style="width:{max(1, round(160 * frac)) if c else 0}px"></span></td>'
                   f'</tr>')
    status_html = ('<table class="data" style="width:auto"><thead><tr><th>status</th><th class="num">rows</th>'
                   f'<th class="num">share</th><th></th></tr></thead><tbody>{"".join(trs)}</tbody></table>')
    m = meta or {}
    src = m.get("source_model")
    run_items = [("rows", n), ("ok", dict(counts).get(OK, 0)), ("not ok", n - dict(counts).get(OK, 0)),
                 ("images read only under", list(roots))]
    if meta is None:
        meta_html = '<p class="note">No metadata sidecar (&lt;scores&gt;.meta.json) found.</p>'
    else:
        model_items = []
        if isinstance(src, Mapping):
            model_items += [(f"source {k}", v) for k, v in src.items()]
        else:
            model_items.append(("source model", src))
        model_items += [("bundle", m.get("bundle")), ("bundle fingerprint", m.get("bundle_fingerprint")),
                        ("run fingerprint", m.get("fingerprint")), ("pairs file", m.get("input")),
                        ("images resolved from", str(img_root) if img_root else None),
                        ("finished", m.get("finished")), ("seconds", m.get("seconds")),
                        ("pairs / second", m.get("pairs_per_second"))]
        meta_html = (f'<div><h3>Bundle and model</h3>{_kv_table(model_items)}</div>'
                     f'<div><h3>Settings</h3>{_kv_table(list((m.get("settings") or {}).items()))}</div>'
                     f'<div><h3>Runtime versions</h3>{_kv_table(list((m.get("runtime_versions") or {}).items()))}'
                     '</div>')
    return (f'<section id="summary"><h2>Summary</h2>'
            f'<p class="sub">file: {_e(path_label)}</p>'
            f'<div class="grid"><div><h3>Rows</h3>{_kv_table(run_items)}</div>'
            f'<div><h3>Status</h3>{status_html}</div>{_masks_block(rows, meta)}</div>'
            f'<div class="grid">{meta_html}</div></section>')


def _masks_block(rows: list[dict], meta: Mapping[str, Any] | None) -> str:
    """Where the masks came from (a run with a segmenter), and the segmenter's rule."""
    sources = mask_sources(rows)
    if sources is None:
        return ""
    kinds = [k for k in ("file", "segmenter", "none") if any(c.get(k) for c in sources.values())]
    head = "".join(f'<th class="num">{_e(k)}</th>' for k in kinds)
    trs = "".join(f'<tr data-side="{label}"><td>{label}</td>'
                  + "".join(f'<td class="num" data-source="{k}">{sources[label].get(k, 0)}</td>' for k in kinds)
                  + "</tr>" for label in sources)
    seg = (meta or {}).get("segmenter") or {}
    rule = _kv_table([("segmenter", seg.get("bundle")), ("fingerprint", seg.get("fingerprint")),
                      ("threshold", seg.get("threshold")), ("prompt template", seg.get("prompt_template")),
                      ("provider", seg.get("provider"))]) if isinstance(seg, Mapping) else ""
    return (f'<div id="masks"><h3>Masks</h3><table class="data" style="width:auto"><thead><tr><th>mask</th>{head}'
            f'</tr></thead><tbody>{trs}</tbody></table>{rule}</div>')


def _methods_section(stats: list[dict], opts: ReportOptions) -> str:
    pct = round(100 * opts.confidence)
    head = ('<tr><th>method</th><th class="num">rows</th><th class="num">ok</th>'
            f'<th class="num">n CP</th><th class="num">mean CP</th><th class="num">{pct}% CI</th>'
            f'<th class="num">n PF</th><th class="num">mean PF</th><th class="num">{pct}% CI</th></tr>')
    trs = []
    for s in stats:
        cells = [f'<td>{_e(s["method"])}</td>', f'<td class="num">{s["n"]}</td>', f'<td class="num">{s["n_ok"]}</td>']
        for m in METRICS:
            mean = s[f"{m}_mean"]
            dv = "" if math.isnan(mean) else repr(float(mean))
            cells += [f'<td class="num">{s[f"{m}_n"]}</td>',
                      f'<td class="num" data-metric="{m}" data-value="{dv}">{_f(mean)}</td>',
                      f'<td class="num ci">[{_f(s[f"{m}_low"])}, {_f(s[f"{m}_high"])}]</td>']
        cls = ' class="pooled"' if s["scope"] == "pooled" else ""
        trs.append(f'<tr{cls} data-method="{_e(s["method"])}">{"".join(cells)}</tr>')
    return (f'<section id="methods"><h2>Per method</h2>'
            f'<table class="data"><thead>{head}</thead><tbody>{"".join(trs)}</tbody></table>'
            f'<p class="note">Means over rows with a score (failed rows, and PF of <code>no_background</code> '
            f'rows, are left out). {pct}% percentile-bootstrap intervals over rows, '
            f'{opts.n_resamples} resamples, seed {opts.seed}.</p></section>')


def _distributions_section(rows: list[dict], opts: ReportOptions) -> str:
    groups = method_groups(rows, opts.method_column)
    groups = groups[:-1] or groups  # the methods; the pooled rows only when there is no method
    plots = []
    for m in METRICS:
        g = [(name, np.asarray([rows[i][m] for i in idx], dtype=np.float64)) for _, name, idx in groups]
        plots.append(svg_box_strip(g, METRIC_NAMES[m], seed=opts.seed))
    return (f'<section id="distributions"><h2>Distributions by method</h2><div class="plots">{"".join(plots)}</div>'
            f'<p class="note">Box: quartiles and median; whiskers: min and max; diamond: mean; dots: the rows '
            f'(at most {STRIP_MAX_POINTS} per method, evenly spaced in rank).</p></section>')


def _auc_text(a: Mapping[str, Any]) -> str:
    if math.isnan(a["auc"]):
        return "AUC undefined"
    return f"AUC {_f(a['auc'], 3)}" + (f" [{_f(a['auc_low'], 3)}, {_f(a['auc_high'], 3)}]"
                                        if not math.isnan(a["auc_low"]) else "")


def _within_section(rows: list[dict], opts: ReportOptions, columns: Sequence[str], source: str) -> str:
    if not opts.within_column:
        return ('<section id="within-cross"><h2>Within- vs cross-subject</h2><p class="note">Not requested: give '
                '<code>--within-column COL</code> (with <code>--within-value V</code>, or a boolean column) to '
                'compare within-subject with cross-subject pairs.</p></section>')
    rule = (f"{opts.within_column} = {opts.within_value}" if opts.within_value is not None
            else f"{opts.within_column} is true")
    plots, trs = [], []
    for m in METRICS:
        t = within_cross(rows, m, opts, columns, source)
        a, s, lab = t.pooled, t.units.scores, t.units.within
        plots.append(svg_histograms([("within", s[lab], WITHIN_COLOR), ("cross", s[~lab], CROSS_COLOR)],
                                    m.upper(), title=f"{m.upper()}: within vs cross, {_auc_text(a)}"))
        dv = "" if math.isnan(a["auc"]) else repr(float(a["auc"]))
        trs.append(f'<tr><td>{m.upper()}</td><td class="num">{a["n_within"]}</td><td class="num">{a["n_cross"]}</td>'
                   f'<td class="num" data-metric="{m}" data-auc="{dv}">{_f(a["auc"], 4)}</td>'
                   f'<td class="num ci">[{_f(a["auc_low"], 4)}, {_f(a["auc_high"], 4)}]</td>'
                   f'<td>{_e(a["note"])}</td></tr>')
    table = ('<table class="data" style="width:auto"><thead><tr><th>score</th><th class="num">within</th>'
             f'<th class="num">cross</th><th class="num">AUC</th><th class="num">{round(100 * opts.confidence)}% CI</th>'
             '<th>note</th></tr></thead>'
             f'<tbody>{"".join(trs)}</tbody></table>')
    return (f'<section id="within-cross"><h2>Within- vs cross-subject</h2>'
            f'<p class="sub">within-subject: {_e(rule)}; every other row is cross-subject.</p>'
            f'<div class="plots">{"".join(plots)}</div>{table}'
            '<p class="note">ROC AUC: the probability that a within-subject pair scores above a cross-subject '
            'pair (ties count one half), over the rows with that score; interval: stratified percentile '
            'bootstrap. <code>masc-eval auc</code> gives the same rows.</p></section>')


def _figure(label: str, uri: str | None, reason: str | None, path: Path | None, caption: str | None = None,
            attrs: str = "") -> str:
    tip = _e(f"{path}" if path is not None else "")
    cap = _e(label if caption is None else caption)
    if uri is not None:
        return (f'<figure{attrs}><img src="{uri}" alt="{_e(label)}" title="{tip}"><figcaption>{cap}</figcaption>'
                f'</figure>')
    name = path.name if path is not None else "no path"
    return (f'<figure{attrs}><div class="ph" data-reason="{_e(reason or "unavailable")}" title="{tip}">'
            f'{_e(reason or "unavailable")}<br>{_e(name)}</div>'
            f'<figcaption>{cap}</figcaption></figure>')


def _side_figure(r: Mapping[str, Any], side: tuple[str, str, str], thumbs: Thumbnails, img_root: Path | None,
                 map_root: Path | None) -> str:
    """One side of a pair: its image with its mask drawn over it, captioned with the mask's source
    (``data-mask-source``: ``file``, ``segmenter`` or ``none``)."""
    image_col, mask_col, label = side
    p = _resolve(img_root, _text(r.get(image_col)))
    source = _text(r.get(f"{mask_col}_source")) if f"{mask_col}_source" in r else "file"
    if source == "segmenter":
        mask = _resolve(map_root, _text(r.get(f"{mask_col}_saved")))
        what = "segmenter mask" + ("" if mask is not None else " (not saved)")
    else:
        mask = _resolve(img_root, _text(r.get(mask_col))) if source == "file" else None
        what = "file mask" if source == "file" else "no mask"
    uri, reason, note = thumbs.with_mask(p, mask)
    caption = f"{label} · {what}" + (f" ({note})" if note else "")
    return _figure(label, uri, reason, p, caption, f' data-mask-source="{_e(source or "none")}"')


def _extremes_table(title: str, rows: list[dict], metric: str, thumbs: Thumbnails, img_root: Path | None,
                    map_root: Path | None, show_map: bool, ident_cols: list[str]) -> str:
    head = ("<tr><th>#</th><th>pair</th><th class=\"num\">CP</th><th class=\"num\">PF</th><th>prompt</th>"
            "<th>images</th></tr>")
    trs = []
    for rank, r in enumerate(rows, start=1):
        ident = [f"<b>row {r['_row']}</b>"] + [f'<span class="dim">{_e(c)}:</span> {_e(r.get(c))}'
                                               for c in ident_cols if _text(r.get(c))]
        st = r["status"]
        if st != OK:
            ident.append(f'<span class="pill">{_e(st)}</span>')
        prompt = _text(r.get("prompt")) or _text(r.get("prompt_text"))
        figs = [_side_figure(r, side, thumbs, img_root, map_root) for side in SIDES]
        if show_map:
            p = _resolve(map_root, _text(r.get(MAP_COLUMN[metric])))
            figs.append(_figure(f"{metric.upper()} map", *thumbs.get(p), p))
        trs.append(f'<tr data-row="{r["_row"]}"><td class="num">{rank}</td><td class="ident">{"<br>".join(ident)}</td>'
                   f'<td class="num">{_f(r["cp"])}</td><td class="num">{_f(r["pf"])}</td>'
                   f'<td class="prompt">{_e(prompt)}</td><td><div class="thumbs">{"".join(figs)}</div></td></tr>')
    body = "".join(trs) or '<tr><td colspan="6" class="note">no rows with this score</td></tr>'
    return f'<div><h3>{_e(title)}</h3><table class="data"><thead>{head}</thead><tbody>{body}</tbody></table></div>'


def _extremes_section(rows: list[dict], opts: ReportOptions, img_root: Path | None, map_root: Path | None,
                      thumbs: Thumbnails) -> str:
    ident_cols = [c for c in ("key", "subject", opts.method_column) if rows and c in rows[0]]
    if opts.within_column and opts.within_column not in ident_cols and rows and opts.within_column in rows[0]:
        ident_cols.append(opts.within_column)
    blocks = []
    for m in METRICS:
        show_map = any(_text(r.get(MAP_COLUMN[m])).strip() for r in rows)
        for best in (True, False):
            title = f"{'Best' if best else 'Worst'} {opts.top_k} by {m.upper()}"
            blocks.append(_extremes_table(title, extremes(rows, m, opts.top_k, best), m, thumbs, img_root, map_root,
                                          show_map, ident_cols))
    maps = any(any(_text(r.get(MAP_COLUMN[m])).strip() for r in rows) for m in METRICS)
    what = "reference, output and the score's attribution overlay" if maps else "reference and output"
    return (f'<section id="extremes"><h2>Best and worst pairs</h2><div class="extremes">{"".join(blocks)}</div>'
            f'<p class="note">Images: {what}; hover for the file path. Each image shows its mask: the background '
            'dimmed, the foreground outlined; the caption says whether the mask came from a file or from the '
            'segmenter. Missing or unreadable files show a placeholder, and so does any file outside the score '
            "file's folder and the <code>--image-root</code> folders (symlinks resolved) and any image over "
            "masc-run's pixel limit.</p></section>")


def _model_name(meta: Mapping[str, Any] | None) -> str:
    src = (meta or {}).get("source_model")
    if isinstance(src, Mapping):
        src = src.get("model") or src.get("id") or ""
    return _text(src)


def _banner(meta: Mapping[str, Any] | None) -> str:
    if not random_weights(meta):
        return ""
    return f'<div id="random-weights" class="banner" role="alert">{_e(RANDOM_WEIGHTS_BANNER)}</div>'


def build_report(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None, *,
                 scores_path: str | Path | None = None, options: ReportOptions = ReportOptions(),
                 thumbnails: Thumbnails | None = None) -> str:
    """The report as one HTML string.

    Args:
        rows: the score file's rows (as :func:`load_scores` returns them; cells may be text).
        meta: the sidecar, or None.
        scores_path: the score file (shown, and the folder ``cp_map`` / ``pf_map`` and, failing
            the sidecar, image paths are resolved against).
        options: see :class:`ReportOptions`.
        thumbnails: a :class:`Thumbnails` (default: one of ``options.thumb_px``).

    Raises:
        ValueError: not a score file (no cp/pf), or a bad ``within_column`` (a
            :class:`~masc_engine.jobs.evaluation.DataError`).
    """
    opts = options
    columns = list(ev.as_table(rows[:1], "scores").columns)
    rows = prepare_rows(rows)
    roots = allowed_roots(scores_path, ([opts.image_root] if opts.image_root else []) + list(opts.image_roots))
    thumbs = thumbnails or Thumbnails(opts.thumb_px, roots=roots)
    if thumbs.roots is None:
        thumbs.roots = roots
    img_root = Path(opts.image_root) if opts.image_root else image_root(meta, scores_path)
    map_root = Path(scores_path).resolve().parent if scores_path is not None else None
    label = str(scores_path) if scores_path is not None else "(rows)"
    title = opts.title or f"MaSC report: {Path(label).name}"
    stats = method_stats(rows, opts)
    body = [
        f'<header><h1>{_e(title)}</h1><p class="sub">{len(rows)} rows scored by masc-run'
        + (f" with {_e(_model_name(meta))}" if _model_name(meta) else "") + "</p></header>",
        _banner(meta),
        _summary_section(label, rows, meta, img_root, thumbs.roots),
        _methods_section(stats, opts),
        _distributions_section(rows, opts),
        _within_section(rows, opts, columns, label),
        _extremes_section(rows, opts, img_root, map_root, thumbs),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title><style>{CSS}</style></head>\n<body><main>\n"
            + "\n".join(body) + "\n</main></body></html>\n")


def write_report(scores_path: str | Path, out: str | Path, options: ReportOptions = ReportOptions(),
                 log: Callable[[str], None] | None = None) -> Path:
    """Read a score file (and its sidecar), build the report and write it (atomically).

    Raises:
        MissingDependencyError: matplotlib (the ``[report]`` extra) is not installed; raised
            before the score file is read.
        TableError: the score file is missing, over ``options.max_scores_bytes`` or unparsable
            (file and line named).
    """
    from .. import extras

    extras.check("matplotlib", "masc-report (its plots)", extra="report")
    rows, meta = load_scores(scores_path, options.max_scores_bytes)
    text = build_report(rows, meta, scores_path=scores_path, options=options)
    out = Path(out)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    if log:
        log(f"report written to {out} ({len(text) / 1024:.0f} KiB, {len(rows)} rows)")
    return out
