"""The one table reader and the one table writer of every command (masc-run, masc-rank,
masc-eval, masc-report), and the path and cell rules that go with them.

Formats by extension: ``.csv`` / ``.txt`` (comma) and ``.tsv`` (tab), read as UTF-8 with a
byte-order mark tolerated and quoted commas / newlines allowed; ``.jsonl`` / ``.ndjson`` (one JSON
object per line); ``.json`` (an array of objects); ``.parquet`` (pyarrow). Every error is a
:class:`TableError` whose message names the file, the line (or row) and the reason.

Column names are one each: a CSV / TSV header naming a column twice, a JSON object holding a key
twice, or a Parquet schema with two fields of one name is refused before any row is read (the
file, the name and both positions named), never read as "the last one wins". Header names are
compared with surrounding spaces and byte-order marks (U+FEFF) stripped, so ``prompt`` and
`` prompt`` are one name twice (a leading byte-order mark of the file itself is dropped as it is
read); the names themselves are kept as written. Empty header cells (a trailing comma) name no
column and may repeat while the cells under them are empty (jobs/delimited.py).

Missing values in every output table (:func:`write_table`): a NaN number is written ``nan`` in
CSV / TSV and ``null`` in JSON, JSON Lines and Parquet; ``None`` (a cell with no value, e.g. the
rank of a query that was not ranked) is an empty CSV / TSV cell and ``null`` elsewhere. The reader
takes all of them back as missing (:func:`parse_number`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .delimited import read_delimited
from .parquet import read_parquet, write_parquet
from .table_base import CELL_MEMORY_BYTES as CELL_MEMORY_BYTES
from .table_base import MAX_CELL_CHARS as MAX_CELL_CHARS
from .table_base import ROW_MEMORY_BYTES as ROW_MEMORY_BYTES
from .table_base import Table as Table
from .table_base import TableError as TableError
from .table_base import _RowBudget
from .table_base import json_cell as json_cell
from .table_base import open_fresh as open_fresh

#: Default byte budget of a pairs file (masc-run ``--max-pairs-mb``), checked from its size before
#: it is read: every row is held in memory, so the file is bounded (1 GiB: millions of rows).
DEFAULT_MAX_PAIRS_BYTES = 2**30
FORMATS = {
    ".csv": "csv",
    ".txt": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
}


def read_table(
    path: str | Path,
    required: Sequence[str] = (),
    what: str = "table",
    *,
    extra_fields: str = "error",
    max_bytes: int | None = None,
    budget_option: str = "",
) -> Table:
    """Read a table file (format by extension, see the module docstring).

    Args:
        path: the file.
        required: columns that must be present (named in the error otherwise).
        what: what the table is (``pairs``, ``gallery``, ``scores``...), used in messages and in
            the error reason ``bad_<what>_file``.
        extra_fields: a CSV/TSV row with more cells than the header: ``"error"`` raises,
            ``"ignore"`` drops the extra cells (masc-run's behaviour: the row is still scored).
        max_bytes: the file's byte budget, checked from its size before it is read (None: none).
        budget_option: the option that sets ``max_bytes``, named in the refusal.

    Returns:
        a :class:`Table`.

    Raises:
        TableError: the file is missing, of an unknown type, over ``max_bytes``, empty,
            unparsable (file and line named), names one column twice (a repeated header cell,
            JSON key or Parquet field: the name and its positions named, see the module
            docstring), or a required column is missing.
    """
    p = Path(path)
    bad = f"bad_{what}_file"
    if not p.is_file():
        raise TableError("missing_file", f"{what} file {p} does not exist")
    size = p.stat().st_size
    if max_bytes is not None and size > max_bytes:
        raise TableError(
            bad,
            f"{p}: {size} bytes, over the budget of {max_bytes} bytes"
            + (f" ({budget_option})" if budget_option else ""),
        )
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise TableError(bad, f"{p}: unknown file type {p.suffix!r}; expected one of {', '.join(FORMATS)}")
    budget = _RowBudget(p, bad, size, max_bytes, budget_option)
    if fmt in ("csv", "tsv"):
        table = read_delimited(p, "\t" if fmt == "tsv" else ",", bad, extra_fields, budget)
    elif fmt == "jsonl":
        table = _read_jsonl(p, bad, budget)
    elif fmt == "json":
        table = _read_json(p, bad, budget)
        budget.check(len(table.rows), "", sum(max(0, len(r) - 2) for r in table.rows))
    else:
        table = read_parquet(p, bad, max_bytes, budget)
    missing = [c for c in required if c not in table.columns]
    if missing:
        raise TableError(bad, f"{p}: missing column(s) {', '.join(missing)}; required: {', '.join(required)}")
    return table


class RepeatedKeyError(Exception):
    """A JSON object held one key twice (raised by :func:`unique_object`).

    Attributes:
        key (str): the repeated key.
    """

    def __init__(self, key: str, first: int, second: int) -> None:
        super().__init__(f"key {key!r} appears twice in one object (keys {first} and {second})")
        self.key = key


def unique_object(pairs: list[tuple[str, Any]]) -> dict:
    """``json.loads``'s ``object_pairs_hook`` for input that must name each key once (input tables
    here, masc-serve's JSON bodies): the object as a dict.

    Raises:
        RepeatedKeyError: a key is given twice (its 1-based positions among the object's keys).
    """
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    first: dict[str, int] = {}
    for i, (k, _) in enumerate(pairs):
        if k in first:
            raise RepeatedKeyError(k, first[k] + 1, i + 1)
        first[k] = i
    raise AssertionError("unreachable: fewer keys than pairs without a repeat")


class _Repeats(dict):
    """An object that held a repeated key, itself or in an object nested in it."""


def _marking_object(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)
    nested = (v for v in obj.values() for v in (v if isinstance(v, list) else [v]))
    return _Repeats(obj) if len(obj) < len(pairs) or any(isinstance(v, _Repeats) for v in nested) else obj


def _repeat_row(text: str) -> int | None:
    """The 1-based row of a ``.json`` array whose object holds a repeated key (parsed again, on
    this error path only), or None."""
    rows = json.loads(text, object_pairs_hook=_marking_object)
    if isinstance(rows, list):
        for i, r in enumerate(rows):
            if isinstance(r, _Repeats):
                return i + 1
    return None


def _columns_of(rows: list[dict]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    return list(cols)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(obj: Any) -> str | None:
    """A string in ``obj`` (keys included) holding a lone UTF-16 surrogate (a ``\\ud800`` escape in
    JSON: not text, and no UTF-8 file can hold it), or None; iterative, whatever the nesting."""
    stack = [obj]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return v
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def _max_digits() -> int:
    """Python's limit on an integer's decimal digits (4300 by default)."""
    return sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300


def _parse_json(text: str, bad: str, where: str, whole_file: bool = False) -> Any:
    """``json.loads(text)``; invalid JSON, nesting past Python's recursion limit, an integer past
    Python's digit limit, an object holding one key twice, or a string that
    is not text (a lone surrogate) is a :class:`TableError` naming ``where`` (and, for a
    ``whole_file``, the line of a syntax error)."""
    try:
        obj = json.loads(text, object_pairs_hook=unique_object)
    except RepeatedKeyError as exc:
        row = _repeat_row(text) if whole_file else None
        where = f"{where}, row {row}" if row is not None else where
        raise TableError(bad, f"{where}: {exc}; keep one column of each name") from None
    except json.JSONDecodeError as exc:
        where = f"{where}, line {exc.lineno}" if whole_file else where
        raise TableError(bad, f"{where}: invalid JSON ({exc.msg})") from None
    except RecursionError:
        raise TableError(bad, f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError:  # Python's int digit limit (sys.get_int_max_str_digits), not a syntax error
        if whole_file and (m := re.search(rf"\d{{{_max_digits() + 1},}}", text)):
            where = f"{where}, line {text.count(chr(10), 0, m.start()) + 1}"
        raise TableError(bad, f"{where}: a number of more than {_max_digits()} digits") from None
    if "\\u" in text and (bad_text := _lone_surrogate(obj)) is not None:
        found = _SURROGATE.search(bad_text)
        assert found is not None  # _lone_surrogate returned a text holding one
        i = found.start()
        raise TableError(
            bad,
            f"{where}: a string holds a lone UTF-16 surrogate ({bad_text[i]!a}), not text "
            f"(near {bad_text[max(0, i - 20) : i]!r})",
        )
    return obj


def _read_jsonl(p: Path, bad: str, budget: _RowBudget) -> Table:
    rows, lines, wide = [], [], 0
    with p.open("rb") as fh:  # decoded line by line, so that a decoding error names its line
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise TableError(
                    bad, f"{p}, line {lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})"
                ) from None
            if not text.strip():
                continue
            obj = _parse_json(text, bad, f"{p}, line {lineno}")
            if not isinstance(obj, dict):
                raise TableError(bad, f"{p}, line {lineno}: expected a JSON object, got {type(obj).__name__}")
            rows.append(obj)
            lines.append(lineno)
            wide += max(0, len(obj) - 2)
            budget.check(len(rows), f", line {lineno}", wide)
    return Table(p, _columns_of(rows), rows, lines)


def _read_json(p: Path, bad: str, budget: _RowBudget) -> Table:
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TableError(bad, f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    # estimated before parsing (an array is parsed whole): at most one row per "{", one cell per ":"
    objects, colons = text.count("{"), text.count(":")
    budget.check(objects, " (estimated before parsing it)", max(0, colons - 2 * objects))
    obj = _parse_json(text, bad, str(p), whole_file=True)
    if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
        raise TableError(
            bad, f"{p}: a .json file must hold an array of objects (one per row); use .jsonl for JSON Lines"
        )
    return Table(p, _columns_of(obj), obj, None)


# ---------------------------------------------------------------------------------- paths, cells


def resolve_path(base: str | Path, p: str, *, real: bool = False) -> str:
    """A path cell resolved against the table's folder ``base`` (absolute paths kept as they are);
    ``real=True`` also resolves symbolic links (``os.path.realpath``), so two spellings of one file
    compare equal."""
    out = p if os.path.isabs(p) else str(Path(base) / p)
    return os.path.realpath(out) if real else out


def cell(row: dict, key: str) -> str:
    """A cell as stripped text (``""`` when absent or None)."""
    v = row.get(key)
    return "" if v is None else str(v).strip()


MISSING = frozenset({"", "nan", "na", "n/a", "none", "null"})


def parse_number(value: Any) -> float | None:
    """A numeric cell: ``float``, or ``None`` for a missing value (empty, ``nan``, ``NA``, ``null``...).

    Raises:
        ValueError: not a number, a boolean, or infinite.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a number")
    text = value if isinstance(value, (int, float)) else str(value).strip()
    if isinstance(text, str) and text.lower() in MISSING:
        return None
    v = float(text)  # raises ValueError
    if math.isnan(v):
        return None
    if math.isinf(v):
        raise ValueError(f"{value!r} is infinite")
    return v


def number_or_nan(value: Any) -> float:
    """A numeric cell for display and summaries: :func:`parse_number`'s value, NaN where it has none
    (missing) or refuses the cell (not a number, a boolean, infinite). The one lenient reading of a
    score cell (masc-report, masc-run's resumed rows); masc-eval uses :func:`parse_number` and names
    a bad cell instead."""
    try:
        v = parse_number(value)
    except (TypeError, ValueError):
        return float("nan")
    return float("nan") if v is None else v


_TRUE = {"1", "true", "t", "yes", "y", "within", "same"}
_FALSE = {"0", "false", "f", "no", "n", "cross", "different"}


def parse_bool(value: Any) -> bool:
    """A boolean cell: bool, 0/1, true/false, yes/no, within/cross (case-insensitive).

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy scalars
        return parse_bool(value.item())
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean (use true/false, 1/0, yes/no, within/cross or same/different)")


# ---------------------------------------------------------------------------------- writing

#: How a NaN number is spelled in a CSV / TSV output (JSON and Parquet: null).
CSV_NAN = "nan"
WRITE_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
}


def csv_cell(v: Any) -> Any:
    """A value as a CSV / TSV cell: ``None`` -> ``""``, NaN -> ``"nan"`` (:data:`CSV_NAN`), a float
    (numpy's too) as Python's shortest round-tripping repr, anything else as it is."""
    if v is None:
        return ""
    if isinstance(v, float):
        return CSV_NAN if math.isnan(v) else float(v)
    return v


def write_table(
    path: str | Path, rows: Sequence[dict], columns: Sequence[str], *, fmt: str | None = None, meta: dict | None = None
) -> Path:
    """Write ``rows`` (dicts; ``columns`` in order, other keys ignored, absent keys missing)
    atomically (a ``.partial`` file, created afresh by :func:`open_fresh`, renamed into place),
    with the missing-value convention of the module docstring.

    Args:
        path: the output file.
        rows: the rows.
        columns: the columns, in order.
        fmt: ``csv``, ``tsv``, ``jsonl``, ``json`` or ``parquet``; default from the extension
            (:data:`WRITE_FORMATS`).
        meta: ``json`` only: write one object ``{**meta, "rows": [...]}`` instead of an array.

    Returns:
        the path written.

    Raises:
        ValueError: an extension (or ``fmt``) that is not a table format written here.
        MissingDependencyError: Parquet without pyarrow (the ``[parquet]`` extra).
    """
    path = Path(path)
    fmt = fmt or WRITE_FORMATS.get(path.suffix.lower())
    if fmt not in set(WRITE_FORMATS.values()):
        raise ValueError(f"cannot write {path}: use one of {', '.join(WRITE_FORMATS)}")
    tmp = path.with_name(path.name + ".partial")
    try:
        if fmt in ("csv", "tsv"):
            with open_fresh(tmp, newline="") as f:
                w = csv.DictWriter(
                    f, fieldnames=list(columns), extrasaction="ignore", delimiter="\t" if fmt == "tsv" else ","
                )
                w.writeheader()
                for r in rows:
                    w.writerow({k: csv_cell(r.get(k)) for k in columns})
        elif fmt == "parquet":
            with open_fresh(tmp, binary=True) as f:
                write_parquet(f, path, rows, columns)
        else:
            records = [{k: json_cell(r.get(k)) for k in columns} for r in rows]
            with open_fresh(tmp) as f:
                if fmt == "jsonl":
                    f.writelines(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
                else:
                    doc: Any = records if meta is None else {**meta, "rows": records}
                    f.write(json.dumps(doc, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves no partial file behind
    return path
