"""A quiet terminal for long commands: our stages and progress on screen, library chatter in a log.

The exporter drives torch.onnx, onnxscript, transformers and ONNX Runtime, which print dozens of
lines a user cannot act on (axis-name ``UserWarning``\\ s, "torchvision is not installed. Skipping
torchvision::nms", ``FutureWarning``\\ s, config notes). :func:`libraries_to_log` sends all of it to
a log file: Python warnings, ``logging`` records and whatever is written to file descriptors 1 and
2 (C++ libraries write there directly). Nothing of value is hidden: our own warnings
(``masc_engine.*``) still reach the terminal, errors still raise (the CLI prints them as one line
naming the log), and the caller's summary names the log and how many lines it holds.
"""

from __future__ import annotations

import io
import os
import re
import sys
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .logs import printable, terminal_stream


#: A Python warning as ``warnings.formatwarning`` writes it (``path:line: Category: message``), in
#: this process or in a worker whose stderr is the log (the PyTorch export worker's).
_WARNING_LINE = re.compile(rb"^.*:\d+: [A-Za-z_.]*Warning: ", re.M)
#: Terminal colour codes: ONNX Runtime's logger colours its warnings whether or not it writes to a
#: terminal; a log file keeps the text only.
_ANSI = re.compile(rb"\x1b\[[0-9;]*m")


@dataclass
class LibraryLog:
    """Where library output went, for the command's summary (counts read from what the log got)."""

    path: Path
    lines: int = 0
    warnings: int = 0

    def summary(self) -> str:
        if not self.lines:
            return f"library messages: none (log: {self.path})"
        return (
            f"library messages: {self.lines} lines ({self.warnings} Python warnings) in {self.path} "
            "(nothing there stopped the command)"
        )


def _terminal_stream():
    """The stream that reaches the user once fd 2 points at the log: a duplicate of the real fd 2
    when sys.stderr is it, else sys.stderr itself (click's CliRunner, pytest's capture)."""
    try:
        if sys.stderr.fileno() == 2:
            return os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace"), True
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    return sys.stderr, False


def _ours(category: type, filename: str) -> bool:
    return category.__module__.startswith("masc_engine") or f"{os.sep}masc_engine{os.sep}" in filename


@contextmanager
def libraries_to_log(log_path: str | Path):
    """Within the block, library output goes to ``log_path`` (appended); yields ``(say, log)``.

    ``say(msg)`` prints a line to the terminal; ``log`` is a :class:`LibraryLog` whose counts are
    final once the block ends. Warnings raised by masc_engine itself are shown on the terminal too,
    and so are its logged lines when the command installed cli/logs.py's handler.
    """
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = path.stat().st_size if path.is_file() else 0
    info = LibraryLog(path)
    term, dup = _terminal_stream()
    sys.stdout.flush()
    sys.stderr.flush()
    logf = open(path, "a", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    saved_streams = sys.stdout, sys.stderr

    def say(msg: str) -> None:
        print(printable(msg), file=term, flush=True)

    def show(message, category, filename, lineno, file=None, line=None):
        logf.write(warnings.formatwarning(message, category, filename, lineno, line))
        if _ours(category, filename):
            say(f"WARNING: {message}")

    old_show = warnings.showwarning
    # Progress bars (transformers' "Loading weights", Hugging Face downloads) redraw with carriage
    # returns: in a log file they are noise. huggingface_hub reads this when first imported, here or
    # in the export's torch worker; a value the user set is kept.
    bars = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        for fd in (1, 2):
            os.dup2(logf.fileno(), fd)
        sys.stdout = sys.stderr = logf  # Python-level writers that do not go through fds 1/2
        warnings.showwarning = show
        with terminal_stream(term):  # the library's own lines (cli/logs.py) stay on screen
            yield say, info
    finally:
        if bars is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        warnings.showwarning = old_show
        sys.stdout, sys.stderr = saved_streams
        logf.flush()
        for fd, keep in saved_fds.items():
            os.dup2(keep, fd)
            os.close(keep)
        logf.close()
        if dup:
            term.close()
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read()
        if _ANSI.search(text):
            text = _ANSI.sub(b"", text)
            with open(path, "r+b") as g:
                g.seek(start)
                g.write(text)
                g.truncate()
        info.lines = text.count(b"\n")
        info.warnings = len(_WARNING_LINE.findall(text))  # every process's, counted in the log itself
