"""CSV and TSV tables for the job layer's one reader (jobs/tables.py ``read_table``), with Python's
csv module: UTF-8, a byte-order mark tolerated, quoted commas and newlines, a cell bounded by
:data:`~masc_engine.jobs.tables.MAX_CELL_CHARS`, and a quote that opens a cell and is never closed
refused where it opened, never read as every later line of the file.
"""

from __future__ import annotations

import csv
import os
import re
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

from .table_base import MAX_CELL_CHARS, Table, TableError, _check_unique, _RowBudget


@contextmanager
def _field_limit(file_bytes: int):
    """Python's csv module refuses a field over 131,072 characters by default; here the bound is
    :data:`MAX_CELL_CHARS` (or the file's size, if smaller): a long cell below it is the row's
    business (masc-run's prompt budget makes it that row's status), one above it refuses the file
    before it is held in memory. The module-wide limit is restored afterwards."""
    old = csv.field_size_limit()
    csv.field_size_limit(max(old, min(file_bytes + 1, MAX_CELL_CHARS, sys.maxsize)))
    try:
        yield
    finally:
        csv.field_size_limit(old)


#: A line :func:`_read_delimited` feeds the csv reader after the file's last line: a file that
#: ends inside a quoted cell swallows it into that cell (the csv module, not strict, accepts the end
#: of the file there); one that does not reads it as a row of its own, which is dropped.
_EOF_LINE = "\ufffemasc-engine end of file"


class _CountedLines:
    """The lines of an open file, counted as the csv reader takes them (``n``: the line being
    parsed, so a csv error names the line holding it), then :data:`_EOF_LINE`."""

    def __init__(self, fh) -> None:
        self.fh, self.n = fh, 0

    def __iter__(self):
        for line in self.fh:
            self.n += 1
            yield line
        yield _EOF_LINE


def _unclosed_quote(p: Path, bad: str, cells: dict, last_line: int) -> None:
    """Refuse a row (or header) whose cell swallowed :data:`_EOF_LINE`: a quote opened in that
    cell is never closed, so every later line of the file was read into it. The line named is
    the one the quote opened on (the file's last line less the line breaks inside the cell)."""
    for name, value in cells.items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and v.endswith(_EOF_LINE):
                text = v[: -len(_EOF_LINE)]
                breaks = len(re.findall(r"\r\n|\r|\n", text))
                opened = last_line - breaks + (1 if text.endswith(("\n", "\r")) else 0)
                column = f" (column {name!r})" if isinstance(name, str) else ""
                raise TableError(
                    bad,
                    f"{p}, line {opened}: a quote opening a cell{column} is never closed, so every "
                    "later line would be read into that cell; close it, or write a quote inside a "
                    'quoted cell as ""',
                )


class _LastRow:
    """A csv reader that keeps the last row it read (``row``): the cells a DictReader folds into
    one key where the header repeats a name."""

    def __init__(self, reader) -> None:
        self.reader = reader
        self.row: list[str] = []

    def __iter__(self):
        return self

    def __next__(self) -> list:
        self.row = next(self.reader)
        return self.row

    @property
    def line_num(self) -> int:
        return self.reader.line_num

    @property
    def dialect(self):
        return self.reader.dialect


def _shared_unnamed(names: Sequence[str]) -> list[int]:
    """0-based positions of header cells whose (unnamed: empty once stripped) name another cell
    repeats exactly: a row's dict holds only the last of their cells."""
    seen: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        seen.setdefault(name, []).append(i)
    return sorted(i for group in seen.values() if len(group) > 1 for i in group)


def _check_unnamed(p: Path, bad: str, shared: list[int], cells: list, line: int) -> None:
    """Refuse a row holding a cell under a header cell that has no name shared with another:
    read as one key, all but one of them would be lost (or copied over the others on output)."""
    for i in shared:
        if i < len(cells) and cells[i].strip():
            raise TableError(
                bad,
                f"{p}, line {line}: column {i + 1} holds a cell ({cells[i]!r:.40}) under an empty header "
                f"cell that column(s) {', '.join(str(j + 1) for j in shared if j != i)} share, so one "
                "would be lost; name these columns in the header (empty unnamed columns may repeat)",
            )


def read_delimited(p: Path, delimiter: str, bad: str, extra_fields: str, budget: _RowBudget) -> Table:
    """Read a CSV (``delimiter=","``) or TSV (a tab) table (:func:`~masc_engine.jobs.tables.read_table`'s
    reader for them): UTF-8 with a byte-order mark tolerated, quoted commas and newlines, each row's
    end line kept; ``extra_fields`` is ``"error"`` or ``"ignore"`` (cells past the header's).

    Raises:
        TableError: empty, not UTF-8, a cell past the field limit (its line named), a quote
            never closed (:func:`_unclosed_quote`), a repeated header name, a cell under an
            unnamed header cell another shares (:func:`_check_unnamed`), more cells than the
            header (``extra_fields="error"``), or over ``budget``.
    """
    rows, lines, wide = [], [], 0
    with p.open(newline="", encoding="utf-8-sig") as fh, _field_limit(os.fstat(fh.fileno()).st_size):
        src = _CountedLines(fh)
        reader = csv.DictReader(iter(src), delimiter=delimiter)
        try:
            if not reader.fieldnames or reader.fieldnames == [_EOF_LINE]:
                raise TableError(bad, f"{p} is empty (no header row)")
            _unclosed_quote(p, bad, dict(enumerate(reader.fieldnames)), src.n)
            _check_unique(p, bad, reader.fieldnames, "the header")
            shared = _shared_unnamed(reader.fieldnames)
            last = _LastRow(reader.reader) if shared else None
            if last is not None:
                reader.reader = last  # type: ignore[assignment]  # (a reader that keeps its last row)
            for row in reader:
                if next(iter(row.values())) == _EOF_LINE:
                    break
                _unclosed_quote(p, bad, row, src.n)
                if last is not None:
                    _check_unnamed(p, bad, shared, last.row, reader.line_num)
                if None in row:
                    if extra_fields == "error":
                        raise TableError(bad, f"{p}, line {reader.line_num}: more fields than the header has columns")
                    del row[None]
                rows.append({k: ("" if v is None else v) for k, v in row.items()})
                lines.append(reader.line_num)
                wide += max(0, len(row) - 2)
                budget.check(len(rows), f", line {reader.line_num}", wide)
        except csv.Error as exc:
            raise TableError(bad, f"{p}, line {src.n}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise TableError(bad, f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return Table(p, list(reader.fieldnames), rows, lines)
