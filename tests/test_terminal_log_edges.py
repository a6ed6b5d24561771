"""Terminal lines at their edges, pinned by values (cli/logs.py).

What these pin: every C0 control but tab and newline, DEL and every C1 control is shown as its
two-digit escape while the first printable characters past each range are kept; nested
``terminal_stream`` blocks each give the library's lines back to the stream of the block around
them; another library's warning, shown by the root handler under its logger's name, is escaped
too; the library's own warnings are shown once, by its handler alone.
"""

from __future__ import annotations

import io
import logging

import pytest

from masc_engine.cli import logs


def test_each_control_range_is_escaped_and_its_neighbours_kept():
    assert logs.printable("\x00\x08\t\n\x0b\x0c\x1f ") == "\\x00\\x08\t\n\\x0b\\x0c\\x1f "
    assert logs.printable("~\x7f\x80\x9f\xa0") == "~\\x7f\\x80\\x9f\xa0"


@pytest.fixture
def handlers(monkeypatch):
    """The library's handler, installed on a root logger without handlers; removed after."""
    lib = logging.getLogger(logs.LIBRARY_LOGGER)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(lib, "level", lib.level)
    handler = logs.show_library_log()
    yield handler
    lib.removeHandler(handler)


def test_nested_streams_give_the_lines_back_to_the_outer_block(handlers, capsys):
    outer, inner = io.StringIO(), io.StringIO()
    log = logging.getLogger("masc_engine.export.stages")
    with logs.terminal_stream(outer):
        with logs.terminal_stream(inner):
            log.info("one")
        log.info("two")
    log.info("three")
    assert (outer.getvalue(), inner.getvalue(), capsys.readouterr().err) == ("two\n", "one\n", "three\n")


def test_another_librarys_warning_is_escaped(handlers, capsys):
    logging.getLogger("onnxruntime").warning("cell m\x1b]0;owned\x07")
    assert capsys.readouterr().err == "onnxruntime WARNING: cell m\\x1b]0;owned\\x07\n"


def test_the_librarys_own_warnings_are_shown_once_as_their_message(handlers, capsys):
    """The root handler passes other libraries' records only: the library's warnings, the
    ``masc_engine`` logger's own included, reach the terminal through its handler alone."""
    logging.getLogger("masc_engine").warning("top-level warning")
    logging.getLogger("masc_engine.export.stages").warning("stage warning")
    assert capsys.readouterr().err == "top-level warning\nstage warning\n"
