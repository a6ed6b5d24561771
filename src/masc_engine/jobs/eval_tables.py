"""The paper's tables from a masc-run score file, for every metric column: per-method (or
per-subject) means with bootstrap CIs, the paired method-vs-method difference, and the agreement
and AUC tables of :mod:`masc_engine.jobs.evaluation` run over several metric columns.

Which columns: :func:`metric_columns`, the value columns of the registered pair metrics
(runtime/pair_metrics: ``cp``, ``pf``, the ``--baselines`` columns, ``clip_i``, ``clip_t``,
``dino``, ``dino_s8``, ``dinov2`` and any plug-in's) that the file has, in registration order.

Which rows count: the rule of :mod:`masc_engine.jobs.evaluation`, per column: a column with its
own ``<column>_status`` is filtered on it, any other on the ``status_column``; a row that is not
ok is missing for that column only (a row without masks still counts for ``clip_i``).

Units: each row is a unit, or, with ``average_references``, the rows sharing the method and
the ``key`` columns (default ``subject, prompt``: one generated image scored against several
reference photos of its subject) are averaged into one unit, each column over its defined values
(:func:`masc_engine.metrics.score_tables.average_over`). The statistics are
:mod:`masc_engine.metrics.score_tables` (one bootstrap: :mod:`masc_engine.metrics.agreement`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..metrics import agreement as ag
from ..metrics.score_tables import mean_ci, paired_mean_diff, average_over
from ..runtime.pair_metrics import registered
from ..runtime.pair_metrics.classic import clip_score_tm_aggregate
from . import evaluation as ev
from .evaluation import DataError, _score, _status, as_table, score_status_column
from .results import SidecarError, read_meta
from .tables import Table

__all__ = [
    "TORCHMETRICS_AGGREGATES",
    "TableOptions",
    "ScoreUnits",
    "MeansTable",
    "CompareTable",
    "metric_columns",
    "score_units",
    "means_table",
    "compare_table",
    "agreement_tables",
    "auc_tables",
    "random_weights",
    "random_weights_line",
    "scores_sidecar",
]


#: Metric columns whose reference reports another number than the mean of the rows, and how it is
#: computed from a group's values: torchmetrics' ``CLIPScore`` is ``max(mean, 0)`` (the clamp is
#: on the mean, never per row; runtime/pair_metrics/classic.py ``clip_score_tm_aggregate``).
#: :func:`means_table` adds it to each group as ``<metric>_torchmetrics`` beside the plain mean.
TORCHMETRICS_AGGREGATES = {"clip_score_tm": clip_score_tm_aggregate}


def metric_columns(columns: Sequence[str], requested: Sequence[str] = (), source: str = "scores") -> tuple[str, ...]:
    """The metric columns a table covers.

    Args:
        columns: the score file's columns.
        requested: columns asked for by name (any column, registered or not), or empty / ``("all",)``
            for every registered metric's value columns that ``columns`` has, in registration order.
        source: the file, named in errors.

    Returns:
        the column names, in order, without repeats.

    Raises:
        DataError: a requested column is not in the file, or the file has no metric column.
    """
    cols = list(columns)
    if requested and tuple(requested) != ("all",):
        missing = [c for c in requested if c not in cols]
        if missing:
            raise DataError(
                f"{source}: no metric column {', '.join(map(repr, missing))} (columns: {', '.join(map(str, cols))})"
            )
        return tuple(dict.fromkeys(requested))
    found = tuple(c for m in registered() for c in m.columns if c in cols)
    if not found:
        raise DataError(
            f"{source}: no registered metric column (columns: {', '.join(map(str, cols))}); "
            "name the columns with --metrics"
        )
    return found


@dataclass(frozen=True)
class TableOptions(ev.SampleOptions):
    """What :func:`score_units` reads and the tables compute (masc-eval table / compare options).

    Attributes:
        metrics: the metric columns (:func:`metric_columns`; empty: every registered one the file has).
        method_column: the method of each row; None (or absent): the pooled row only.
        subject_column: the subject of each row (the per-subject breakdown, the default key).
        key: the columns naming a unit within a method (comma-separated text or a tuple): what
            ``average_references`` averages over and what :func:`compare_table` pairs on.
        average_references: average the rows sharing the method and the ``key`` into one unit.
        status_column, ok_statuses: as :class:`~masc_engine.jobs.evaluation.AgreementOptions`.
        n_resamples, confidence, seed: the percentile bootstrap over units.
    """

    metrics: tuple[str, ...] = ()
    method_column: str | None = "method"
    subject_column: str | None = "subject"
    key: str | tuple[str, ...] = ("subject", "prompt")
    average_references: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        key = tuple(c.strip() for c in self.key.split(",")) if isinstance(self.key, str) else tuple(self.key)
        if not key or any(not c for c in key):
            raise ValueError(f"key must name at least one column, got {self.key!r}")
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "metrics", ev._strings(self.metrics))
        for name in ("method_column", "subject_column"):
            object.__setattr__(self, name, getattr(self, name) or None)


@dataclass(frozen=True)
class ScoreUnits:
    """The units of a score file, read by :func:`score_units`.

    Attributes:
        metrics: the metric columns, in order.
        values: float64 ``(units, metrics)``, NaN = missing (not ok, empty, or no defined row in
            an averaged unit).
        methods, subjects: the label of each unit (None: unlabelled; None for the list when the
            file has no such column).
        keys: each unit's ``key`` values (None when the file lacks a key column).
        rows_per_unit: int64 ``(units,)``: the rows averaged into each unit (1 without averaging).
        skipped: per metric, the rows left out by status; ``missing`` those with no score.
        source: the file (or ``"scores"``), named in messages.
        options: the options used.
    """

    metrics: tuple[str, ...]
    values: np.ndarray
    methods: list[str | None] | None
    subjects: list[str | None] | None
    keys: list[tuple[str, ...]] | None
    rows_per_unit: np.ndarray
    skipped: dict[str, int] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    source: str = "scores"
    options: TableOptions = TableOptions()


def _label(row: Mapping[str, Any], column: str | None) -> str | None:
    v = row.get(column) if column else None
    if v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == "":
        return None
    return str(v).strip()


def _metric_value(
    t: Table, i: int, column: str, status_column: str | None, opts: TableOptions, counts: tuple[dict, dict]
) -> float:
    row = t.rows[i]
    status = _status(row, status_column)
    if status is not None and status not in opts.ok_statuses:
        counts[0][column] += 1
        return float("nan")
    v = _score(row, column, t.where(i) if t.lines is not None else f"{t.path}, row {i + 1}", status)
    if v is None:
        counts[1][column] += 1
        return float("nan")
    return v


def _key(row: Mapping[str, Any], cols: Sequence[str], where: str) -> tuple[str, ...]:
    out = []
    for c in cols:
        v = _label(row, c)
        if v is None:
            raise DataError(f"{where}: empty key column {c!r} (--key {','.join(cols)})")
        out.append(v)
    return tuple(out)


def score_units(scores: Any, options: TableOptions = TableOptions()) -> ScoreUnits:
    """The metric values of a score table as units (module docstring: which rows count, averaging).

    Args:
        scores: a :class:`~masc_engine.jobs.tables.Table` or rows (a list of dicts, a pyarrow
            Table, a pandas DataFrame; :func:`~masc_engine.jobs.evaluation.as_table`).
        options: see :class:`TableOptions`.

    Raises:
        DataError: no metric column, a requested column absent, a non-numeric score, an ok
            status with an empty score, or (averaging) a key column absent or empty on a row.
    """
    t = as_table(scores, "scores")
    metrics = metric_columns(t.columns, options.metrics, str(t.path))
    has_key = all(c in t.columns for c in options.key)
    if options.average_references and not has_key:
        raise DataError(
            f"{t.path}: --average-references needs the key column(s) "
            f"{', '.join(c for c in options.key if c not in t.columns)} (--key; columns: "
            f"{', '.join(map(str, t.columns))})"
        )
    counts: tuple[dict, dict] = ({m: 0 for m in metrics}, {m: 0 for m in metrics})
    status_cols = {m: score_status_column(t.columns, m, options.status_column) for m in metrics}
    vals = np.asarray(
        [[_metric_value(t, i, m, status_cols[m], options, counts) for m in metrics] for i in range(len(t.rows))],
        dtype=np.float64,
    ).reshape(len(t.rows), len(metrics))
    methods = [_label(r, options.method_column) for r in t.rows] if options.method_column in t.columns else None
    subjects = [_label(r, options.subject_column) for r in t.rows] if options.subject_column in t.columns else None
    keys = [_key(r, options.key, t.where(i)) for i, r in enumerate(t.rows)] if has_key else None
    per_unit = np.ones(len(t.rows), dtype=np.int64)
    if options.average_references:
        assert keys is not None  # averaging needs the key columns: refused above without them
        ids = [((methods or [None] * len(t.rows))[i], keys[i]) for i in range(len(t.rows))]
        first: dict[tuple[str | None, tuple[str, ...]], int] = {}
        for i, k in enumerate(ids):
            first.setdefault(k, i)
        _, vals, per_unit = average_over(ids, vals)
        rows = list(first.values())
        methods = None if methods is None else [methods[i] for i in rows]
        subjects = None if subjects is None else [subjects[i] for i in rows]
        keys = [keys[i] for i in rows]
    return ScoreUnits(metrics, vals, methods, subjects, keys, per_unit, counts[0], counts[1], str(t.path), options)


# --------------------------------------------------------------------------
# Means
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MeansTable:
    """Per-group means of every metric column (:func:`means_table`).

    Attributes:
        rows: one dict per group: ``scope`` (``method``, ``subject`` or ``pooled``), ``subject``
            (per-subject rows), ``method``, ``n`` (units), then per metric ``m``: ``m_n``, ``m``
            (the mean), ``m_low``, ``m_high`` (NaN: no interval) and ``m_note``; for ``clip_score_tm``
            also ``clip_score_tm_torchmetrics`` (torchmetrics' ``max(mean, 0)``).
        units: the units.
        by_subject: whether the rows are per subject and method.
    """

    rows: list[dict[str, Any]]
    units: ScoreUnits
    by_subject: bool = False


def _groups(u: ScoreUnits, by_subject: bool) -> list[tuple[str, str | None, str, np.ndarray]]:
    n = u.values.shape[0]
    if not by_subject:
        return [(scope, None, name, idx) for scope, name, idx in ag.groups_in_order(u.methods, n, "method")]
    if u.subjects is None:
        raise DataError(
            f"{u.source}: the per-subject breakdown needs a subject column "
            f"({u.options.subject_column!r}; --subject-column)"
        )
    order: dict[tuple[str, str], list[int]] = {}
    for i, s in enumerate(u.subjects):
        if s is not None:
            m = (u.methods[i] if u.methods is not None else None) or ag.POOLED
            order.setdefault((s, m), []).append(i)
    by_subj: dict[str, list[tuple[str, list[int]]]] = {}
    for (s, m), idx in order.items():
        by_subj.setdefault(s, []).append((m, idx))
    return [("subject", s, m, np.asarray(idx, dtype=np.int64)) for s, parts in by_subj.items() for m, idx in parts]


def means_table(units: ScoreUnits, by_subject: bool = False) -> MeansTable:
    """Per-method means (methods in order of first appearance, then the pooled row), or with
    ``by_subject`` per subject and method, of every metric column, each with its percentile
    bootstrap CI over the group's units (:func:`~masc_engine.metrics.score_tables.mean_ci`; a
    group with one unit has no CI and says so).

    Raises:
        DataError: ``by_subject`` without a subject column.
    """
    o = units.options
    rows = []
    for scope, subject, name, idx in _groups(units, by_subject):
        d: dict[str, Any] = {"scope": scope, "subject": subject, "method": name, "n": int(idx.size)}
        for j, m in enumerate(units.metrics):
            ci = mean_ci(units.values[idx, j], n_resamples=o.n_resamples, confidence=o.confidence, seed=o.seed)
            d.update(
                {f"{m}_n": ci.n, m: ci.value, f"{m}_low": ci.low, f"{m}_high": ci.high, f"{m}_note": ci.note or ""}
            )
            if m in TORCHMETRICS_AGGREGATES:
                d[f"{m}_torchmetrics"] = TORCHMETRICS_AGGREGATES[m](units.values[idx, j])
        rows.append(d)
    return MeansTable(rows, units, by_subject)


# --------------------------------------------------------------------------
# Paired comparison
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CompareTable:
    """Method ``a`` minus method ``b``, per metric, on paired units (:func:`compare_table`).

    Attributes:
        rows: per metric: ``metric``, ``n`` (complete pairs), ``mean_a``, ``mean_b``, ``diff``
            (``mean_a - mean_b`` over those pairs), ``diff_low``, ``diff_high``, ``note``.
        a, b: the methods.
        n_pairs: the units paired on the key.
        units: the units.
    """

    rows: list[dict[str, Any]]
    a: str
    b: str
    n_pairs: int
    units: ScoreUnits


def _pick_methods(u: ScoreUnits, a: str | None, b: str | None) -> tuple[str, str]:
    if u.methods is None:
        col = u.options.method_column
        raise DataError(
            f"{u.source}: "
            + (f"no method column {col!r}" if col else "no method column given")
            + "; a comparison needs one (--method-column)"
        )
    present = list(dict.fromkeys(m for m in u.methods if m is not None))
    if a is None and b is None and len(present) == 2:
        return present[0], present[1]
    if a is None or b is None or a not in present or b not in present:
        raise DataError(
            f"{u.source}: name two methods to compare (--a, --b), got {a!r} and {b!r}; methods: {', '.join(present)}"
        )
    if a == b:
        raise DataError(f"{u.source}: --a and --b are both {a!r}")
    return a, b


def _index(u: ScoreUnits, method: str) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for i, (m, k) in enumerate(zip(u.methods or [], u.keys or [])):  # both present: checked by the caller
        if m != method:
            continue
        if k in out:
            raise DataError(
                f"{u.source}: rows do not pair: {method!r} has key ({', '.join(k)}) more than once on "
                f"({', '.join(u.options.key)}); add a column to --key, or --average-references"
            )
        out[k] = i
    return out


def compare_table(units: ScoreUnits, a: str | None = None, b: str | None = None) -> CompareTable:
    """Paired bootstrap of ``mean(a) - mean(b)`` per metric, units paired on the ``key`` columns
    (:func:`~masc_engine.metrics.score_tables.paired_mean_diff`; the same resample indices for
    both sides).

    Args:
        units: from :func:`score_units` (with ``average_references`` when a method has several
            rows per key).
        a: the first method (the minuend); with ``b`` None: the file's first method.
        b: the second method; both None: the file's two methods, in order of appearance.

    Raises:
        DataError: no method or key column, unknown methods, a key repeated within a method, or
            keys present for one method only (the rows do not pair): one line, the first
            unpaired key named.
    """
    o = units.options
    if units.keys is None:
        raise DataError(f"{units.source}: pairing needs the key column(s) {', '.join(o.key)} (--key)")
    a, b = _pick_methods(units, a, b)
    ia, ib = _index(units, a), _index(units, b)
    only = [(m, k) for m, side, other in ((a, ia, ib), (b, ib, ia)) for k in side if k not in other]
    if only:
        m, k = only[0]
        raise DataError(
            f"{units.source}: rows do not pair on ({', '.join(o.key)}): {len(only)} key(s) have one "
            f"method only, first ({', '.join(k)}) of {m!r}; compare on keys both methods scored"
        )
    keys = list(ia)
    xa, xb = units.values[[ia[k] for k in keys]], units.values[[ib[k] for k in keys]]
    rows = []
    for j, m in enumerate(units.metrics):
        ok = ~(np.isnan(xa[:, j]) | np.isnan(xb[:, j]))
        ci = paired_mean_diff(xa[:, j], xb[:, j], n_resamples=o.n_resamples, confidence=o.confidence, seed=o.seed)
        mean_a = float(xa[ok, j].mean()) if ok.any() else float("nan")
        mean_b = float(xb[ok, j].mean()) if ok.any() else float("nan")
        rows.append(
            {
                "metric": m,
                "n": int(ok.sum()),
                "mean_a": mean_a,
                "mean_b": mean_b,
                "diff": ci.value,
                "diff_low": ci.low,
                "diff_high": ci.high,
                "note": ci.note or "",
            }
        )
    return CompareTable(rows, a, b, len(keys), units)


# --------------------------------------------------------------------------
# Agreement and AUC over several metric columns
# --------------------------------------------------------------------------


def agreement_tables(
    scores: Any, ratings: Any, options: ev.AgreementOptions, metrics: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The agreement rows of every metric column (DreamBench++'s table: one block per metric):
    :func:`~masc_engine.jobs.evaluation.agreement_table` per column with ``score_column``
    replaced, each row led by ``metric``. A column no unit joins gets one pooled row with ``n``
    0, NaN statistics and a note (the other columns still count).

    Raises:
        DataError, ValueError: as :func:`~masc_engine.jobs.evaluation.agreement_table`.
    """
    st, rt = as_table(scores, "scores"), as_table(ratings, "ratings")
    out = []
    for m in metric_columns(st.columns, metrics, str(st.path)):
        o = replace(options, score_column=m)
        joined = ev.join_scores_ratings(st, rt, o)
        if joined.counts["units"] == 0:
            stats = {f"alpha_{lv}{s}": float("nan") for lv in o.levels for s in ("", "_low", "_high")}
            stats.update({f"spearman{s}": float("nan") for s in ("", "_low", "_high")})
            out.append(
                {
                    "metric": m,
                    "scope": "pooled",
                    "method": ag.POOLED,
                    "n": 0,
                    **stats,
                    "note": "no unit joined (no ok score with a rating)",
                }
            )
            continue
        rows = ag.agreement_rows(
            joined,
            levels=o.levels,
            mapping=o.mapping,
            categories=o.scale,
            human_agg=o.human_agg,
            n_resamples=o.n_resamples,
            confidence=o.confidence,
            seed=o.seed,
        )
        out += [{"metric": m, **r} for r in rows]
    return out


