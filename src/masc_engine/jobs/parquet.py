"""Parquet tables for the job layer's one reader and one writer (jobs/tables.py ``read_table`` /
``write_table``): pyarrow, the ``[parquet]`` extra, imported only when a ``.parquet`` file is read
or written.

Reading: text columns stay dictionary-encoded until the byte budget has been checked against what
they decode to; a text column whose bytes are not UTF-8 refuses the file naming the column and the
row; cells of types JSON has no word for are read as text (:func:`_json_safe_value`: dates and
timestamps as ISO 8601, decimals and durations as ``str``, binary as its UTF-8 text or hex), since
every command journals, fingerprints and writes cells as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .table_base import Table, TableError, _check_unique, _RowBudget, json_cell


def _materialized_bytes(t) -> int:
    """Bytes the text and binary cells of the Arrow table ``t`` take once turned into Python values
    (a dictionary-encoded column counts each row's value, as ``to_pylist`` makes it); other
    columns count their Arrow buffers."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def text(typ) -> bool:
        return (
            pa.types.is_string(typ)
            or pa.types.is_large_string(typ)
            or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ)
        )

    total = 0
    for column in t.columns:
        for chunk in column.chunks:
            if pa.types.is_dictionary(chunk.type) and text(chunk.type.value_type):
                lengths = pc.binary_length(chunk.dictionary).take(chunk.indices)
            elif text(chunk.type):
                lengths = pc.binary_length(chunk)
            else:
                total += chunk.nbytes
                continue
            total += int(pc.sum(lengths).as_py() or 0)
    return total


def read_parquet(p: Path, bad: str, max_bytes: int | None = None, budget: _RowBudget | None = None) -> Table:
    """Read a ``.parquet`` table (:func:`~masc_engine.jobs.tables.read_table`'s Parquet reader):
    its schema checked for repeated names, its rows against ``budget``, its text cells against
    ``max_bytes`` as they decode, every cell JSON-safe (:func:`_parquet_rows`).

    Raises:
        TableError: pyarrow is missing, the file is unreadable, over its budget, names a column
            twice, or a text column is not UTF-8 (file, column and row named).
    """
    from .. import extras

    try:
        pq = extras.require("pyarrow.parquet", f"{p}: reading Parquet")
    except ImportError as exc:  # MissingDependencyError: one line naming the [parquet] extra
        raise TableError(bad, str(exc)) from None
    try:
        # text columns stay dictionary-encoded while read (a repeated value is held once), so the
        # budget below is checked before any cell is expanded
        schema = pq.read_schema(p)
        _check_unique(p, bad, schema.names, "the schema")
        text = [
            f.name
            for f in schema
            if str(f.type) in ("string", "large_string", "binary", "large_binary")
            or str(f.type).startswith("dictionary<values=string")
        ]
        t = pq.read_table(p, read_dictionary=text)
    except TableError:
        raise
    except Exception as exc:  # pyarrow's own errors (ArrowInvalid, OSError) for a damaged file
        raise TableError(bad, f"{p}: not a readable Parquet file ({exc})") from None
    if budget is not None:
        budget.check(t.num_rows, "", t.num_rows * max(0, t.num_columns - 2))
    if max_bytes is not None:  # a small file of repeated dictionary values can expand to gigabytes
        n = _materialized_bytes(t)
        if n > max_bytes:
            raise TableError(
                bad,
                f"{p}: its cells hold {n} bytes once decoded (dictionary-encoded or "
                f"compressed), over the budget of {max_bytes} bytes",
            )
    return Table(p, list(t.column_names), _parquet_rows(p, bad, t), None)


def _parquet_rows(p: Path, bad: str, t) -> list[dict]:
    """The rows of the Arrow table ``t`` as dicts of JSON-safe values (:func:`_json_safe_value`:
    every command journals, fingerprints and writes cells as JSON).

    Raises:
        TableError: a text column holds bytes that are not UTF-8 (the file, column and row named).
    """
    try:
        rows = t.to_pylist()
    except UnicodeDecodeError:
        raise _not_utf8(p, bad, t) from None
    import pyarrow as pa

    simple = (pa.types.is_string, pa.types.is_large_string, pa.types.is_integer, pa.types.is_floating)
    odd = [
        f.name
        for f in t.schema
        if not any(is_(f.type) for is_ in (*simple, pa.types.is_boolean, pa.types.is_null))
        and not (pa.types.is_dictionary(f.type) and any(is_(f.type.value_type) for is_ in simple))
    ]
    for r in rows if odd else ():
        for name in odd:
            r[name] = _json_safe_value(r[name])
    return rows


def _not_utf8(p: Path, bad: str, t) -> TableError:
    """The error for a text column of ``t`` whose bytes are not UTF-8, naming the first such cell."""
    for name, column in zip(t.column_names, t.columns):
        for i, v in enumerate(column):
            try:
                v.as_py()
            except UnicodeDecodeError as exc:
                return TableError(
                    bad, f"{p}, row {i + 1}: column {name!r} is not UTF-8 text ({exc.reason} at byte {exc.start})"
                )
    return TableError(bad, f"{p}: a text column is not UTF-8 text")


def _json_safe_value(v: Any) -> Any:
    """A Parquet cell of a type JSON has no word for, as text: a date, time or timestamp as ISO
    8601 (``datetime.isoformat``), a duration and a decimal as ``str``, binary as its UTF-8 text
    (hex where it is not UTF-8); lists and structs element by element; others as they are."""
    import datetime
    import decimal

    if isinstance(v, (datetime.date, datetime.time)):  # (datetime.datetime is a date)
        return v.isoformat()
    if isinstance(v, (datetime.timedelta, decimal.Decimal)):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v).hex()
    if isinstance(v, list):
        return [_json_safe_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _json_safe_value(x) for k, x in v.items()}
    if isinstance(v, tuple):  # a map column: (key, value) pairs
        return [_json_safe_value(x) for x in v]
    return v


def write_parquet(sink, path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Write ``rows`` (``columns`` in order) as Parquet to the open binary file ``sink``
    (:func:`~masc_engine.jobs.tables.write_table`'s Parquet writer; ``path`` is named in errors).

    Raises:
        MissingDependencyError: pyarrow is missing (the ``[parquet]`` extra).
    """
    from .. import extras

    pa = extras.require("pyarrow", f"{path}: Parquet")
    pq = extras.require("pyarrow.parquet", f"{path}: Parquet")
    pq.write_table(pa.table({k: _column(pa, [json_cell(r.get(k)) for r in rows]) for k in columns}), sink)


def _column(pa, values: list):
    """One output column as an Arrow array, its type inferred from ``values``; a column whose
    values mix types Arrow cannot hold in one (a carried-through JSON Lines column of ``7`` and
    ``"seven"``) is written as text: each value as its JSON text (a string as itself), missing
    values null."""
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        text = [
            v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str) for v in values
        ]
        return pa.array(text, pa.string())
