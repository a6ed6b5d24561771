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

import errno
import json
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from .. import extras
from ..errors import MascEngineError
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


# ---------------------------------------------------------------------- faults on the output side


class OutputWriteError(MascEngineError):
    """A result file (output, journal, sidecar, lock, maps) cannot be written: a full disk, a
    read-only filesystem, no permission. One line: the file, the cause, what to do."""

    def __init__(self, path: str | Path, what: str, e: OSError):
        code = errno.errorcode.get(e.errno or 0, "")
        cause = f"{e.strerror or e}" + (f" ({code})" if code else "")
        hint = {errno.ENOSPC: "free space", errno.EDQUOT: "free space", errno.EROFS: "make it writable or choose another --out",
                errno.EACCES: "fix its permissions or choose another --out",
                errno.EPERM: "fix its permissions or choose another --out"}.get(e.errno, "fix the cause")
        then = (", then run the same command again (the rows finished so far are kept in the journal)"
                if what != "lock file" else "")
        super().__init__(f"cannot write the {what} {path}: {cause}; {hint}{then}")
        self.path, self.errno = str(path), e.errno


@contextmanager
def output_errors(path: str | Path, what: str):
    """Turn an ``OSError`` raised in the block while writing ``path`` into :class:`OutputWriteError`."""
    try:
        yield
    except OSError as e:
        raise OutputWriteError(getattr(e, "filename", None) or path, what, e) from None


def write_meta(path: str | Path, meta: dict) -> None:
    """Write the sidecar atomically (temporary file + rename; the temporary file is removed if the
    write fails)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------- one writer per output


class OutputBusyError(MascEngineError):
    """Another process holds the output's lock (one writer per output)."""


def lock_path(out: str | Path) -> Path:
    """``<out>.lock``: the output's lock file, holding its writer's pid, host and start time."""
    return Path(str(out) + ".lock")


class OutputLock:
    """An exclusive lock on an output for one run (``filelock``: ``flock`` on ``<out>.lock``),
    taken without waiting. The holder writes its pid, host and start time into the lock file,
    so a second writer can name it; the lock file is removed on release (a killed holder's lock
    is released by the kernel, and its stale file is taken over by the next run).

    Raises (on enter):
        OutputBusyError: another process holds it (the message names the holder).
        OutputWriteError: the lock file cannot be created (read-only folder, no permission).
    """

    def __init__(self, out: str | Path):
        self.path = lock_path(out)
        self.out = Path(out)
        self._lock = None

    def __enter__(self) -> "OutputLock":
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.path), timeout=0)
        try:
            lock.acquire()
        except Timeout:  # (a TimeoutError, hence an OSError: caught first)
            raise OutputBusyError(f"{self.out} is being written by {self._holder()} (lock {self.path}); "
                                  "wait for that run to finish, or choose another --out") from None
        except OSError as e:
            raise OutputWriteError(getattr(e, "filename", None) or self.path, "lock file", e) from None
        self._lock = lock
        with output_errors(self.path, "lock file"):
            with open(self.path, "r+", encoding="utf-8") as f:
                f.truncate()
                json.dump({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, f)
        return self

    def _holder(self) -> str:
        try:
            h = json.loads(self.path.read_text(encoding="utf-8"))
            return f"masc-run pid {h['pid']} on {h['host']} (since {h['started']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self.path.unlink(missing_ok=True)  # while held: a run waiting on the old file retries on a new one
            self._lock.release()
            self._lock = None


# ---------------------------------------------------------------------- what a rerun compares


class SettingsChangedError(MascEngineError):
    """A rerun's settings differ from those of the results already at ``--out``: nothing is
    re-scored or erased unless asked (``--overwrite``)."""


def _shown(v) -> str:
    if v is None or v is False:
        return "unset"
    if v is True:
        return "set"
    return str(v)


def settings_diff(old: dict, new: dict) -> list[str]:
    """``"--stripper: regex -> none"`` for each setting whose value differs (keys of either;
    ``None`` and ``False`` read ``unset``, ``True`` reads ``set``)."""
    return [f"{k}: {_shown(old.get(k))} -> {_shown(new.get(k))}" for k in dict.fromkeys([*old, *new])
            if old.get(k) != new.get(k)]
