"""Where a process's time goes: opt-in per-stage timers (``MASC_PROFILE_STAGES``).

With the environment variable ``MASC_PROFILE_STAGES`` set to a file path, the stages the engine
already goes through (bundle hashing, session creation / compilation per graph, each graph's runs,
decoding, preprocessing, heads, output writing) add their seconds and call counts here, and the
process writes them as JSON to that path when it exits (with the process's start time, so that a
caller can tell the start-up, interpreter and imports, from the rest). Unset (the default), every
timer is a no-op: nothing is measured and nothing is written.

Stages timed on threads that overlap (decoding beside inference) each count their own seconds, so
the stages can sum to more than the wall time; ``wall_s`` is the process's own.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

#: Environment variable naming the JSON file the stage split is written to at exit.
ENV_VAR = "MASC_PROFILE_STAGES"

_LOCK = threading.Lock()
_TOTALS: dict[str, list[float]] = {}
_MARKS: dict[str, float] = {}
_IMPORTED = time.time()
_registered = False


def enabled() -> bool:
    """Whether ``MASC_PROFILE_STAGES`` names a file (read on each call: tests may set it)."""
    return bool(os.environ.get(ENV_VAR))


def add(name: str, seconds: float, calls: int = 1) -> None:
    """Add ``seconds`` (wall, float) and ``calls`` to stage ``name``; registers the exit writer."""
    global _registered
    with _LOCK:
        t = _TOTALS.setdefault(name, [0.0, 0])
        t[0] += seconds
        t[1] += calls
        if not _registered:
            atexit.register(write)
            _registered = True


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the ``with`` block as stage ``name`` when profiling is on; a no-op otherwise."""
    if not enabled():
        yield
        return
    t = time.perf_counter()
    try:
        yield
    finally:
        add(name, time.perf_counter() - t)


def timed(name: str) -> Callable[[F], F]:
    """Decorator: each call of the function is timed as stage ``name`` (:func:`stage`)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if not enabled():
                return fn(*args, **kwargs)
            with stage(name):
                return fn(*args, **kwargs)

        return cast(F, inner)

    return wrap


def mark(name: str) -> None:
    """Record the wall-clock time (epoch seconds) of the first ``name`` event when profiling is on."""
    if enabled():
        with _LOCK:
            _MARKS.setdefault(name, time.time())


def process_start() -> float | None:
    """The process's start, epoch seconds, from ``/proc`` (Linux; 10 ms resolution), else None."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 (starttime), counted after the command's closing paren
        # The age from /proc/uptime (10 ms), not btime + ticks: btime is whole seconds and put the
        # start up to 1 s off, more than a small job's start-up.
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def snapshot() -> dict[str, Any]:
    """The split so far: ``stages`` (name -> ``{"s": seconds, "calls": n}``), ``marks`` (epoch
    seconds), ``process_start``, ``clock_imported`` (this module's import, epoch seconds) and
    ``wall_s`` (process start, else import, to now)."""
    start = process_start()
    with _LOCK:
        stages = {k: {"s": round(v[0], 4), "calls": int(v[1])} for k, v in sorted(_TOTALS.items())}
        marks = dict(_MARKS)
    now = time.time()
    return {
        "pid": os.getpid(),
        "process_start": start,
        "clock_imported": _IMPORTED,
        "ended": now,
        "wall_s": round(now - (start if start is not None else _IMPORTED), 4),
        "marks": marks,
        "stages": stages,
    }


def write(path: str | Path | None = None) -> Path | None:
    """Write :func:`snapshot` as JSON to ``path`` (default: ``$MASC_PROFILE_STAGES``); None when
    neither is set. Failures to write are ignored (a profile never fails a run)."""
    target = path or os.environ.get(ENV_VAR)
    if not target:
        return None
    try:
        Path(target).write_text(json.dumps(snapshot(), indent=1) + "\n")
    except OSError:
        return None
    return Path(target)


def reset() -> None:
    """Forget every stage and mark (tests)."""
    with _LOCK:
        _TOTALS.clear()
        _MARKS.clear()
