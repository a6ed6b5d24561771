"""What a command prints cannot drive the terminal: control characters of a hostile cell (ESC
sequences: window title, clipboard writes through OSC 52) are shown as escapes (cli/logs.py
``printable``); the files a command writes keep the cells as they are.
"""

from __future__ import annotations

import csv
import logging

from masc_engine.cli import logs
from masc_engine.cli.eval_tables_cmd import emit
from masc_engine.cli.run_cmd import _print_scores

HOSTILE = "m\x1b]0;owned\x07\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[2J\r\x9b"
SHOWN = "m\\x1b]0;owned\\x07\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x0d\\x9b"


def test_printable_escapes_controls_and_keeps_tabs_newlines_and_text():
    assert logs.printable(HOSTILE) == SHOWN
    assert logs.printable("a\tb\nc ünï — 日本") == "a\tb\nc ünï — 日本"


def test_print_scores_shows_a_hostile_method_as_escapes(tmp_path, capsys):
    out = tmp_path / "o.csv"
    with open(out, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(
            [["row_index", "key", "method", "cp", "pf", "status"], [1, "k1", HOSTILE, 0.5, 0.1, "ok"]]
        )
    _print_scores(str(out))
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed and SHOWN[:22] in printed


def test_masc_eval_prints_escapes_but_writes_the_cells(tmp_path, capsys):
    emit(f"method\n{HOSTILE}\n", str(tmp_path / "t.csv"))
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and SHOWN in printed
    assert (tmp_path / "t.csv").read_bytes().decode("utf-8") == f"method\n{HOSTILE}\n"


def test_library_log_lines_show_escapes(capsys):
    handler = logs.show_library_log()
    try:
        logging.getLogger("masc_engine.test").warning("cell %s", HOSTILE)
        assert f"cell {SHOWN}" in capsys.readouterr().err
    finally:
        logging.getLogger(logs.LIBRARY_LOGGER).removeHandler(handler)


def test_an_error_line_quoting_a_cell_shows_escapes(tmp_path):
    """The ``Error:`` line of a command (a ClickException whose message quotes the user's cell)."""
    from click.testing import CliRunner

    from masc_engine.cli.logs import PrintableCommand

    import click

    @click.command(cls=PrintableCommand)
    def cmd() -> None:
        raise click.ClickException(f"cell {HOSTILE}")

    out = CliRunner().invoke(cmd, [])
    assert out.exit_code == 1 and f"Error: cell {SHOWN}" in out.output and "\x1b" not in out.output


def test_every_command_prints_its_errors_through_printable():
    from masc_engine.cli import cache_cmd, eval_cmd, export_cmd, rank_cmd, report_cmd, run_cmd, serve_cmd

    for m in (cache_cmd, eval_cmd, export_cmd, rank_cmd, report_cmd, run_cmd, serve_cmd):
        assert isinstance(m.main, logs.PrintableErrors), m.__name__
