"""masc-eval table and masc-eval compare: the paper's score tables from a masc-run score file.

A thin shell over :mod:`masc_engine.jobs.eval_tables` (units, means, paired differences) and
:mod:`masc_engine.jobs.eval_format` (Markdown, LaTeX, CSV); registered on masc-eval's group by
:mod:`masc_engine.cli.eval_cmd`.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any

import click

from .logs import echo, secho

from ..jobs import eval_format as fm
from ..jobs import eval_tables as et
from ..jobs.evaluation import DataError
from ..jobs.results import write_text_atomic
from ..jobs.tables import TableError, read_table

__all__ = ["table_cmd", "compare_cmd", "warn_random_weights", "emit", "parse_metrics", "sample_options"]


def parse_metrics(text: str | None) -> tuple[str, ...]:
    """``--metrics``: a comma list of columns, or ``all`` (every registered metric column of the
    file); None or empty: ``()``."""
    if not text or not text.strip():
        return ()
    return tuple(c.strip() for c in text.split(",") if c.strip())


def warn_random_weights(scores: str) -> str | None:
    """Print the random-weights line for the bundle the score file's sidecar records (stderr,
    ``WARNING: ...``, as every command prints it) and return it; None when not random."""
    line = et.random_weights_line(et.scores_sidecar(scores))
    if line:
        secho(f"WARNING: {line}", fg="yellow", err=True)
    return line


def _format_of(fmt: str | None, out: str | None) -> str:
    if fmt:
        return fmt
    if out:
        suffix = Path(out).suffix.lower()
        if suffix not in fm.SUFFIX_FORMATS:
            raise click.BadParameter(
                f"{out}: end it in {', '.join(fm.SUFFIX_FORMATS)} or give --format", param_hint="--out"
            )
        return fm.SUFFIX_FORMATS[suffix]
    return "md"


def emit(text: str, out: str | None) -> None:
    """Print ``text``; with ``out`` also write it there (atomically, its folder made if need be)."""
    echo(text, nl=False)
    if out:
        p = Path(out)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(p, text)
        echo(f"\nwrote {out}")


def sample_options(status_help: str, ok_help: str, seed_help: str) -> list[Callable[[Any], Any]]:
    """The click options of :class:`~masc_engine.jobs.evaluation.SampleOptions`, shared by every
    masc-eval command: ``--status-column``, ``--ok-status`` (repeatable, into ``ok_statuses``),
    ``--n-resamples``, ``--confidence`` and ``--seed``, with the defaults of the dataclass.

    Args:
        status_help: the command's help text of ``--status-column``.
        ok_help: the command's help text of ``--ok-status``.
        seed_help: the command's help text of ``--seed``.

    Returns:
        The five decorators, in the order the help lists them.
    """
    return [
        click.option("--status-column", default="status", show_default=True, help=status_help),
        click.option("--ok-status", "ok_statuses", multiple=True, default=("ok",), show_default=True, help=ok_help),
        click.option(
            "--n-resamples", default=1000, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples."
        ),
        click.option(
            "--confidence", default=0.95, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True)
        ),
        click.option("--seed", default=0, show_default=True, type=int, help=seed_help),
    ]


_OPTIONS = [
    click.option(
        "--metrics",
        default="all",
        show_default=True,
        help="Metric columns, comma-separated, or 'all': every registered metric column of SCORES "
        "(cp, pf, the --baselines columns, clip_i, clip_t, dino, dino_s8, dinov2, plug-ins).",
    ),
    click.option(
        "--method-column",
        default="method",
        show_default=True,
        help="The method of each row; empty string: the pooled row only.",
    ),
    click.option("--subject-column", default="subject", show_default=True, help="The subject of each row."),
    click.option(
        "--key",
        default="subject,prompt",
        show_default=True,
        help="Columns naming a unit within a method: what --average-references averages over, what compare pairs on.",
    ),
    click.option(
        "--average-references",
        is_flag=True,
        help="Average the rows sharing the method and --key into one unit (one generated image "
        "scored against several references).",
    ),
    *sample_options(
        status_help="As in agreement: a column's own <column>_status when the file has it, else this.",
        ok_help="Status value(s) whose rows count; repeatable.",
        seed_help="Bootstrap seed.",
    ),
    click.option(
        "--format",
        "fmt",
        type=click.Choice(fm.FORMATS),
        default=None,
        help="md, latex or csv; default from --out's suffix (.md, .tex, .csv), else md.",
    ),
    click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the table to FILE."),
]


def _apply(f):
    for opt in reversed(_OPTIONS):
        f = opt(f)
    return f


def _units(scores: str, metrics: str | None, **kw: Any) -> et.ScoreUnits:
    try:
        opts = et.TableOptions(metrics=parse_metrics(metrics), **kw)
        return et.score_units(read_table(scores, what="scores"), opts)
    except (TableError, DataError) as exc:
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _notes(u: et.ScoreUnits, random_line: str | None) -> list[str]:
    o = u.options
    notes = [
        f"{o.confidence * 100:g}% percentile bootstrap over units, {o.n_resamples} resamples, seed {o.seed}; "
        "a group of one unit has no interval (n=1: no CI)"
    ]
    if o.average_references:
        notes.append(
            f"units: rows sharing the method and ({', '.join(o.key)}) averaged "
            f"({int(u.rows_per_unit.sum())} rows into {u.rows_per_unit.size} units)"
        )
    left = [
        f"{m}: {u.skipped[m]} not ok" + (f", {u.missing[m]} empty" if u.missing[m] else "")
        for m in u.metrics
        if u.skipped[m] or u.missing[m]
    ]
    if left:
        notes.append("rows left out: " + "; ".join(left))
    if random_line:
        notes.append(f"WARNING: {random_line}")
    return notes


@click.command("table")
@click.argument("scores", type=click.Path(exists=True, dir_okay=False))
@click.option("--by-subject", is_flag=True, help="One row per subject and method instead of per method.")
@_apply
def table_cmd(scores: str, by_subject: bool, fmt: str | None, out: str | None, metrics: str, **options: Any) -> None:
    """Per-method means with bootstrap CIs of every metric column (the paper's main table).

    One row per method (order of first appearance), then the pooled row;
    with --by-subject one row per subject and method. Each cell is the mean
    and its percentile-bootstrap CI over the group's units; a group of one
    unit has no CI and the cell says 'n=1: no CI'.

    Example: masc-eval table out/scores.csv --format latex --out table.tex
    """
    fmt = _format_of(fmt, out)
    u = _units(scores, metrics, **options)
    try:
        t = et.means_table(u, by_subject=by_subject)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    line = warn_random_weights(scores)
    headers, body, columns = fm.means_layout(t)
    caption = f"{Path(scores).name}: mean [{u.options.confidence * 100:g}% CI] per " + (
        "subject and method" if by_subject else "method"
    )
    notes = [*_notes(u, line), *fm.means_notes(t)]
    emit(fm.render(fmt, headers, body, notes=notes, caption=caption, rows=t.rows, columns=columns), out)


@click.command("compare")
@click.argument("scores", type=click.Path(exists=True, dir_okay=False))
@click.option("--a", "method_a", default=None, help="First method (the difference is A - B).")
@click.option("--b", "method_b", default=None, help="Second method. Both omitted: the file's two methods.")
@_apply
def compare_cmd(
    scores: str,
    method_a: str | None,
    method_b: str | None,
    fmt: str | None,
    out: str | None,
    metrics: str,
    **options: Any,
) -> None:
    """Paired comparison of two methods: mean difference A - B per metric.

    Units of A and B are paired on --key (default subject,prompt); the CI is
    a paired bootstrap (the same resampled keys for both methods). Rows that
    do not pair (a key scored by one method only, or twice by one method
    without --average-references) are refused in one line.

    Example: masc-eval compare out/scores.csv --a ours --b dreambooth --average-references
    """
    fmt = _format_of(fmt, out)
    u = _units(scores, metrics, **options)
    try:
        t = et.compare_table(u, method_a, method_b)
    except DataError as exc:
        raise click.ClickException(str(exc)) from None
    line = warn_random_weights(scores)
    headers, body, columns = fm.compare_layout(t)
    caption = (
        f"{Path(scores).name}: {t.a} - {t.b}, {t.n_pairs} units paired on "
        f"({', '.join(u.options.key)}), paired bootstrap"
    )
    rows = [{**r, "a": t.a, "b": t.b} for r in t.rows]
    emit(
        fm.render(fmt, headers, body, notes=_notes(u, line), caption=caption, rows=rows, columns=["a", "b", *columns]),
        out,
    )
