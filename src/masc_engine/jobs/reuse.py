"""What a rerun of masc-run may take from an existing ``--out`` (jobs/results.py ``resume``): the
checks on a journal's lines and on the rows of a finished output before any of them is reused.

Everything reused is checked first, and whatever fails is one line naming the file, the line or
row, and the way out, never a traceback and never a silent replacement:

- a journal whose first line is not masc-run's header was not written by masc-run: refused even
  with ``--overwrite`` (:class:`SidecarError`: it is someone else's file; remove it or choose
  another ``--out``);
- a journal line elsewhere that is not UTF-8 text or not a JSON object, and a reused row (journal
  or output) without an integer ``row_index``, a ``row_key`` or a ``status``, or an output whose
  CSV/TSV ends mid-row (a truncated copy) or lacks one of those columns (re-saved by another
  program): :class:`DamagedResultsError`, which ``--overwrite`` answers by scoring every row afresh;
- results made from another pairs file (:func:`check_input`): :class:`SettingsChangedError`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import MascEngineError


class SidecarError(MascEngineError):
    """A journal or sidecar path is a symbolic link, not a regular file, or a journal masc-run did
    not write: refused before it is read further or written (one line naming it)."""


class SettingsChangedError(MascEngineError):
    """A rerun's settings (or pairs file) differ from those of the results already at ``--out``:
    nothing is re-scored or erased unless asked (``--overwrite``)."""


class DamagedResultsError(SettingsChangedError, ValueError):
    """Results at ``--out`` (its journal or its output) cannot be reused as they are: a line that
    is not text or JSON, a row without its ``row_index``, ``row_key`` or ``status``, a truncated
    output. Nothing is scored or erased; ``--overwrite`` scores every row afresh. A ``ValueError``
    too, as an unreadable journal line was before it had its own class."""


#: The columns every reused row must hold, as masc-run wrote them.
REUSED_COLUMNS = ("row_index", "row_key", "status")


def _damaged(where: str, why: str) -> DamagedResultsError:
    return DamagedResultsError(
        f"{where}: {why}, so its results cannot be reused: nothing was scored or erased; "
        "--overwrite scores every row afresh, or choose another --out"
    )


#: How masc-run's journal begins (``append_journal`` writes the header's ``type`` first).
HEADER_START = b'{"type": "header"'


def parse_journal(path: Path, data: bytes) -> tuple[list[dict], bytes, bool]:
    """The entries of a journal's bytes: ``(entries, kept, repaired)``. A torn last line (no
    newline, or not a JSON object: a killed run's last append) is left out of ``kept``, the bytes
    the journal keeps (``repaired=True``).

    Raises:
        SidecarError: the bytes do not begin as masc-run's header does (:data:`HEADER_START`): a
            file masc-run did not write, never replaced or removed.
        DamagedResultsError: a line before the last is not UTF-8 text or not a JSON object, or the
            first line is not a whole header (the file and the 1-based line named).
    """
    if data and not data.startswith(HEADER_START):
        raise SidecarError(
            f"{path} is not a masc-run journal (it does not begin with masc-run's header): nothing "
            "was read or written; move it away, or choose another --out"
        )
    lines = data.split(b"\n")
    repaired = lines.pop() != b""  # the piece after the last newline: a torn line
    entries: list[dict] = []
    for i, raw in enumerate(lines):
        entry = _entry(raw)
        if isinstance(entry, str):
            if i == len(lines) - 1:  # the last whole line: cut off as a torn append
                repaired = True
                break
            raise _damaged(str(path), f"line {i + 1} is {entry}")
        entries.append(entry)
    if entries and entries[0].get("type") != "header":
        raise _damaged(f"{path}, line 1", "the journal's header is not a JSON object of type header")
    return entries, b"".join(line + b"\n" for line in lines[: len(entries)]), repaired


def _entry(raw: bytes) -> dict | str:
    """A journal line as a JSON object, or why it is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    try:
        entry = json.loads(text)
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError; '[' * 10**5 recurses)
        return "not JSON"
    return entry if isinstance(entry, dict) else "not a JSON object"


def reusable(entries: list[dict], keys: list[str], where) -> dict[int, dict]:
    """The rows among ``entries`` that this input may reuse, by 1-based ``row_index``: those whose
    ``row_index`` is a row of this input with the same ``row_key`` (``keys[i - 1]``).

    Args:
        entries: rows of a journal (JSON) or of a finished output (CSV cells are text).
        keys: this input's ``row_key`` per row.
        where (Callable[[int], str]): ``where(n)`` names the n-th entry (0-based) in messages
            (``"<file>, line 4"``).

    Raises:
        DamagedResultsError: an entry without an integer ``row_index`` (int, or its decimal
            text), a ``row_key`` or a ``status`` (the entry and the cell named).
    """
    done = {}
    for n, e in enumerate(entries):
        i = _row_index(e.get("row_index"))
        bad = next((c for c in REUSED_COLUMNS[1:] if not isinstance(e.get(c), str) or not e.get(c)), None)
        if i is None or bad is not None:
            cell = "row_index" if i is None else bad
            raise _damaged(where(n), f"the row has no {cell} as masc-run writes it (got {e.get(cell)!r:.40})")
        if 1 <= i <= len(keys) and e["row_key"] == keys[i - 1]:
            done[i] = e
    return done


def _row_index(v) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().isdecimal() and v.strip().isascii():
        return int(v)
    return None


def check_output(path: Path, columns: list[str]) -> None:
    """Refuse a finished output that lacks a column every reused row needs, or a CSV / TSV that
    ends mid-row (masc-run ends each with a newline: a copy cut short, whose last row's cells are
    missing).

    Raises:
        DamagedResultsError: the column, or the truncation, named.
    """
    missing = [c for c in REUSED_COLUMNS if c not in columns]
    if missing:
        raise _damaged(str(path), f"it lacks the column(s) {', '.join(missing)} masc-run writes (re-saved elsewhere?)")
    if path.suffix.lower() in (".csv", ".tsv") and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                raise _damaged(str(path), "it ends mid-row (a copy cut short?)")


def check_input(what: str, recorded, given: str) -> None:
    """Refuse results made from another pairs file than ``given`` (a resolved path). Paths are
    compared resolved (symbolic links and relative spellings followed, an older relative record
    resolved against the current folder): the same file named another way is the same input. A
    recorded input that no longer exists is taken as moved (its rows are reused by ``row_key``);
    one that still exists and differs is another file.

    Raises:
        SettingsChangedError: another pairs file (``input: <recorded> -> <given>``).
    """
    if not isinstance(recorded, str) or not recorded:
        return  # written before the input was recorded
    old = os.path.realpath(recorded)
    if old == given or not os.path.exists(old):
        return
    raise SettingsChangedError(
        f"{what} made from another pairs file (input: {old} -> {given}): nothing was scored or "
        "erased; --overwrite replaces them, or choose another --out"
    )
