"""Parquet tables for the job layer's one reader and one writer (jobs/tables.py ``read_table`` /
``write_table``): pyarrow, the ``[parquet]`` extra, imported only when a ``.parquet`` file is read
or written.

Reading: text columns stay dictionary-encoded until the byte budget has been checked against what
they decode to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .tables import Table, TableError, _check_unique, _RowBudget, json_cell


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
    ``max_bytes`` as they decode.

    Raises:
        TableError: pyarrow is missing, the file is unreadable, over its budget, names a column
            twice.
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
        budget.check(t.num_rows, "")
    if max_bytes is not None:  # a small file of repeated dictionary values can expand to gigabytes
        n = _materialized_bytes(t)
        if n > max_bytes:
            raise TableError(
                bad,
                f"{p}: its cells hold {n} bytes once decoded (dictionary-encoded or "
                f"compressed), over the budget of {max_bytes} bytes",
            )
    return Table(p, list(t.column_names), t.to_pylist(), None)


def write_parquet(sink, path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Write ``rows`` (``columns`` in order) as Parquet to the open binary file ``sink``
    (:func:`~masc_engine.jobs.tables.write_table`'s Parquet writer; ``path`` is named in errors).

    Raises:
        MissingDependencyError: pyarrow is missing (the ``[parquet]`` extra).
    """
    from .. import extras

    pa = extras.require("pyarrow", f"{path}: Parquet")
    pq = extras.require("pyarrow.parquet", f"{path}: Parquet")
    pq.write_table(pa.table({k: [json_cell(r.get(k)) for r in rows] for k in columns}), sink)