def auc_tables(scores: Any, options: ev.AucOptions, metrics: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The within- vs cross-subject AUC rows of every metric column (per ``group_column`` value,
    e.g. the method, then pooled): :func:`~masc_engine.jobs.evaluation.auc_table` per column, each
    row led by ``metric``.

    Raises:
        DataError, ValueError: as :func:`~masc_engine.jobs.evaluation.auc_table`.
    """
    t = as_table(scores, "scores")
    return [
        {"metric": m, **r}
        for m in metric_columns(t.columns, metrics, str(t.path))
        for r in ev.auc_table(t, replace(options, score_column=m)).rows
    ]


# --------------------------------------------------------------------------
# The sidecar's random-weights note
# --------------------------------------------------------------------------


def scores_sidecar(path: str | Path) -> dict | None:
    """The masc-run sidecar ``<scores>.meta.json`` of a score file, or None (absent, unreadable,
    a link or not a regular file: :func:`~masc_engine.jobs.results.read_meta`)."""
    try:
        return read_meta(path)
    except SidecarError:
        return None


def random_weights(meta: Mapping[str, Any] | None) -> bool:
    """Whether the sidecar says the scores came from a random-weight bundle: ``source_model``
    (the bundle manifest's ``source``, as masc-run records it) has ``random_weights`` true, or
    names a ``random:`` preset model."""
    src = (meta or {}).get("source_model")
    if isinstance(src, Mapping):
        model = src.get("model")
        return bool(src.get("random_weights")) or (isinstance(model, str) and model.startswith("random:"))
    return isinstance(src, str) and src.startswith("random:")


def random_weights_line(meta: Mapping[str, Any] | None) -> str | None:
    """The line every command prints for a random-weight bundle
    (:func:`masc_engine.engine.bundle.random_weights_note`), for the bundle the sidecar records;
    None when :func:`random_weights` is false."""
    from ..engine.bundle import random_weights_note

    if meta is None or not random_weights(meta):
        return None
    src = meta.get("source_model")
    source = dict(src) if isinstance(src, Mapping) else {"model": src}
    return random_weights_note(str(meta.get("bundle") or "(unnamed)"), {"source": {**source, "random_weights": True}})
