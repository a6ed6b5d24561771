"""The rules the job layer's table reader and writer share (jobs/tables.py, jobs/delimited.py,
jobs/parquet.py): the table and its error, the byte budget of reading one, the one-name-a-column
check, the JSON form of a cell, and the fresh temporary file every writer renames into place.
jobs/tables.py re-exports the public ones: import them from there.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError

#: Memory a row costs once read beyond its text (a Python dict, its keys and strings), counted
#: against the same budget as the file's bytes: 5 million rows of two empty cells (a 10 MB file)
#: took 3.4 GB, about 680 bytes a row, before this; 512 is the floor of that per-row cost.
ROW_MEMORY_BYTES = 512
#: Memory a cell costs once read beyond its text, past the first two of a row (ROW_MEMORY_BYTES was
#: measured on rows of two cells): a CSV of 50 rows of 10,001 cells held 20 bytes a cell of one
#: character (a shared string) and 70 of two characters (tracemalloc, this reader); 20 is the floor.
CELL_MEMORY_BYTES = 20
#: Longest CSV/TSV cell read (characters): far above any prompt budget (masc-run's cells over their
#: budget are row statuses up to here), far below what one cell of a file within
#: DEFAULT_MAX_PAIRS_BYTES could hold (a 900 MB cell took 6.3 GB to parse). Longer: the file is
#: refused in one line naming the line.
MAX_CELL_CHARS = 16 * 2**20


class TableError(InputError):
    """A table file itself is unusable: missing, empty, unparsable, or lacking a required column.

    ``reason`` is ``missing_file`` or ``bad_<what>_file``; the message names file, line and cause.
    """


@dataclass
class Table:
    """A table read by :func:`read_table`.

    Attributes:
        path: the file read.
        columns: column names in file order (CSV/TSV header; first object's keys otherwise).
        rows: one dict per data row, in file order. CSV/TSV cells are strings; a short row's
            missing cells are ``""``.
        lines: ``lines[i]`` is the 1-based source line where row ``i`` ends (CSV/TSV: the header
            is line 1; JSON Lines: the object's line), or ``None`` for JSON arrays and Parquet.
    """

    path: Path
    columns: list[str]
    rows: list[dict[str, Any]]
    lines: list[int] | None

    def where(self, i: int) -> str:
        """``"<file>, line N"`` (or ``"row N"`` where the format has no lines) for row ``i`` (0-based)."""
        if self.lines is not None:
            return f"{self.path}, line {self.lines[i]}"
        return f"{self.path}, row {i + 1}"


@dataclass
class _RowBudget:
    """The byte budget of a table as it is read: the file's bytes plus :data:`ROW_MEMORY_BYTES` a
    row, checked as rows arrive, so a file of millions of tiny rows is refused before it is held."""

    path: Path
    bad: str
    size: int
    max_bytes: int | None
    option: str

    def check(self, n_rows: int, where: str, wide_cells: int = 0) -> None:
        """Refuse ``n_rows`` rows holding ``wide_cells`` cells past the first two of each row
        (:data:`CELL_MEMORY_BYTES` each) once they would exceed the budget (``where``: the place
        named, e.g. ``", line 12"``).

        Raises:
            TableError: over the budget (the rows, cells, estimate and option named).
        """
        cost = self.size + n_rows * ROW_MEMORY_BYTES + wide_cells * CELL_MEMORY_BYTES
        if self.max_bytes is None or cost <= self.max_bytes:
            return
        cells = f" and {CELL_MEMORY_BYTES} a cell past a row's first two ({wide_cells})" if wide_cells else ""
        raise TableError(
            self.bad,
            f"{self.path}{where}: {n_rows} rows would take about {cost / 2**20:.0f} MiB once read "
            f"({ROW_MEMORY_BYTES} bytes a row{cells} beside the file's {self.size}), over the budget "
            f"of {self.max_bytes} bytes" + (f" ({self.option})" if self.option else ""),
        )


def _header_key(name: str) -> str:
    """A column name as compared for repeats: surrounding spaces and byte-order marks stripped."""
    return name.strip(" \t\r\n\ufeff")


def _check_unique(p: Path, bad: str, names: Sequence[str], where: str) -> None:
    """Refuse a column name given twice in ``names`` (compared by :func:`_header_key`; empty names
    are unnamed columns and may repeat), naming the file, the name and its 1-based positions."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        key = _header_key(name)
        if not key:
            continue
        if key in seen:
            first = seen[key]
            raise TableError(
                bad,
                f"{p}: {where} names column {key!r} twice (columns {first + 1} and {i + 1}: "
                f"{names[first]!r}, {name!r}); keep one column of each name",
            )
        seen[key] = i


def json_cell(v: Any) -> Any:
    """A value for JSON, JSON Lines or Parquet: NaN -> ``None`` (null); numpy floats as Python
    floats; anything else as it is."""
    if isinstance(v, float):
        return None if math.isnan(v) else float(v)
    return v


def open_fresh(tmp: Path, *, binary: bool = False, newline: str | None = None):
    """A new file at the temporary name ``tmp``, opened for writing: whatever is there (a link
    planted at the fixed name, a stale temporary file) is removed first, never written through,
    and the file is created exclusively without following links (``O_CREAT | O_EXCL |
    O_NOFOLLOW``: a link raced in between fails the write instead of redirecting it).

    Raises:
        OSError: it cannot be created (the folder is read-only, a folder stands at ``tmp``...).
    """
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    return open(fd, "wb") if binary else open(fd, "w", newline=newline, encoding="utf-8")
