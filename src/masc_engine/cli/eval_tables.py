"""masc-eval's tables: joining a score file with a ratings file on a key, and the command's
table entry point (:func:`agreement_table`). The statistics are :mod:`masc_engine.metrics.agreement`;
the files are read by the job layer's :func:`~masc_engine.jobs.tables.read_table`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..jobs.tables import parse_number as _parse_number
from ..metrics.agreement import Joined, agreement_rows


class DataError(ValueError):
    """Bad input rows: the message names the source, the row and the reason."""


def _as_rows(table: Any) -> list[Mapping[str, Any]]:
    """Accept a list of dicts, a pyarrow Table or a pandas DataFrame."""
    if hasattr(table, "to_pylist"):
        return list(table.to_pylist())
    if hasattr(table, "to_dict") and hasattr(table, "columns"):
        return list(table.to_dict(orient="records"))
    return list(table)


def _where(name: str, lines: Sequence[int] | None, i: int) -> str:
    line = lines[i] if lines is not None else i + 1
    label = "line" if lines is not None else "row"
    return f"{name}, {label} {line}"


def _key_of(row: Mapping[str, Any], key_cols: Sequence[str], where: str) -> tuple[str, ...]:
    out = []
    for k in key_cols:
        if k not in row:
            raise DataError(f"{where}: no key column {k!r} (columns: {', '.join(map(str, row.keys()))})")
        v = row[k]
        if v is None or str(v).strip() == "":
            raise DataError(f"{where}: empty key column {k!r}")
        out.append(str(v).strip())
    return tuple(out)


def _fmt_key(k: tuple[str, ...], cols: Sequence[str]) -> str:
    if len(k) == 1:
        return repr(k[0])
    return ", ".join(f"{c}={v!r}" for c, v in zip(cols, k))


def _key_cols(key: str | Sequence[str]) -> tuple[str, ...]:
    cols = tuple(c.strip() for c in key.split(",")) if isinstance(key, str) else tuple(key)
    if not cols or any(not c for c in cols):
        raise ValueError(f"key must name at least one column, got {key!r}")
    return cols


def join_scores_ratings(
    scores: Any,
    ratings: Any,
    *,
    score_column: str = "cp",
    rating_columns: Sequence[str] | None = None,
    key: str | Sequence[str] = "key",
    method_column: str | None = "method",
    status_column: str | None = "status",
    ok_status: str | Sequence[str] = "ok",
    scale: Sequence[float] | None = None,
    scores_name: str = "scores",
    ratings_name: str = "ratings",
    scores_lines: Sequence[int] | None = None,
    ratings_lines: Sequence[int] | None = None,
) -> Joined:
    """Inner-join a masc-run score table with a human rating table.

    Args:
        scores (list of mapping, pyarrow.Table or pandas.DataFrame): Rows of a ``masc-run`` score file: the key column(s), ``score_column``
            and, if present, ``status_column`` (only rows with status ==
            ``ok_status`` are used; other statuses are counted in ``not_ok``).
            ``ok_status`` may be a collection: masc-run's ``no_background``
            rows carry a valid CP (only PF is undefined), so CP evaluations may
            pass ``("ok", "no_background")``.
            Values may be strings (CSV) or numbers.
        ratings (same types): One row per unit: the key column(s) and one column per human rater
            (``rating_columns``); empty / NaN / null = missing rating.
        score_column (str): Metric column, e.g. ``"cp"`` or ``"pf"``.
        rating_columns (sequence of str, optional): Human rating columns; default ``[score_column]`` (a ratings file with
            its own ``cp``/``pf`` columns).
        key (str or sequence of str): Join column(s); a string may list several, comma-separated (e.g.
            ``"method,key"`` when keys repeat across methods, as DreamBench++'s
            ``"{collection_id}-{prompt_index}"`` does).
        method_column (str or None): Grouping column, read from the score row, else from the rating row;
            None or absent from both = no per-method rows.
        scale (sequence of float, optional): Allowed rating values (e.g. 0..4); a rating off the scale is an error.
        scores_name, ratings_name (str): Used in error messages (the CLI passes the file paths).
        scores_lines, ratings_lines (sequence of int, optional): Source line number of each row, for error messages; default "row i"
            (1-based).

    Returns:
        Joined:

    Raises:
        DataError: Missing key/score/rating column, empty key, duplicate key, a
            non-numeric score on an ok row, a non-numeric or off-scale rating.
            The message names the source, the row and the reason.
    """
    key_cols = _key_cols(key)
    ok_set = {ok_status} if isinstance(ok_status, str) else set(ok_status)
    rating_columns = tuple(rating_columns) if rating_columns else (score_column,)
    score_rows = _as_rows(scores)
    rating_rows = _as_rows(ratings)
    scale_set = None if scale is None else {float(v) for v in scale}

    # ratings first: key -> (index, ratings, method)
    rated: dict[tuple[str, ...], tuple[int, list[float], str | None]] = {}
    for i, row in enumerate(rating_rows):
        where = _where(ratings_name, ratings_lines, i)
        k = _key_of(row, key_cols, where)
        if k in rated:
            first = _where(ratings_name, ratings_lines, rated[k][0])
            raise DataError(f"{where}: duplicate key {_fmt_key(k, key_cols)} (first at {first.split(', ', 1)[1]})")
        vals = []
        for col in rating_columns:
            if col not in row:
                raise DataError(f"{where}: no rating column {col!r} (columns: {', '.join(map(str, row.keys()))})")
            try:
                v = _parse_number(row[col])
            except ValueError:
                raise DataError(f"{where} (key {_fmt_key(k, key_cols)}): rating column {col!r} value {row[col]!r} is not a number") from None
            if v is not None and scale_set is not None and v not in scale_set:
                raise DataError(f"{where} (key {_fmt_key(k, key_cols)}): rating {v:g} in column {col!r} is not on the scale {sorted(scale_set)}")
            vals.append(float("nan") if v is None else v)
        meth = row.get(method_column) if method_column else None
        rated[k] = (i, vals, None if meth is None else str(meth))

    keys: list[tuple[str, ...]] = []
    methods: list[str | None] = []
    metric: list[float] = []
    human: list[list[float]] = []
    seen: dict[tuple[str, ...], int] = {}
    counts = {"score_rows": len(score_rows), "not_ok": 0, "missing_score": 0, "rating_rows": len(rating_rows), "unrated": 0}
    matched: set[tuple[str, ...]] = set()
    for i, row in enumerate(score_rows):
        where = _where(scores_name, scores_lines, i)
        k = _key_of(row, key_cols, where)
        if k in seen:
            first = _where(scores_name, scores_lines, seen[k])
            raise DataError(f"{where}: duplicate key {_fmt_key(k, key_cols)} (first at {first.split(', ', 1)[1]})")
        seen[k] = i
        has_status = bool(status_column) and status_column in row
        status = str(row[status_column]).strip() if has_status else None
        if has_status and status not in ok_set:
            counts["not_ok"] += 1
            continue
        if score_column not in row:
            raise DataError(f"{where}: no score column {score_column!r} (columns: {', '.join(map(str, row.keys()))})")
        try:
            v = _parse_number(row[score_column])
        except ValueError:
            raise DataError(f"{where} (key {_fmt_key(k, key_cols)}): score column {score_column!r} value {row[score_column]!r} is not a number") from None
        if v is None:
            if has_status:
                raise DataError(f"{where} (key {_fmt_key(k, key_cols)}): status is {status!r} but score column {score_column!r} is empty")
            counts["missing_score"] += 1
            continue
        hit = rated.get(k)
        if hit is None or all(math.isnan(x) for x in hit[1]):
            counts["unrated"] += 1
            continue
        matched.add(k)
        meth = row.get(method_column) if method_column and method_column in row else hit[2]
        keys.append(k)
        methods.append(None if meth is None or str(meth).strip() == "" else str(meth))
        metric.append(v)
        human.append(hit[1])
    counts["unscored"] = sum(1 for k in rated if k not in matched)
    counts["units"] = len(keys)
    h = np.asarray(human, dtype=np.float64).T if human else np.empty((len(rating_columns), 0))
    return Joined(keys, methods, np.asarray(metric, dtype=np.float64), h, rating_columns, counts)


def agreement_table(
    scores: Any,
    ratings: Any,
    *,
    score_column: str = "cp",
    rating_columns: Sequence[str] | None = None,
    key: str | Sequence[str] = "key",
    method_column: str | None = "method",
    status_column: str | None = "status",
    scale: Sequence[float] | None = None,
    levels: Sequence[str] = ("interval", "ordinal"),
    mapping: str = "quantile",
    human_agg: str = "per_rater",
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> list[dict[str, Any]]:
    """:func:`join_scores_ratings` then :func:`agreement_rows`.

    ``scale`` doubles as the rating categories (default: the observed
    ratings). See those two functions for parameters, return and errors.
    """
    joined = join_scores_ratings(
        scores,
        ratings,
        score_column=score_column,
        rating_columns=rating_columns,
        key=key,
        method_column=method_column,
        status_column=status_column,
        scale=scale,
    )
    return agreement_rows(
        joined,
        levels=levels,
        mapping=mapping,
        categories=scale,
        human_agg=human_agg,
        n_resamples=n_resamples,
        confidence=confidence,
        seed=seed,
    )
