"""Result files of the pairs job (``masc-run``): format by extension, an append-only journal for resume, and the
metadata sidecar.

- Output formats: ``.csv`` (default), ``.parquet`` (pyarrow, the ``[parquet]`` extra), ``.jsonl`` / ``.ndjson`` (JSON Lines).
  Written once, in input order, atomically (temporary file + rename).
- Journal ``<out>.journal.jsonl`` (:class:`Journal`): a header (the settings fingerprint and
  identity, the input, the earlier runs' records), then one JSON line per finished row and one run
  record per chunk, appended and flushed while the run goes on. An interrupted run (Ctrl-C, kill
  -9) leaves at most one torn last line, which :func:`read_journal` cuts off. The journal is
  removed once the output is complete. :func:`resume` reads what earlier runs left at an output
  (:class:`PriorWork`); :class:`RunRecord` is one run's figures.
- Sidecar ``<out>.meta.json`` (:func:`write_meta`): versions, bundle fingerprint, settings, counts,
  timings.

The journal and the sidecar are only ever regular files of their own: one that is a symbolic
link or not a regular file (a FIFO, a folder) is refused before it is read or written
(:class:`SidecarError`), and they are opened without following links, so a repair or an append
never reaches a file outside the run.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from pathlib import Path

from .. import extras
from ..errors import MascEngineError
from .reuse import DamagedResultsError as DamagedResultsError
from .reuse import SettingsChangedError as SettingsChangedError
from .reuse import SidecarError as SidecarError
from .reuse import check_input, check_output, parse_journal, reusable
from .tables import TableError, json_cell as _json_safe, open_fresh, read_table, write_table

if TYPE_CHECKING:
    from filelock import BaseFileLock

logger = logging.getLogger(__name__)

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


#: The most bytes of a ``<out>.meta.json`` read; a larger one is unreadable (not a masc-run sidecar).
MAX_META_BYTES = 64 * 2**20


def check_sidecar(path: str | Path, what: str) -> bool:
    """Whether ``path`` exists as a regular file (False: absent), never following a link.

    Raises:
        SidecarError: it is a symbolic link or not a regular file.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISREG(mode):
        return True
    kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
    raise SidecarError(f"the {what} {path} is {kind}: nothing was read or written; remove it or choose another --out")


def _open_nofollow(path: str | Path, flags: int, what: str) -> int:
    """``os.open`` without following a link (a link raced in after :func:`check_sidecar` fails)."""
    check_sidecar(path, what)
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)


