"""What the report shows, as plain Python data: the score file's rows, their statistics and each
section's figures, with no HTML (report/render.py lays them out; report/thumbs.py makes the images).

Sections (each an element of the page with that ``id``):

- ``random-weights`` (a banner, only when the sidecar says the bundle has random weights): these
  scores test the pipeline, not the subjects (:func:`random_weights`);
- ``summary``: the file, the number of rows, status counts (``ok`` and each failure reason) and
  the run's bundle / model / settings / versions from the ``<scores>.meta.json`` sidecar
  (:func:`summary`);
- ``methods``: per method (the ``method`` column; methods in order of first appearance, then the
  pooled row labelled ``pooled``, as masc-eval's rows: :func:`masc_engine.metrics.agreement.groups_in_order`)
  n, and per score of the file (:func:`file_metrics`: CP, PF and every other metric column, the
  classic ones included; the same scores in every section) its mean with a percentile-bootstrap 95% CI
  (:func:`masc_engine.metrics.agreement.bootstrap_ci`, fixed seed; :func:`method_stats`);
- ``distributions``: per-method box + strip plots of each score (:func:`distribution_groups`);
- ``within-cross``: each score's histograms of within- vs cross-subject pairs, overlaid, with the
  ROC AUC and its stratified bootstrap CI: the pooled row of
  :func:`masc_engine.jobs.evaluation.auc_table`, the function behind ``masc-eval auc``
  (:func:`within_cross`);
- ``extremes``: the best and worst K pairs by each score, with thumbnails of the reference and
  output images, each with its mask drawn over it and captioned with the mask's source, and, when
  the score file has ``<metric>_map`` columns, the attribution overlay of that score
  (:func:`extremes_tables`).

Masks: a run with a segmenter (``masc-run --segmenter``) records each mask's source
(``ref_mask_source`` / ``out_mask_source``: ``file`` or ``segmenter``); the summary then counts the
sources per side and names the segmenter and its rule (the sidecar's ``segmenter``).

Everything here is a function of its arguments; only :func:`load_scores` reads files.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..jobs import evaluation as ev
from ..jobs.eval_tables import metric_columns, random_weights
from ..jobs.evaluation import POOLED
from ..jobs.results import meta_path, read_output
from ..jobs.tables import DEFAULT_MAX_PAIRS_BYTES, Table, TableError, number_or_nan as _num
from ..metrics import agreement as ag
from ..runtime.pair_metrics import registered, score_metrics

__all__ = [
    "METRICS",
    "METRIC_LABELS",
    "file_metrics",
    "extreme_metrics",
    "OK",
    "POOLED",
    "RANDOM_WEIGHTS_BANNER",
    "SIDES",
    "ReportOptions",
    "load_scores",
    "cell_text",
    "prepare_rows",
    "status_counts",
    "method_groups",
    "method_stats",
    "within_cross",
    "random_weights",
    "extremes",
    "mask_sources",
    "metric_label",
    "map_column",
    "fmt_num",
    "kv_items",
    "model_name",
    "summary",
    "Summary",
    "StatusCount",
    "MaskSources",
    "distribution_groups",
    "auc_text",
    "within_rule",
    "ident_columns",
    "has_maps",
    "extremes_tables",
    "ExtremesTable",
    "ExtremeRow",
]

OK = "ok"
RANDOM_WEIGHTS_BANNER = (
    "Random-weight bundle: these scores test the pipeline, not subjects (cross-subject CP can exceed same-subject)."
)
#: The scores the report shows, in this order: every table, plot and column of the page derives
#: from it (``<metric>_map``: the score's attribution overlay). The registered pair metrics every
#: run computes (runtime/pair_metrics), by their score columns: ``("cp", "pf")`` built in.
METRICS = tuple(m.score_column for m in score_metrics())
#: The pair's two sides: (image column, mask column, label).
SIDES = (("ref_image", "ref_mask", "reference"), ("out_image", "out_mask", "output"))
#: Long names of registered scores on the plots' axes (any other: its upper-case name).
METRIC_LABELS = {m.score_column: m.axis_label for m in registered()}


def file_metrics(columns: Sequence[str]) -> tuple[str, ...]:
    """The scores a page shows for a file with these columns: :data:`METRICS`, then every other
    metric column the file has (the classic ``clip_i``, ``clip_t``, ``dino``, ``dino_s8``,
    ``dinov2``, the ``--baselines`` columns, plug-ins'), by masc-eval's rule
    (:func:`masc_engine.jobs.eval_tables.metric_columns`), in registration order."""
    try:
        found = metric_columns(columns)
    except ev.DataError:
        found = ()
    return tuple(dict.fromkeys((*METRICS, *found)))


def extreme_metrics(metrics: Sequence[str]) -> tuple[str, ...]:
    """The scores with best / worst tables: of ``metrics``, each registered metric's score column
    (its first: ``cp_mnn``, not ``cp_mnn_frac``; ``pf_full_stripped`` for the PF pooling family)."""
    scores = {m.score_column for m in registered()}
    return tuple(m for m in metrics if m in scores)


def metric_label(metric: str) -> str:
    """The axis label of a score: :data:`METRIC_LABELS`, else its upper-case name."""
    return METRIC_LABELS.get(metric, metric.upper())


def map_column(metric: str) -> str:
    """The column of a score's attribution overlay (masc-run ``--save-maps``): ``<metric>_map``."""
    return f"{metric}_map"


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
        raise TableError(
            "bad_scores_file", f"{p}: {size} bytes, over the budget of {max_bytes} bytes (--max-scores-mb)"
        )
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


def cell_text(v: Any) -> str:
    """A cell as text: ``""`` for None and NaN, else ``str(v)``."""
    if v is None:
        return ""
    if isinstance(v, float) and math.isnan(v):
        return ""
    return str(v)


def prepare_rows(rows: Sequence[Mapping[str, Any]], metrics: Sequence[str] | None = None) -> list[dict]:
    """Copies of the rows with each score of ``metrics`` (default: :func:`file_metrics` of the
    first row's columns) as a float (NaN when missing), ``status`` as text and ``_row`` the row's
    1-based index (``row_index`` when present).

    Raises:
        ValueError: there are rows but the first has no score column (not a score file).
    """
    out = []
    if metrics is None:
        metrics = file_metrics(list(rows[0])) if rows else METRICS
    if rows and not any(m in r for r in rows[:1] for m in metrics):
        raise ValueError(
            f"not a masc-run score file: no {'/'.join(METRICS)} columns (columns: {', '.join(map(str, rows[0]))})"
        )
    for i, r in enumerate(rows, start=1):
        d = dict(r)
        d.update({m: _num(r.get(m)) for m in metrics})
        st = cell_text(r.get("status")).strip()
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


def method_stats(
    rows: Sequence[Mapping[str, Any]], opts: ReportOptions = ReportOptions(), metrics: Sequence[str] = METRICS
) -> list[dict]:
    """Per method, then pooled (``method`` and ``scope`` ``POOLED``; left out when one method holds
    every row, as it would repeat that row), grouped by :func:`method_groups`: ``n`` rows,
    ``n_ok``, and for each score of ``metrics`` (prepared: :func:`prepare_rows`) ``<m>_n`` (rows with a score), ``<m>_mean``, ``<m>_low``,
    ``<m>_high`` (percentile bootstrap over rows, ``opts.seed``). NaN scores (failed rows; PF of
    ``no_background``) are left out."""
    parts = method_groups(rows, opts.method_column)
    if len(parts) == 2 and parts[0][2].size == len(rows):
        parts = parts[:1]
    out = []
    for scope, name, idx in parts:
        d: dict[str, Any] = {
            "scope": scope,
            "method": name,
            "n": len(idx),
            "n_ok": sum(rows[i]["status"] == OK for i in idx),
        }
        for m in metrics:
            s = _mean_ci(np.asarray([rows[i][m] for i in idx], dtype=np.float64), opts)
            d.update({f"{m}_n": s["n"], f"{m}_mean": s["mean"], f"{m}_low": s["low"], f"{m}_high": s["high"]})
        out.append(d)
    return out


def within_cross(
    rows: Sequence[dict[str, Any]],
    metric: str,
    opts: ReportOptions,
    columns: Sequence[str] | None = None,
    source: str = "scores",
) -> ev.AucTable:
    """The within- vs cross-subject AUC of one score: :func:`masc_engine.jobs.evaluation.auc_table`
    (masc-eval auc's function) on the prepared rows, over every row with a defined score (no
    status filter: for a masc-run file, the rows whose ``<metric>_status`` is ``ok``).

    Args:
        rows: rows from :func:`prepare_rows`.
        metric: a score of the prepared rows (:func:`file_metrics`).
        opts: ``within_column`` (required), ``within_value`` and the bootstrap settings.
        columns: the score file's columns (named in errors); default: the rows' keys.
        source: the file named in errors.

    Raises:
        DataError: the within column is absent, or (boolean reading) a scored row's cell is not
            a boolean.
        ValueError: ``opts.within_column`` is None.
    """
    if opts.within_column is None:
        raise ValueError("within_cross needs opts.within_column (the within- vs cross-subject column)")
    if columns is None:
        columns = [c for c in ev.as_table(list(rows), source).columns if c != "_row"]
    # prepare_rows gave every row every score (NaN when absent): a file without PF has no PF units
    table = Table(Path(source), [*columns, *(m for m in (*METRICS, metric) if m not in columns)], list(rows), None)
    options = ev.AucOptions(
        score_column=metric,
        within_column=opts.within_column,
        within_value=opts.within_value,
        status_column=None,
        n_resamples=opts.n_resamples,
        confidence=opts.confidence,
        seed=opts.seed,
    )
    return ev.auc_table(table, options)


def extremes(rows: Sequence[Mapping[str, Any]], metric: str, k: int, best: bool) -> list[Mapping[str, Any]]:
    """The ``k`` rows with the highest (``best``) or lowest ``metric`` among rows that have one;
    ties by row index."""
    have = [r for r in rows if not math.isnan(r[metric])]
    have.sort(key=lambda r: ((-r[metric]) if best else r[metric], r["_row"]))
    return have[: max(0, k)]


def mask_sources(rows: Sequence[Mapping[str, Any]]) -> dict[str, Counter] | None:
    """``{"reference": Counter, "output": Counter}`` of the mask source columns (``file``,
    ``segmenter``; an empty cell counts as ``none``), or None when the file has no such column
    (a run without a segmenter: every mask a file)."""
    if not rows or not any("ref_mask_source" in r for r in rows[:1]):
        return None
    return {label: Counter(cell_text(r.get(f"{m}_source")) or "none" for r in rows) for _, m, label in SIDES}


# --------------------------------------------------------------------------
# The page's sections, as data
# --------------------------------------------------------------------------


def fmt_num(x: float | None, nd: int = 4) -> str:
    """A number as shown on the page: ``nd`` decimals, ``–`` for None or NaN."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def kv_items(items: Sequence[tuple[str, Any]]) -> list[tuple[str, str]]:
    """``[(key, value text)]`` of a key/value table, the empty values (None, ``""``, ``{}``) left
    out: a mapping as ``a=b, ...`` (nested lists and mappings as JSON), a list as ``a, b``."""
    out = []
    for k, v in items:
        if v is None or v == "" or v == {}:
            continue
        if isinstance(v, Mapping):
            v = ", ".join(
                f"{a}={json.dumps(b, default=str) if isinstance(b, (dict, list)) else b}" for a, b in v.items()
            )
        elif isinstance(v, (list, tuple)):
            v = ", ".join(map(str, v))
        out.append((cell_text(k), cell_text(v)))
    return out


def model_name(meta: Mapping[str, Any] | None) -> str:
    """The sidecar's source model (``source_model``, or its ``model`` / ``id``), or ``""``."""
    src = (meta or {}).get("source_model")
    if isinstance(src, Mapping):
        src = src.get("model") or src.get("id") or ""
    return cell_text(src)


@dataclass(frozen=True)
class StatusCount:
    """One row of the summary's status table: ``share`` in percent, ``bar_px`` the bar's width."""

    status: str
    count: int
    share: float
    bar_px: int

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass(frozen=True)
class MaskSources:
    """Where the masks came from: ``kinds`` (columns: ``file``, ``segmenter``, ``none`` as present),
    ``sides`` (``[(side label, [count per kind])]``) and the segmenter's rule (key/value items)."""

    kinds: list[str]
    sides: list[tuple[str, list[int]]]
    rule: list[tuple[str, str]]


@dataclass(frozen=True)
class Summary:
    """The ``summary`` section: the file, its rows and statuses, the sidecar's run description
    (``sidecar`` None without a sidecar, else ``{"model", "settings", "versions"}`` key/value items)."""

    label: str
    statuses: list[StatusCount]
    rows: list[tuple[str, str]]
    masks: MaskSources | None
    sidecar: dict[str, list[tuple[str, str]]] | None


def _status_table(rows: Sequence[Mapping[str, Any]]) -> list[StatusCount]:
    n = len(rows)
    out = []
    for st, c in status_counts(rows):
        frac = c / n if n else 0.0
        out.append(StatusCount(st, c, 100 * frac, max(1, round(160 * frac)) if c else 0))
    return out


def _mask_table(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None) -> MaskSources | None:
    sources = mask_sources(rows)
    if sources is None:
        return None
    kinds = [k for k in ("file", "segmenter", "none") if any(c.get(k) for c in sources.values())]
    seg = (meta or {}).get("segmenter") or {}
    rule = (
        kv_items(
            [
                ("segmenter", seg.get("bundle")),
                ("fingerprint", seg.get("fingerprint")),
                ("threshold", seg.get("threshold")),
                ("prompt template", seg.get("prompt_template")),
                ("provider", seg.get("provider")),
            ]
        )
        if isinstance(seg, Mapping)
        else []
    )
    return MaskSources(kinds, [(label, [c.get(k, 0) for k in kinds]) for label, c in sources.items()], rule)


def _sidecar_items(meta: Mapping[str, Any], img_root: Path | None) -> dict[str, list[tuple[str, str]]]:
    src = meta.get("source_model")
    model = [(f"source {k}", v) for k, v in src.items()] if isinstance(src, Mapping) else [("source model", src)]
    model += [
        ("bundle", meta.get("bundle")),
        ("bundle fingerprint", meta.get("bundle_fingerprint")),
        ("run fingerprint", meta.get("fingerprint")),
        ("pairs file", meta.get("input")),
        ("images resolved from", str(img_root) if img_root else None),
        ("finished", meta.get("finished")),
        ("seconds", meta.get("seconds")),
        ("pairs / second", meta.get("pairs_per_second")),
    ]
    return {
        "model": kv_items(model),
        "settings": kv_items(list((meta.get("settings") or {}).items())),
        "versions": kv_items(list((meta.get("runtime_versions") or {}).items())),
    }


def summary(
    label: str,
    rows: Sequence[Mapping[str, Any]],
    meta: Mapping[str, Any] | None,
    img_root: Path | None,
    roots: Sequence[str] = (),
) -> Summary:
    """The ``summary`` section of prepared rows (:func:`prepare_rows`): ``label`` names the file,
    ``img_root`` the folder images are resolved from, ``roots`` the folders images are read from."""
    n_ok = dict(status_counts(rows)).get(OK, 0)
    run = kv_items(
        [("rows", len(rows)), ("ok", n_ok), ("not ok", len(rows) - n_ok), ("images read only under", list(roots))]
    )
    return Summary(
        label,
        _status_table(rows),
        run,
        _mask_table(rows, meta),
        None if meta is None else _sidecar_items(meta, img_root),
    )


def distribution_groups(
    rows: Sequence[Mapping[str, Any]], metric: str, opts: ReportOptions
) -> list[tuple[str, np.ndarray]]:
    """``[(method, scores)]`` of one score for the ``distributions`` plots: the methods, or the
    pooled rows alone when there is no method (float64, NaN for rows without the score)."""
    groups = method_groups(rows, opts.method_column)
    groups = groups[:-1] or groups
    return [(name, np.asarray([rows[i][metric] for i in idx], dtype=np.float64)) for _, name, idx in groups]


def auc_text(a: Mapping[str, Any]) -> str:
    """``AUC 0.812 [0.700, 0.900]`` of an :func:`within_cross` pooled row (``AUC undefined``)."""
    if math.isnan(a["auc"]):
        return "AUC undefined"
    return f"AUC {fmt_num(a['auc'], 3)}" + (
        f" [{fmt_num(a['auc_low'], 3)}, {fmt_num(a['auc_high'], 3)}]" if not math.isnan(a["auc_low"]) else ""
    )


def within_rule(opts: ReportOptions) -> str:
    """How rows are told within-subject: ``col = value`` or ``col is true``."""
    if opts.within_value is not None:
        return f"{opts.within_column} = {opts.within_value}"
    return f"{opts.within_column} is true"


@dataclass
class ExtremeRow:
    """One pair of a best / worst table: ``rank`` (1-based), ``ident`` (``[(column, value)]``
    shown under the row number), the row (``row``: prepared), its ``prompt`` and its images
    (``figures``: what the ``figures`` callback of :func:`extremes_tables` gave)."""

    rank: int
    row: Mapping[str, Any]
    ident: list[tuple[str, str]]
    prompt: str
    figures: list = field(default_factory=list)


@dataclass
class ExtremesTable:
    """One best / worst table: its ``title``, its ``metric`` and its rows."""

    title: str
    metric: str
    rows: list[ExtremeRow]


def ident_columns(rows: Sequence[Mapping[str, Any]], opts: ReportOptions) -> list[str]:
    """The columns naming a pair in the best / worst tables: ``key``, ``subject``, the method
    column and the within column, those the file has."""
    cols = [c for c in ("key", "subject", opts.method_column) if rows and c in rows[0]]
    if opts.within_column and opts.within_column not in cols and rows and opts.within_column in rows[0]:
        cols.append(opts.within_column)
    return cols


def has_maps(rows: Sequence[Mapping[str, Any]], metric: str) -> bool:
    """Whether any row names an attribution overlay of ``metric`` (:func:`map_column`)."""
    return any(cell_text(r.get(map_column(metric))).strip() for r in rows)


def extremes_tables(
    rows: Sequence[Mapping[str, Any]],
    opts: ReportOptions,
    figures: Callable[[Mapping[str, Any], str | None], list] | None = None,
    metrics: Sequence[str] = METRICS,
) -> list[ExtremesTable]:
    """Per score of ``metrics``, the best then the worst ``opts.top_k`` rows (:func:`extremes`).

    Args:
        rows: prepared rows (:func:`prepare_rows`).
        opts: ``top_k``, and the method and within columns (shown per row).
        figures: ``figures(row, metric)`` gives a row's images (``metric`` None when the file
            has no maps of that score); default: none.
        metrics: the metric columns with a table each (masc-report: the file's own).
    """
    cols = ident_columns(rows, opts)
    out = []
    for m in metrics:
        show_map = has_maps(rows, m)
        for best in (True, False):
            table = []
            for rank, r in enumerate(extremes(rows, m, opts.top_k, best), start=1):
                ident = [(c, cell_text(r.get(c))) for c in cols if cell_text(r.get(c))]
                prompt = cell_text(r.get("prompt")) or cell_text(r.get("prompt_text"))
                figs = figures(r, m if show_map else None) if figures else []
                table.append(ExtremeRow(rank, r, ident, prompt, figs))
            out.append(ExtremesTable(f"{'Best' if best else 'Worst'} {opts.top_k} by {m.upper()}", m, table))
    return out
