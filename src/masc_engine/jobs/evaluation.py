"""Meta-evaluation tables, shared by ``masc-eval`` and ``masc-report``: score rows joined with
human ratings, agreement rows (Krippendorff's alpha, Spearman's rho) and within- vs
cross-subject AUC rows.

The statistics are :mod:`masc_engine.metrics.agreement` (pure, arrays in); this module reads
the cells of the tables (the job layer's :func:`~masc_engine.jobs.tables.read_table` reads the
files) and decides which rows count:

- **Status**: masc-run writes one status per score (``cp_status``, ``pf_status``); with the
  default ``status_column="status"`` a file that has ``<score>_status`` is filtered on it, so a
  PF defined on a row whose CP is undefined still counts. Rows whose status is not one of
  ``ok_statuses`` are counted and skipped.
- **Missing scores**: with a status column, a row whose status is ok but whose score is empty is
  an error (the file contradicts itself); without one, an empty score is a missing value,
  counted and skipped (:func:`~masc_engine.jobs.tables.parse_number`: empty, ``nan``, ``NA``,
  ``null``...). masc-report passes no status column: every row with a defined score counts,
  which for a masc-run file are the rows whose ``<score>_status`` is ``ok``.
- **Groups**: methods (or ``group_column`` values) in order of first appearance, then the pooled
  row labelled :data:`POOLED` (``"pooled"``);
  :func:`~masc_engine.metrics.agreement.groups_in_order` is the one rule.

Every error about a row is a :class:`DataError` naming the source, the line (or row) and the
reason. Output tables are written by :func:`~masc_engine.jobs.tables.write_table` (NaN: ``nan``
in CSV / TSV, null in JSON).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MascEngineError
from ..metrics import agreement as ag
from ..metrics.agreement import POOLED, Joined
from .tables import Table, parse_bool, parse_number, read_table

__all__ = [
    "POOLED",
    "DataError",
    "SampleOptions",
    "AgreementOptions",
    "AucOptions",
    "AgreementTable",
    "AucTable",
    "WithinCross",
    "as_table",
    "score_status_column",
    "join_scores_ratings",
    "agreement_table",
    "within_cross_units",
    "auc_table",
    "evaluate_agreement",
    "evaluate_auc",
]

DEFAULT_LEVELS = ("interval", "ordinal")


class DataError(MascEngineError, ValueError):
    """Bad input rows: the message names the source, the row (or line) and the reason."""


def _strings(v: str | Sequence[str] | None) -> tuple[str, ...]:
    if v is None:
        return ()
    return (v,) if isinstance(v, str) else tuple(v)


@dataclass(frozen=True)
class SampleOptions:
    """The options every masc-eval table shares: which rows count and the bootstrap's settings.

    The base of :class:`AgreementOptions`, :class:`AucOptions` and
    :class:`~masc_engine.jobs.eval_tables.TableOptions` (all fields keyword-only in use).

    Attributes:
        status_column: only rows whose status is one of ``ok_statuses`` are used (see the module
            docstring for ``<score>_status``); None (or ``""``): no status filter.
        ok_statuses: status values whose rows are used (a string: one value).
        n_resamples: bootstrap resamples (>= 1).
        confidence: the interval's coverage, in (0, 1).
        seed: the bootstrap's seed (results are deterministic per seed); None: fresh entropy.
    """

    status_column: str | None = "status"
    ok_statuses: tuple[str, ...] = ("ok",)
    n_resamples: int = 1000
    confidence: float = 0.95
    seed: int | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "status_column", self.status_column or None)
        object.__setattr__(self, "ok_statuses", _strings(self.ok_statuses))


@dataclass(frozen=True)
class AgreementOptions(SampleOptions):
    """What :func:`agreement_table` joins and computes (masc-eval agreement's options).

    Attributes:
        score_column: metric column of the score file, e.g. ``"cp"`` or ``"pf"``.
        rating_columns: human rating columns, one per rater (group); empty: ``(score_column,)``.
        key: join column(s); a string may list several, comma-separated (``"method,key"`` when
            keys repeat across methods, as DreamBench++'s ``"{collection_id}-{prompt_index}"``).
        method_column: grouping column, read from the score row, else from the rating row;
            None (or ``""``, or absent from both files): the pooled row only.
        status_column: only rows whose status is one of ``ok_statuses`` are used (see the module
            docstring for ``<score>_status``); None (or ``""``): no status filter.
        ok_statuses: status values whose rows are used (masc-run's ``no_background`` rows carry
            a valid CP, so CP evaluations may add it).
        scale: allowed rating values (e.g. 0..4), also the categories the metric is mapped onto;
            None: the observed ratings. A rating off the scale is an error.
        levels: Krippendorff levels (:data:`~masc_engine.metrics.agreement.LEVELS`); empty:
            interval and ordinal.
        mapping: how the metric is put on the rating scale for alpha
            (:data:`~masc_engine.metrics.agreement.MAPPINGS`).
        human_agg: several raters: ``per_rater`` (mean of per-rater statistics) or ``joint``.
        n_resamples, confidence, seed: the percentile bootstrap over units.
    """

    score_column: str = "cp"
    rating_columns: tuple[str, ...] = ()
    key: str | tuple[str, ...] = "key"
    method_column: str | None = "method"
    scale: tuple[float, ...] | None = None
    levels: tuple[str, ...] = DEFAULT_LEVELS
    mapping: str = "quantile"
    human_agg: str = "per_rater"

    def __post_init__(self) -> None:
        super().__post_init__()
        norm = {
            "rating_columns": _strings(self.rating_columns),
            "key": self.key if isinstance(self.key, str) else tuple(self.key),
            "method_column": self.method_column or None,
            "scale": None if self.scale is None else tuple(float(v) for v in self.scale),
            "levels": _strings(self.levels) or DEFAULT_LEVELS,
        }
        for k, v in norm.items():
            object.__setattr__(self, k, v)

    @property
    def raters(self) -> tuple[str, ...]:
        """The rating columns actually read."""
        return self.rating_columns or (self.score_column,)


@dataclass(frozen=True)
class AucOptions(SampleOptions):
    """What :func:`auc_table` reads and computes (masc-eval auc's options; masc-report's
    within- vs cross-subject section).

    Attributes:
        score_column: the score, e.g. ``"cp"``; higher should mean "same subject".
        within_column: the column telling within-subject pairs from cross-subject ones.
        within_value: rows whose ``within_column`` equals this (as stripped text) are
            within-subject, all others cross-subject; None: the column is read as a boolean
            (true/false, 1/0, yes/no, within/cross, same/different).
        group_column: optional column for per-group rows (e.g. an environment).
        status_column, ok_statuses: as in :class:`AgreementOptions`.
        n_resamples, confidence, seed: the stratified percentile bootstrap.
    """

    score_column: str = "cp"
    within_column: str = "within"
    within_value: str | None = None
    group_column: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "group_column", self.group_column or None)


# --------------------------------------------------------------------------
# Rows and where they came from
# --------------------------------------------------------------------------


def as_table(data: Any, name: str) -> Table:
    """A :class:`~masc_engine.jobs.tables.Table` as it is, or rows (a list of dicts, a pyarrow
    Table or a pandas DataFrame) as a table named ``name`` whose errors say "row i" (1-based)."""
    if isinstance(data, Table):
        return data
    if hasattr(data, "to_pylist"):
        rows = list(data.to_pylist())
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):
        rows = list(data.to_dict(orient="records"))
    else:
        rows = list(data)
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    return Table(Path(name), list(columns), rows, None)


def _at(t: Table, i: int) -> str:
    """``"line N"`` or ``"row N"`` of row ``i`` (0-based)."""
    return f"line {t.lines[i]}" if t.lines is not None else f"row {i + 1}"


def _where(t: Table, i: int) -> str:
    return f"{t.path}, {_at(t, i)}"


def _columns(row: Mapping[str, Any]) -> str:
    return ", ".join(map(str, row.keys()))


def score_status_column(columns: Sequence[str], score_column: str, status_column: str | None) -> str | None:
    """The status column a score is filtered on: masc-run's ``<score>_status`` when
    ``status_column`` is the default ``"status"`` and the file has it, else ``status_column``."""
    own = f"{score_column}_status"
    if status_column == "status" and own in columns:
        return own
    return status_column or None


def _status(row: Mapping[str, Any], status_column: str | None) -> str | None:
    """The row's status as stripped text; None when there is no status to go by."""
    if not status_column or status_column not in row:
        return None
    return str(row[status_column]).strip()


def _score(row: Mapping[str, Any], column: str, where: str, status: str | None, key: str = "") -> float | None:
    """The row's score, or None when missing (allowed only without a status to contradict).

    Raises:
        DataError: no such column, not a number, or an ok status with an empty score.
    """
    if column not in row:
        raise DataError(f"{where}: no score column {column!r} (columns: {_columns(row)})")
    try:
        v = parse_number(row[column])
    except ValueError:
        raise DataError(f"{where}{key}: score column {column!r} value {row[column]!r} is not a number") from None
    if v is None and status is not None:
        raise DataError(f"{where}{key}: status is {status!r} but score column {column!r} is empty")
    return v


# --------------------------------------------------------------------------
# Scores x ratings
# --------------------------------------------------------------------------


def _key_cols(key: str | Sequence[str]) -> tuple[str, ...]:
    cols = tuple(c.strip() for c in key.split(",")) if isinstance(key, str) else tuple(key)
    if not cols or any(not c for c in cols):
        raise ValueError(f"key must name at least one column, got {key!r}")
    return cols


def _key_of(row: Mapping[str, Any], key_cols: Sequence[str], where: str) -> tuple[str, ...]:
    out = []
    for k in key_cols:
        if k not in row:
            raise DataError(f"{where}: no key column {k!r} (columns: {_columns(row)})")
        v = row[k]
        if v is None or str(v).strip() == "":
            raise DataError(f"{where}: empty key column {k!r}")
        out.append(str(v).strip())
    return tuple(out)


def _fmt_key(k: tuple[str, ...], cols: Sequence[str]) -> str:
    if len(k) == 1:
        return repr(k[0])
    return ", ".join(f"{c}={v!r}" for c, v in zip(cols, k))


def _keyed(t: Table, key_cols: Sequence[str]):
    """``(i, where, key, row)`` per row; a key seen before is an error naming both rows."""
    seen: dict[tuple[str, ...], int] = {}
    for i, row in enumerate(t.rows):
        where = _where(t, i)
        k = _key_of(row, key_cols, where)
        if k in seen:
            raise DataError(f"{where}: duplicate key {_fmt_key(k, key_cols)} (first at {_at(t, seen[k])})")
        seen[k] = i
        yield i, where, k, row


@dataclass(frozen=True)
class _Rated:
    ratings: list[float]  # one per rating column, NaN = not rated
    method: str | None


def _read_ratings(t: Table, key_cols: Sequence[str], opts: AgreementOptions) -> dict[tuple[str, ...], _Rated]:
    """key -> the row's ratings (NaN = not rated) and method label."""
    scale = None if opts.scale is None else set(opts.scale)
    rated = {}
    for _, where, k, row in _keyed(t, key_cols):
        at = f"{where} (key {_fmt_key(k, key_cols)})"
        vals = []
        for col in opts.raters:
            if col not in row:
                raise DataError(f"{where}: no rating column {col!r} (columns: {_columns(row)})")
            try:
                v = parse_number(row[col])
            except ValueError:
                raise DataError(f"{at}: rating column {col!r} value {row[col]!r} is not a number") from None
            if v is not None and scale is not None and v not in scale:
                raise DataError(f"{at}: rating {v:g} in column {col!r} is not on the scale {sorted(scale)}")
            vals.append(float("nan") if v is None else v)
        meth = row.get(opts.method_column) if opts.method_column else None
        rated[k] = _Rated(vals, None if meth is None else str(meth))
    return rated


@dataclass
class _Units:
    keys: list[tuple[str, ...]] = field(default_factory=list)
    methods: list[str | None] = field(default_factory=list)
    metric: list[float] = field(default_factory=list)
    human: list[list[float]] = field(default_factory=list)


def join_scores_ratings(scores: Any, ratings: Any, options: AgreementOptions = AgreementOptions()) -> Joined:
    """Inner-join a masc-run score table with a human rating table on the key.

    Args:
        scores: a :class:`~masc_engine.jobs.tables.Table` (errors then name its file and lines)
            or rows (list of mappings, pyarrow Table, pandas DataFrame; errors say "scores, row
            i"): the key column(s), ``options.score_column`` and, if present, the status column.
            Values may be strings (CSV) or numbers.
        ratings: the same types, named "ratings": one row per unit, the key column(s) and one
            column per rater (``options.raters``); empty / NaN / null = not rated.
        options: see :class:`AgreementOptions` (the bootstrap fields are not used here).

    Returns:
        a :class:`~masc_engine.metrics.agreement.Joined`: units in score-file order; the
        ``counts`` say what was skipped (``not_ok``, ``missing_score``, ``unrated``,
        ``unscored``).

    Raises:
        DataError: missing key / score / rating column, empty or duplicate key, a non-numeric
            score on a used row, an ok status with an empty score, a non-numeric or off-scale
            rating. The message names the source, the row and the reason.
        ValueError: an empty key specification.
    """
    st, rt = as_table(scores, "scores"), as_table(ratings, "ratings")
    key_cols = _key_cols(options.key)
    rated = _read_ratings(rt, key_cols, options)
    status_column = score_status_column(st.columns, options.score_column, options.status_column)
    counts = {"score_rows": len(st.rows), "not_ok": 0, "missing_score": 0, "rating_rows": len(rt.rows), "unrated": 0}
    units = _Units()
    for _, where, k, row in _keyed(st, key_cols):
        status = _status(row, status_column)
        if status is not None and status not in options.ok_statuses:
            counts["not_ok"] += 1
            continue
        v = _score(row, options.score_column, where, status, f" (key {_fmt_key(k, key_cols)})")
        hit = rated.get(k)
        if v is None or hit is None or all(math.isnan(x) for x in hit.ratings):
            counts["missing_score" if v is None else "unrated"] += 1
            continue
        meth = row.get(options.method_column) if options.method_column and options.method_column in row else hit.method
        units.keys.append(k)
        units.methods.append(None if meth is None or str(meth).strip() == "" else str(meth))
        units.metric.append(v)
        units.human.append(hit.ratings)
    matched = set(units.keys)
    counts["unscored"] = sum(1 for k in rated if k not in matched)
    counts["units"] = len(units.keys)
    h = np.asarray(units.human, dtype=np.float64).T if units.human else np.empty((len(options.raters), 0))
    return Joined(units.keys, units.methods, np.asarray(units.metric, dtype=np.float64), h, options.raters, counts)


@dataclass(frozen=True)
class AgreementTable:
    """What :func:`agreement_table` computed.

    Attributes:
        rows: the per-method then pooled rows of
            :func:`~masc_engine.metrics.agreement.agreement_rows` (NaN = undefined).
        joined: the joined units (``counts``, ``rating_columns``, ``methods``).
        options: the options used.
    """

    rows: list[dict[str, Any]]
    joined: Joined
    options: AgreementOptions


def agreement_table(scores: Any, ratings: Any, options: AgreementOptions = AgreementOptions()) -> AgreementTable:
    """:func:`join_scores_ratings`, then
    :func:`~masc_engine.metrics.agreement.agreement_rows` on the joined units (``scale``
    doubles as the rating categories; default: the observed ratings).

    Raises:
        DataError: as :func:`join_scores_ratings`, or no unit joined (the counts say why).
        ValueError: unknown level / mapping / human_agg.
    """
    joined = join_scores_ratings(scores, ratings, options)
    c = joined.counts
    if c["units"] == 0:
        raise DataError(
            f"no units to evaluate: {c['score_rows']} score rows ({c['not_ok']} not ok, {c['missing_score']} without "
            f"a score, {c['unrated']} without a rating), {c['rating_rows']} rating rows ({c['unscored']} without a "
            f"score). Check the key ({options.key}) and the file contents."
        )
    rows = ag.agreement_rows(
        joined,
        levels=options.levels,
        mapping=options.mapping,
        categories=options.scale,
        human_agg=options.human_agg,
        n_resamples=options.n_resamples,
        confidence=options.confidence,
        seed=options.seed,
    )
    return AgreementTable(rows, joined, options)


def evaluate_agreement(
    scores_path: str | Path, ratings_path: str | Path, options: AgreementOptions = AgreementOptions()
) -> AgreementTable:
    """:func:`agreement_table` on two files (CSV / TSV / JSON Lines / JSON array / Parquet).

    Raises:
        TableError: a file is missing or unparsable (file and line named).
        DataError, ValueError: as :func:`agreement_table`.
    """
    return agreement_table(read_table(scores_path, what="scores"), read_table(ratings_path, what="ratings"), options)


# --------------------------------------------------------------------------
# Within- vs cross-subject AUC
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WithinCross:
    """The units of a within- vs cross-subject AUC, read by :func:`within_cross_units`.

    Attributes:
        scores: float64 ``(n,)``, the used rows' scores (no NaN).
        within: bool ``(n,)``, True for a within-subject pair.
        groups: the ``group_column`` label per unit (None: unlabelled), or None without one.
        skipped: rows left out by status.
        missing: rows left out for an empty score (no status column to go by).
    """

    scores: np.ndarray
    within: np.ndarray
    groups: list[str | None] | None
    skipped: int
    missing: int


def _within(row: Mapping[str, Any], opts: AucOptions, where: str) -> bool:
    v = row.get(opts.within_column)
    if opts.within_value is not None:
        return ("" if v is None else str(v)).strip() == str(opts.within_value).strip()
    try:
        return parse_bool(v)
    except ValueError as exc:
        raise DataError(f"{where}: column {opts.within_column!r}: {exc}") from None


def _check_columns(t: Table, names: Sequence[str]) -> None:
    """A column no row has is a header problem, not a row's: named once, up front."""
    for col in names:
        if t.rows and col not in t.columns:
            raise DataError(f"{t.path}: no column {col!r} (columns: {', '.join(map(str, t.columns))})")


def within_cross_units(scores: Any, options: AucOptions) -> WithinCross:
    """The scored rows of a table as AUC units: status filter, score, within flag, group.

    Raises:
        DataError: the score or within column is absent; on a used row, a non-numeric score,
            an ok status with an empty score, or (boolean reading) a within cell that is not a
            boolean. The message names the source, the row and the reason.
    """
    t = as_table(scores, "scores")
    _check_columns(t, (options.score_column, options.within_column))
    status_column = score_status_column(t.columns, options.score_column, options.status_column)
    vals: list[float] = []
    within: list[bool] = []
    groups: list[str | None] = []
    skipped = missing = 0
    for i, row in enumerate(t.rows):
        status = _status(row, status_column)
        if status is not None and status not in options.ok_statuses:
            skipped += 1
            continue
        where = _where(t, i)
        if options.within_column not in row:
            raise DataError(f"{where}: no column {options.within_column!r} (columns: {_columns(row)})")
        v = _score(row, options.score_column, where, status)
        if v is None:
            missing += 1
            continue
        within.append(_within(row, options, where))
        vals.append(v)
        g = row.get(options.group_column) if options.group_column else None
        groups.append(None if g is None or str(g).strip() == "" else str(g))
    return WithinCross(
        np.asarray(vals, dtype=np.float64),
        np.asarray(within, dtype=bool),
        groups if options.group_column else None,
        skipped,
        missing,
    )


@dataclass(frozen=True)
class AucTable:
    """What :func:`auc_table` computed: the per-group then pooled rows of
    :func:`~masc_engine.metrics.agreement.auc_rows` (``scope``, ``group``, ``n``, ``n_within``,
    ``n_cross``, ``auc``, ``auc_low``, ``auc_high``, ``note``), the units, the options."""

    rows: list[dict[str, Any]]
    units: WithinCross
    options: AucOptions

    @property
    def pooled(self) -> dict[str, Any]:
        """The pooled row (the last)."""
        return self.rows[-1]


def auc_table(scores: Any, options: AucOptions) -> AucTable:
    """ROC AUC of a score for within- vs cross-subject pairs (the ORIDa protocol), per group
    and pooled, each with a percentile bootstrap stratified by class.

    Args:
        scores: a :class:`~masc_engine.jobs.tables.Table` or rows (see :func:`as_table`).
        options: see :class:`AucOptions`.

    Raises:
        DataError: as :func:`within_cross_units`.
        ValueError: bad bootstrap settings.
    """
    units = within_cross_units(scores, options)
    rows = ag.auc_rows(
        units.scores,
        units.within,
        units.groups,
        n_resamples=options.n_resamples,
        confidence=options.confidence,
        seed=options.seed,
    )
    return AucTable(rows, units, options)


def evaluate_auc(scores_path: str | Path, options: AucOptions) -> AucTable:
    """:func:`auc_table` on a score file.

    Raises:
        TableError: the file is missing or unparsable (file and line named).
        DataError, ValueError: as :func:`auc_table`.
    """
    return auc_table(read_table(scores_path, what="scores"), options)