def append_journal(path: Path, entries: list[dict]) -> None:
    """Append entries (one JSON line each) and fsync, so a killed run loses at most a torn line."""
    fd = _open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "journal")
    with open(fd, "a", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps({k: _json_safe(v) for k, v in e.items()}, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_journal(path: Path) -> tuple[dict | None, list[dict], bool]:
    """Read a journal: ``(header, entries, repaired)``.

    A torn last line (no newline, or not valid JSON) is cut off the file (``repaired=True``);
    every other line is checked (jobs/reuse.py :func:`~masc_engine.jobs.reuse.parse_journal`).

    Raises:
        SidecarError: the journal is a symbolic link, not a regular file, or not masc-run's (it
            does not begin with masc-run's header).
        DamagedResultsError: a line elsewhere is not UTF-8 text or not a JSON object.
    """
    if not check_sidecar(path, "journal"):
        return None, [], False
    with open(_open_nofollow(path, os.O_RDONLY, "journal"), "rb") as f:
        data = f.read()
    entries, kept, repaired = parse_journal(path, data)
    if repaired:
        with open(_open_nofollow(path, os.O_WRONLY, "journal"), "wb") as f:
            f.write(kept)
            f.truncate()
    if not entries:
        return None, [], repaired
    return entries[0], entries[1:], repaired


def write_output(path: str | Path, rows: list[dict], columns: list[str]) -> None:
    """Write rows (dicts) with ``columns`` in order, atomically, in the path's format, by the job
    layer's one table writer (:func:`~masc_engine.jobs.tables.write_table`: NaN is ``nan`` in CSV,
    null in JSON Lines and Parquet)."""
    write_table(path, rows, columns, fmt=output_format(path))


def read_output(path: str | Path, max_bytes: int | None = None, budget_option: str = "") -> list[dict]:
    """Read a result file written by :func:`write_output` back into dicts (for resume, the
    report and the int8 gate), with the job layer's one table reader; ``max_bytes`` (None: none)
    is the byte budget the reader checks, its file size and rows (``budget_option`` names it).

    Raises:
        ValueError: an extension we do not write.
        TableError: the file is missing or unparsable (file and line named).
    """
    output_format(path)
    return read_table(path, what="scores", max_bytes=max_bytes, budget_option=budget_option).rows


# ---------------------------------------------------------------------- faults on the output side


class OutputWriteError(MascEngineError):
    """A result file (output, journal, sidecar, lock, maps) cannot be written: a full disk, a
    read-only filesystem, no permission. One line: the file, the cause, what to do."""

    def __init__(self, path: str | Path, what: str, e: OSError):
        code = errno.errorcode.get(e.errno or 0, "")
        cause = f"{e.strerror or e}" + (f" ({code})" if code else "")
        hint = {
            errno.ENOSPC: "free space",
            errno.EDQUOT: "free space",
            errno.EROFS: "make it writable or choose another --out",
            errno.EACCES: "fix its permissions or choose another --out",
            errno.EPERM: "fix its permissions or choose another --out",
        }.get(e.errno or 0, "fix the cause")  # no errno: no hint
        then = (
            ", then run the same command again (the rows finished so far are kept in the journal)"
            if what != "lock file"
            else ""
        )
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
    """Write the sidecar atomically (:func:`write_text_atomic`)."""
    check_sidecar(path, "sidecar")
    write_text_atomic(path, json.dumps(meta, indent=2, default=str) + "\n")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through ``<path>.partial``, then rename it over ``path``:
    a reader sees the old file or the new one, never half of one. The temporary file is created
    afresh without following a link (one planted at that fixed name is removed, never written
    through, so nothing outside the asked path is written) and removed if the write fails.

    Raises:
        OSError: the folder cannot be written (callers name the output: :func:`output_errors`).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    try:
        with open_fresh(tmp) as f:  # (a link there is removed, never written through)
            f.write(text)
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
        self._lock: BaseFileLock | None = None

    def __enter__(self) -> "OutputLock":
        from filelock import FileLock, Timeout

        lock = FileLock(str(self.path), timeout=0)
        try:
            lock.acquire()
        except Timeout:  # (a TimeoutError, hence an OSError: caught first)
            raise OutputBusyError(
                f"{self.out} is being written by {self._holder()} (lock {self.path}); "
                "wait for that run to finish, or choose another --out"
            ) from None
        except OSError as e:
            raise OutputWriteError(getattr(e, "filename", None) or self.path, "lock file", e) from None
        self._lock = lock
        with output_errors(self.path, "lock file"):
            with open(self.path, "r+", encoding="utf-8") as f:
                f.truncate()
                json.dump(
                    {
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    },
                    f,
                )
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


def _shown(v) -> str:
    if v is None or v is False:
        return "unset"
    if v is True:
        return "set"
    return str(v)


def settings_diff(old: dict, new: dict) -> list[str]:
    """``"--stripper: regex -> none"`` for each setting whose value differs (keys of either;
    ``None`` and ``False`` read ``unset``, ``True`` reads ``set``)."""
    return [
        f"{k}: {_shown(old.get(k))} -> {_shown(new.get(k))}"
        for k in dict.fromkeys([*old, *new])
        if old.get(k) != new.get(k)
    ]


# ---------------------------------------------------------------------- resume records


class Journal:
    """The resume records of one output, ``<out>.journal.jsonl``.

    Each chunk appends its rows (tagged with the run's id, ``_run``) and then its run's figures
    (a :class:`RunRecord`), flushed and fsynced, so a killed run loses at most one torn line and
    its figures stay on record. Every write fault is an :class:`OutputWriteError`.

    Args:
        out: the output file the journal belongs to.
    """

    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.path = journal_path(out)

    def read(self) -> tuple[dict | None, list[dict], bool]:
        """``(header, entries, repaired)`` (:func:`read_journal`; a torn last line is cut off the file)."""
        with output_errors(self.path, "journal"):
            return read_journal(self.path)

    def start(self, header: dict, reused: list[dict]) -> None:
        """Replace the journal with ``header`` (``type: header`` added) and the rows reused from
        a complete earlier output."""
        with output_errors(self.path, "journal"):
            self.path.unlink(missing_ok=True)
            append_journal(self.path, [{"type": "header", **header}])
            append_journal(self.path, reused)

    def append(self, rows: list[dict], run: RunRecord) -> None:
        """One chunk's rows, tagged with the run, then the run's figures so far."""
        with output_errors(self.path, "journal"):
            append_journal(self.path, [{**r, "_run": run.run_id} for r in rows] + [run(False)])

    def remove(self) -> None:
        """Drop the journal (the output is complete)."""
        with output_errors(self.path, "journal"):
            self.path.unlink(missing_ok=True)

    def rows_saved(self) -> int:
        """Finished rows the journal holds (what a rerun will not score again)."""
        return sum("row_index" in e for e in read_journal(self.path)[1])


def runs_of(entries: list[dict]) -> list[dict]:
    """The runs recorded in a journal, each with ``rows_scored`` counted from the rows it journaled.

    Each chunk appends its rows, then its run's figures; a fault (a full disk, a kill) can cut
    that write anywhere, so the last record can miss rows that did reach the journal, or be
    missing. The rows carry their run's id (``_run``): counting them is the journal's truth."""
    last: dict = {}
    for e in entries:
        if e.get("type") == "run":
            last[e.get("run")] = {k: v for k, v in e.items() if k != "type"}
    counts = Counter(e["_run"] for e in entries if e.get("type") != "run" and "_run" in e)
    for run, n in counts.items():
        last.setdefault(run, {"run": run, "completed": False})["rows_scored"] = n
    return [last[k] for k in sorted(last, key=lambda r: (r is None, r if isinstance(r, int) else 0))]


def next_run_id(runs: list[dict]) -> int:
    """The id of the run after ``runs`` (1 for the first)."""
    return max([int(r["run"]) for r in runs if isinstance(r.get("run"), int)] or [0]) + 1


@dataclass
class PriorWork:
    """What earlier runs left at an output.

    Attributes:
        done: reusable result rows by ``row_index`` (their ``row_key`` matches this input's).
        earlier_runs: the earlier runs' records (the sidecar's ``runs``).
        next_run: this run's id.
        repaired: a torn last journal line was cut off.
    """

    done: dict
    earlier_runs: list
    next_run: int
    repaired: bool = False


#: Settings whose change adds or drops metric columns only (masc-run ``--metrics``, ``--embedder``).
_METRIC_SETTINGS = ("--metrics", "--embedder ", "result schema")


def _changed(what: str, old: dict | None, new: dict) -> SettingsChangedError:
    diff = settings_diff(old, new) if old else []
    # The columns follow from --metrics: where it differs, the metric names say it without them.
    shown = [d for d in diff if not (d.startswith("result schema") and any(x.startswith("--metrics") for x in diff))]
    said = "; ".join(shown) if diff else "their settings fingerprint differs (written by another masc-engine version?)"
    hint = _metric_hint(old, new, diff) if old else ""
    return SettingsChangedError(
        f"{what} made with other settings ({said}): nothing was scored or erased; "
        f"{hint}--overwrite replaces them, or choose another --out"
    )


def _metric_hint(old: dict, new: dict, diff: list[str]) -> str:
    """What to do when only the metric set differs: the metrics the output holds and this run
    does not ask for (rerunning with them resumes it), and, for added ones, that --overwrite with
    the earlier run's --cache-dir runs only their encoders."""
    if not diff or not all(d.startswith(_METRIC_SETTINGS) for d in diff):
        return ""
    # a sidecar is input: a --metrics entry that is not text names no metric
    texts = [s.get("--metrics") for s in (old, new)]
    names = [{m for m in (t if isinstance(t, str) else "").split(",") if m} for t in texts]
    hint = ""
    if names[0] - names[1]:
        hint += (
            f"they hold {', '.join(sorted(names[0] - names[1]))}, which this run does not ask for "
            "(the same --metrics and --embedder as before resume them); "
        )
    if names[1] - names[0]:
        hint += "with the earlier run's --cache-dir, --overwrite runs only the added metrics' encoders; "
    return hint


def read_meta(out: str | Path) -> dict | None:
    """An output's sidecar, or None (absent, unreadable, larger than :data:`MAX_META_BYTES`,
    nested too deep to parse, not an object).

    Raises:
        SidecarError: the sidecar is a symbolic link or not a regular file.
    """
    path = meta_path(out)
    if not check_sidecar(path, "sidecar"):
        return None
    try:
        with open(_open_nofollow(path, os.O_RDONLY, "sidecar"), "rb") as f:
            data = f.read(MAX_META_BYTES + 1)
        meta = None if len(data) > MAX_META_BYTES else json.loads(data.decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return meta if isinstance(meta, dict) else None


def resume(
    journal: Journal, fingerprint: str, identity: dict, keys: list[str], input_path: str, overwrite: bool = False
) -> PriorWork:
    """Read what earlier runs left at ``journal.out`` (the journal of an interrupted run, else a
    complete output), refuse results of other settings unless ``overwrite``, and start this
    run's journal (its header and the reused rows).

    Args:
        fingerprint, identity: this run's settings (``RunSettings.fingerprint`` / ``identity``).
        keys: this input's ``row_key`` per row (1-based row ``i`` is ``keys[i - 1]``).
        input_path: the input file, recorded (resolved) in the header and compared with the
            input the results there were made from (jobs/reuse.py :func:`~masc_engine.jobs.reuse.check_input`).

    Raises:
        SettingsChangedError: results there were made with other settings or from another
            pairs file (the message names what differs), or the output is not a masc-run output;
            nothing is changed then.
        DamagedResultsError: (a SettingsChangedError) the journal or the output cannot be reused
            as it is (jobs/reuse.py: a line that is not text or JSON, a row without its
            ``row_index``, ``row_key`` or ``status``, a truncated output); ``overwrite`` replaces it.
        OutputWriteError: the journal cannot be read or written.
        SidecarError: the journal or the sidecar is a symbolic link or not a regular file, or the
            journal is not masc-run's (refused even with ``overwrite``).
    """
    out = journal.out
    input_path = os.path.realpath(input_path)
    check_sidecar(meta_path(out), "sidecar")  # before anything is read or written
    try:
        header, entries, repaired = journal.read()
    except DamagedResultsError:
        if not overwrite:
            raise
        header, entries, repaired = {}, [], False  # (replaced below, as --overwrite asks)
    lines_j = [(n + 2, e) for n, e in enumerate(entries) if e.get("type") != "run"]  # line 1: the header
    rows_j = [e for _, e in lines_j]
    if header is not None and not overwrite:
        held = f"{journal.path} holds {len(rows_j)} rows of an interrupted run"
        if header.get("fingerprint") != fingerprint:
            raise _changed(held, header.get("identity"), identity)
        check_input(held, header.get("input"), input_path)
        earlier = list(header.get("earlier_runs") or []) + runs_of(entries)
        done = reusable(rows_j, keys, lambda n: f"{journal.path}, line {lines_j[n][0]}")
        return PriorWork(done, earlier, next_run_id(earlier), repaired)
    done, earlier = {}, []
    if out.exists() and not overwrite:
        meta = read_meta(out)
        if meta is None:
            raise SettingsChangedError(
                f"{out} exists and is not a masc-run output (no readable "
                f"{meta_path(out).name}): nothing was written; --overwrite replaces it, "
                "or choose another --out"
            )
        if meta.get("fingerprint") != fingerprint:
            raise _changed(f"{out} holds results", meta.get("identity"), identity)
        check_input(f"{out} holds results", meta.get("input"), input_path)
        done, earlier = _reused_output(out, keys), list(meta.get("runs") or [])
    elif overwrite and (header is not None or out.exists()):
        logger.warning("masc-run: --overwrite: the results at %s are replaced when this run completes", out)
    journal.start(
        {"fingerprint": fingerprint, "identity": identity, "input": input_path, "earlier_runs": earlier},
        list(done.values()),
    )
    return PriorWork(done, earlier, next_run_id(earlier), repaired)


def _reused_output(out: Path, keys: list[str]) -> dict[int, dict]:
    """The rows of the finished output ``out`` this input may reuse (jobs/reuse.py checks).

    Raises:
        DamagedResultsError: the output cannot be read back, lacks a column masc-run writes,
            ends mid-row, or a row lacks its ``row_index``, ``row_key`` or ``status``.
    """
    output_format(out)
    try:
        table = read_table(out, what="scores")
    except TableError as e:
        raise DamagedResultsError(
            f"{e.detail or e}; its results cannot be reused: nothing was "
            "scored or erased; --overwrite scores every row afresh, or choose another --out"
        ) from None
    check_output(out, table.columns)
    return reusable(table.rows, keys, table.where)


class RunRecord:
    """One run's figures, journaled after each chunk (:meth:`Journal.append`) and written into the
    sidecar's ``runs``.

    Args:
        run_id: the run's id (:attr:`PriorWork.next_run`).
        t0: its start (``time.time()``).
        runner (Executor): the executor, whose ``stats()`` are the counters.
        executor: ``local`` or ``ray``.
        reused: rows taken from earlier runs.

    Attributes:
        scored: rows scored by this run so far.
    """

    def __init__(self, run_id: int, t0: float, runner, executor: str, reused: int):
        self.run_id, self.t0, self.runner, self.executor, self.reused = run_id, t0, runner, executor, reused
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
        self.scored = 0

    def __call__(self, completed: bool) -> dict:
        """The record now (``type: run``); the executor's counters beyond the scorer's (the
        segmenter's) are added when it reports them."""
        st = self.runner.stats()
        sec = time.time() - self.t0
        rec = {
            "type": "run",
            "run": self.run_id,
            "started": self.started,
            "seconds": round(sec, 3),
            "rows_scored": self.scored,
            "rows_reused": self.reused,
            "images_encoded": st.get("images_encoded", 0),
            "cache_hits": st.get("cache_hits", 0),
            "lost_workers": st.get("lost_workers", 0),
            "executor": self.executor,
            "completed": completed,
            "pairs_per_second": round(self.scored / sec, 3) if sec > 0 else None,
        }
        rec.update({k: st[k] for k in MASK_COUNTERS if k in st})
        return rec


#: Counters of a run with a segmenter (jobs/segmasks.py), recorded beside the scorer's.
MASK_COUNTERS = ("masks_segmented", "mask_cache_hits", "segmenter_images_encoded")
