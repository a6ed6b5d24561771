"""What the library logs, shown on the terminal: one handler, installed by each command's main.

The library reports progress through module loggers (``logging.getLogger(__name__)`` under the
``masc_engine`` logger: the export's stage lines, certification steps, TensorRT builds) and
configures no handler, so a program that imports it decides what is shown. A command installs
:func:`show_library_log`: records at INFO and above, written as their message alone (the lines
masc-export has always printed), to stderr, and other libraries' warnings once each, naming their
logger (a library's module-level ``logging.warning()`` would otherwise install a second handler
that doubles every line). masc-serve configures logging its own way
(``--log-level``, timestamps) and installs no handler of this module.
"""

from __future__ import annotations

import logging
import re
import sys
from contextlib import contextmanager
from typing import Any

import click

#: The logger every library module's logger sits under.
LIBRARY_LOGGER = "masc_engine"

#: C0 controls but tab and newline, DEL, and C1 controls: what a cell of a hostile pairs file (a
#: method name, a key, a path) would carry to drive the user's terminal: ESC and CSI / OSC
#: sequences (window title, clipboard writes through OSC 52, colours, cursor moves), a carriage
#: return that overwrites the line, BEL.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    r"""``text`` with every terminal control character (:data:`_CONTROLS`) shown as its ``\xNN``
    escape (ESC as ``\x1b``), so a line a command prints cannot drive the terminal; tabs and
    newlines are kept."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def echo(message: Any = None, **kwargs: Any) -> None:
    """``click.echo`` of :func:`printable` text: how every command prints (a file it writes keeps
    the cells as they are)."""
    click.echo(None if message is None else printable(str(message)), **kwargs)


def secho(message: Any = None, **kwargs: Any) -> None:
    """``click.secho`` of :func:`printable` text (the style click adds after is the command's own)."""
    click.secho(None if message is None else printable(str(message)), **kwargs)


class PrintableErrors:
    """Mixed into a click command or group: the ``Error:`` line of a :class:`click.ClickException`
    raised while it runs (its message may quote a cell or a header of the user's file) goes through
    :func:`printable` too."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a ClickException leaves with its message made printable."""
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except click.ClickException as e:
            # click types message Final; it is a plain attribute, rewritten here to keep the
            # exception and its class (a UsageError keeps its exit code 2 and usage line)
            e.message = printable(e.message)  # type: ignore[misc]
            raise


class PrintableCommand(PrintableErrors, click.Command):
    """A click command whose error line is printable (:class:`PrintableErrors`)."""


class PrintableGroup(PrintableErrors, click.Group):
    """A click group whose subcommands' error lines are printable (:class:`PrintableErrors`)."""


class PrintableFormatter(logging.Formatter):
    """``%(message)s`` lines passed through :func:`printable`."""

    def format(self, record: logging.LogRecord) -> str:
        """The record's line, terminal controls escaped."""
        return printable(super().format(record))


class TerminalHandler(logging.StreamHandler):
    """A ``logging.StreamHandler`` writing ``%(message)s`` lines to the stream it was pointed at
    (:func:`terminal_stream`), else to ``sys.stderr`` as it is when each record is written (click's
    test runner and pytest replace it between commands)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)
        self._target = None
        self.setFormatter(PrintableFormatter("%(message)s"))

    @property
    def stream(self):
        return self._target if self._target is not None else sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        self._target = value


class _OtherLoggers(logging.Filter):
    """Passes the records of loggers outside :data:`LIBRARY_LOGGER` (the library's have their own handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != LIBRARY_LOGGER and not record.name.startswith(LIBRARY_LOGGER + ".")


def _root_handler() -> None:
    """A handler on the root logger for other libraries' warnings, shown as ``<logger> <LEVEL>: line``.

    Without one, the first module-level ``logging.warning()`` of a library (ONNX Runtime's
    quantizer makes one) runs ``logging.basicConfig()``, whose handler then printed every
    masc_engine record a second time (``INFO:masc_engine...:``), since they propagate to the root.
    Installed only on a root logger without handlers: that is when ``basicConfig()`` would run,
    and a program's own handler there would otherwise show each warning twice.
    """
    root = logging.getLogger()
    if root.handlers:  # a program that configured logging (or this handler, installed before) decides
        return
    handler = TerminalHandler()
    handler.setLevel(logging.WARNING)
    handler.addFilter(_OtherLoggers())
    handler.setFormatter(PrintableFormatter("%(name)s %(levelname)s: %(message)s"))
    root.addHandler(handler)


def show_library_log(level: int = logging.INFO) -> TerminalHandler:
    """Show the library's records at ``level`` and above as one line each on stderr (installed
    once: a second call returns the handler already there), and other libraries' warnings once
    each (:func:`_root_handler`). Returns the library's handler."""
    _root_handler()
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
