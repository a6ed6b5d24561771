"""What the library logs, shown on the terminal: one handler, installed by each command's main.

The library reports progress through module loggers (``logging.getLogger(__name__)`` under the
``masc_engine`` logger: the export's stage lines, certification steps, TensorRT builds) and
configures no handler, so a program that imports it decides what is shown. A command installs
:func:`show_library_log`: records at INFO and above, written as their message alone (the lines
masc-export has always printed), to stderr. masc-serve configures logging its own way
(``--log-level``, timestamps) and installs no handler of this module.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

#: The logger every library module's logger sits under.
LIBRARY_LOGGER = "masc_engine"


class TerminalHandler(logging.StreamHandler):
    """A ``logging.StreamHandler`` writing ``%(message)s`` lines to the stream it was pointed at
    (:func:`terminal_stream`), else to ``sys.stderr`` as it is when each record is written (click's
    test runner and pytest replace it between commands)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)
        self._target = None
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return self._target if self._target is not None else sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        self._target = value


def show_library_log(level: int = logging.INFO) -> TerminalHandler:
    """Show the library's records at ``level`` and above as one line each on stderr (installed
    once: a second call returns the handler already there). Returns the handler."""
    lib = logging.getLogger(LIBRARY_LOGGER)
    lib.setLevel(level)
    for h in lib.handlers:
        if isinstance(h, TerminalHandler):
            return h
    handler = TerminalHandler()
    lib.addHandler(handler)
    return handler


@contextmanager
def terminal_stream(stream):
    """Within the block, the library's lines go to ``stream`` (the terminal, while stderr is
    redirected to a log file: cli/quiet.py); without :func:`show_library_log` installed, nothing
    changes."""
    handlers = [h for h in logging.getLogger(LIBRARY_LOGGER).handlers if isinstance(h, TerminalHandler)]
    saved = [h._target for h in handlers]
    for h in handlers:
        h.flush()
        h._target = stream
    try:
        yield
    finally:
        for h, old in zip(handlers, saved):
            h.flush()
            h._target = old
