"""Result files of the pairs job (``masc-run``): format by extension, an append-only journal for resume, and the
metadata sidecar.

- Output formats: ``.csv`` (default), ``.parquet`` (pyarrow, the ``[parquet]`` extra), ``.jsonl`` / ``.ndjson`` (JSON Lines).
  Written once, in input order, atomically (temporary file + rename).
- Journal ``<out>.journal.jsonl``: one JSON line per finished row, appended and flushed per chunk
  while the run goes on. An interrupted run (Ctrl-C, kill -9) leaves at most one torn last line,
  which :func:`read_journal` cuts off. The journal is removed once the output is complete.
- Sidecar ``<out>.meta.json``: versions, bundle fingerprint, settings, counts, timings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import extras
from .tables import json_cell as _json_safe, read_table, write_table

FORMATS = {".csv": "csv", ".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl"}


def output_format(path: str | Path) -> str:
    """The format for an output path, from its extension.

    Raises:
        ValueError: an extension we do not write (the message lists the supported ones).
    """
    ext = Path(path).suffix.lower()
    if ext not in FORMATS:
        raise ValueError(f"cannot write {path}: use one of {', '.join(FORMATS)}")
    if FORMATS[ext] == "parquet":  # fail before a run, not after it: pyarrow is the [parquet] extra
        extras.check("pyarrow", f"{path}: Parquet")
    return FORMATS[ext]


def journal_path(out: str | Path) -> Path:
    """``<out>.journal.jsonl``."""
    return Path(str(out) + ".journal.jsonl")


def meta_path(out: str | Path) -> Path:
    """``<out>.meta.json``."""
    return Path(str(out) + ".meta.json")


def append_journal(path: Path, entries: list[dict]) -> None:
    """Append entries (one JSON line each) and fsync, so a killed run loses at most a torn line."""
    with open(path, "a", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps({k: _json_safe(v) for k, v in e.items()}, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_journal(path: Path) -> tuple[dict | None, list[dict], bool]:
    """Read a journal: ``(header, entries, repaired)``.

    A torn last line (no newline, or not valid JSON) is cut off the file (``repaired=True``).

    Raises:
        ValueError: an invalid line elsewhere (the file is not a masc-run journal).
    """
    if not path.is_file():
        return None, [], False
    data = path.read_bytes()
    repaired = False
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        repaired = True
    lines = data.decode("utf-8").splitlines()
    entries = []
    for i, line in enumerate(lines):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                lines = lines[:-1]
                data = ("\n".join(lines) + "\n").encode() if lines else b""
                repaired = True
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON; not a masc-run journal") from None
    if repaired:
        with open(path, "wb") as f:
            f.write(data)
    if not entries or entries[0].get("type") != "header":
        return None, [], repaired
    return entries[0], entries[1:], repaired


def write_output(path: str | Path, rows: list[dict], columns: list[str]) -> None:
    """Write rows (dicts) with ``columns`` in order, atomically, in the path's format, by the job
    layer's one table writer (:func:`~masc_engine.jobs.tables.write_table`: NaN is ``nan`` in CSV,
    null in JSON Lines and Parquet)."""
    write_table(path, rows, columns, fmt=output_format(path))


def read_output(path: str | Path) -> list[dict]:
    """Read a result file written by :func:`write_output` back into dicts (for resume, the
    report and the int8 gate), with the job layer's one table reader.

    Raises:
        ValueError: an extension we do not write.
        TableError: the file is missing or unparsable (file and line named).
    """
    output_format(path)
    return read_table(path, what="scores").rows
