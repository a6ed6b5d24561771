"""masc-eval: agreement of MaSC scores with human ratings, and ORIDa-style AUC.

A thin shell over the job layer's :mod:`masc_engine.jobs.evaluation` (files read, scores joined
with ratings, agreement and AUC rows; the statistics are :mod:`masc_engine.metrics.agreement`),
which masc-report shares: prints a table, optionally writes it with the job layer's one table
writer (:func:`~masc_engine.jobs.tables.write_table`: NaN is ``nan`` in CSV / TSV, null in JSON).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from .logs import PrintableGroup, echo

from ..jobs import eval_format as fm
from ..jobs import eval_tables as et
from ..jobs import evaluation as ev
from ..jobs.tables import TableError, read_table, write_table
from ..metrics import agreement as ag
from .eval_tables_cmd import compare_cmd, parse_metrics, sample_options, table_cmd, warn_random_weights

T = TypeVar("T")


# --------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------


def _parse_scale(text: str | None) -> list[float] | None:
    if text is None or not text.strip():
        return None
    t = text.strip()
    try:
        if "," not in t and "-" in t.lstrip("-"):
            lo_s, hi_s = t.lstrip("-").split("-", 1)
            lo = -float(lo_s) if t.startswith("-") else float(lo_s)
            hi = float(hi_s)
            if lo != int(lo) or hi != int(hi) or hi <= lo:
                raise ValueError
            return [float(v) for v in range(int(lo), int(hi) + 1)]
        vals = sorted({float(v) for v in t.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter(f"{text!r}: give integers LO-HI (e.g. 0-4) or a comma list (e.g. 0,1,2,3,4)") from None
    if len(vals) < 2:
        raise click.BadParameter(f"{text!r}: a scale needs at least two values")
    return vals


OUT_SUFFIXES = (".csv", ".tsv", ".json")


def _check_out(out: str | None) -> str | None:
    if out is not None and Path(out).suffix.lower() not in OUT_SUFFIXES:
        raise click.BadParameter(f"{out}: must end in .csv, .tsv or .json", param_hint="--out")
    return out


def _apply(options: Sequence[Callable[[Any], Any]]) -> Callable[[T], T]:
    """A decorator applying click options in list order (first = first in --help)."""

    def deco(f: T) -> T:
        for opt in reversed(options):
            f = opt(f)
        return f

    return deco


def _score_column_help() -> str:
    """The --score-column help, naming the registered scores (runtime/pair_metrics)."""
    from ..runtime.pair_metrics import registered, score_metrics

    scores = ", ".join(m.score_column for m in score_metrics())
    opted = ", ".join(c for m in registered() if m.option == "baselines" for c in m.columns)
    named = ", ".join(c for m in registered() if m.option not in (None, "baselines") for c in m.columns)
    return (
        f"Metric column in SCORES: a score masc-run writes ({scores}), or with --baselines {opted}, "
        f"or asked for by name (masc-run --metrics) {named}."
    )


_COMMON = [
    click.option("--score-column", default="cp", show_default=True, help=_score_column_help()),
    *sample_options(
        status_help="Only rows whose status is an --ok-status are used; ignored if the column is absent. Empty "
        "string disables. Left at 'status' with a masc-run file, the score's own <score-column>_status is used, so "
        "a PF defined on a row whose CP is undefined still counts.",
        ok_help="Status value(s) whose rows are used; repeatable (e.g. add no_background for CP, whose CP is valid).",
        seed_help="Bootstrap seed (results are deterministic per seed).",
    ),
    click.option(
        "--out",
        type=click.Path(dir_okay=False),
        default=None,
        callback=lambda ctx, param, v: _check_out(v),
        help="Also write the rows to FILE (.csv, .tsv or .json; undefined values: nan in CSV/TSV, null in JSON).",
    ),
]

#: masc-eval agreement's own options; with _COMMON (less --out) they are the fields of
#: :class:`~masc_engine.jobs.evaluation.AgreementOptions`.
_AGREEMENT = [
    click.option(
        "--rating-column",
        "rating_columns",
        multiple=True,
        help="Human rating column; repeat for several raters/groups. Default: same name as --score-column.",
    ),
    click.option(
        "--key",
        default="key",
        show_default=True,
        help="Join column(s), comma-separated for a composite key (e.g. method,key).",
    ),
    click.option(
        "--method-column",
        default="method",
        show_default=True,
        help="Per-method rows from this column (SCORES first, else RATINGS); empty string = pooled only.",
    ),
    click.option(
        "--scale",
        default=None,
        callback=lambda ctx, param, v: _parse_scale(v),
        help="Rating scale, e.g. 0-4 or 0,1,2,3,4. Default: the observed ratings. Off-scale ratings are errors.",
    ),
    click.option(
        "--level",
        "levels",
        multiple=True,
        type=click.Choice(ag.LEVELS),
        help="Krippendorff levels to report; repeatable. Default: interval and ordinal.",
    ),
    click.option(
        "--mapping",
        default="quantile",
        show_default=True,
        type=click.Choice(ag.MAPPINGS),
        help="How the metric is put on the rating scale for alpha (see below).",
    ),
    click.option(
        "--human-agg",
        default="per_rater",
        show_default=True,
        type=click.Choice(ag.HUMAN_AGGS),
        help="Several rating columns: average per-rater statistics, or one joint alpha / rho vs the mean rating.",
    ),
]

#: Several metric columns in one table (agreement and auc); without --metrics, --score-column alone.
_MANY = [
    click.option(
        "--metrics",
        default=None,
        help="Metric columns, comma-separated, or 'all' (every registered metric column of SCORES: cp, pf, "
        "the --baselines columns, clip_i, clip_t, dino, dino_s8, dinov2, plug-ins): one block of rows per "
        "column, led by a metric column. Replaces --score-column.",
    ),
    click.option(
        "--format",
        "fmt",
        type=click.Choice(("text", *fm.FORMATS)),
        default="text",
        show_default=True,
        help="How the table is printed: text, md (Markdown), latex or csv.",
    ),
]

#: masc-eval auc's own options (fields of :class:`~masc_engine.jobs.evaluation.AucOptions`).
_AUC = [
    click.option(
        "--within-column",
        required=True,
        help="Column that is true for within-subject pairs (true/false, 1/0, yes/no, within/cross, same/different).",
    ),
    click.option(
        "--within-value",
        default=None,
        help="Rows whose --within-column equals this are within-subject, all others cross-subject "
        "(instead of reading the column as a boolean).",
    ),
    click.option(
        "--group-column", default=None, help="Optional grouping column for per-group rows (e.g. environment)."
    ),
]


def _no_score_column(ctx: click.Context) -> None:
    """--metrics replaces --score-column: both given is a usage error."""
    if ctx.get_parameter_source("score_column") == click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give --metrics or --score-column, not both")


def _evaluate(fn: Callable[..., T], *args: Any) -> T:
    """Run a job-layer evaluation; its errors become one line (exit 1; a bad --key: exit 2)."""
    try:
        return fn(*args)
    except (TableError, ev.DataError) as exc:
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


# --------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------


def _fmt_ci(row: dict[str, Any], prefix: str) -> str:
    v, lo, hi = row[prefix], row[f"{prefix}_low"], row[f"{prefix}_high"]
    if math.isnan(v):
        return "n/a"
    if math.isnan(lo) or math.isnan(hi):
        return f"{v:.3f} [n/a]"
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def render_table(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """Plain-text table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in body]
    return "\n".join(out)


def _echo_notes(rows: list[dict[str, Any]], label: str) -> None:
    notes = [f"  {r['metric'] + ' / ' if 'metric' in r else ''}{r[label]}: {r['note']}" for r in rows if r["note"]]
    if notes:
        echo("\nnotes:")
        echo("\n".join(notes))


def _write(out: str | None, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    if out:
        write_table(out, rows, list(rows[0]), meta=meta)
        echo(f"\nwrote {out}")


def _show(
    fmt: str, headers: list[str], body: list[list[str]], rows: list[dict[str, Any]], label: str, caption: str = ""
) -> None:
    """The table: text (:func:`render_table` and the notes), or Markdown / LaTeX / CSV
    (:func:`masc_engine.jobs.eval_format.render`)."""
    if fmt == "text":
        echo(render_table(headers, body))
        _echo_notes(rows, label)
        return
    lead = (lambda r: f"{r['metric']} / {r[label]}") if rows and "metric" in rows[0] else (lambda r: str(r[label]))
    notes = [f"{lead(r)}: {r['note']}" for r in rows if r["note"]]
    echo(fm.render(fmt, headers, body, notes=notes, caption=caption, rows=rows, columns=list(rows[0])), nl=False)


def _agreement_cells(
    o: ev.AgreementOptions, rows: list[dict[str, Any]], many: bool
) -> tuple[list[str], list[list[str]]]:
    pct = f"{o.confidence * 100:g}%"
    lead = ["metric"] if many else []
    headers = [*lead, "method", "n", *[f"alpha {lv} [{pct} CI]" for lv in o.levels], f"spearman [{pct} CI]"]
    body = [
        [
            *([r["metric"]] if many else []),
            r["method"],
            str(r["n"]),
            *[_fmt_ci(r, f"alpha_{lv}") for lv in o.levels],
            _fmt_ci(r, "spearman"),
        ]
        for r in rows
    ]
    return headers, body


def _echo_agreement(t: ev.AgreementTable, scores: str, ratings: str, fmt: str = "text") -> None:
    o, c = t.options, t.joined.counts
    pct = f"{o.confidence * 100:g}%"
    if fmt == "text":
        echo(
            f"scores: {scores} [{o.score_column}]   ratings: {ratings} [{', '.join(t.joined.rating_columns)}]   "
            f"mapping: {o.mapping}   raters: {o.human_agg if len(t.joined.rating_columns) > 1 else 'single'}"
        )
        echo(
            f"units: {c['units']} joined; skipped {c['not_ok']} not ok, {c['missing_score']} without score, "
            f"{c['unrated']} unrated, {c['unscored']} rating rows without score"
        )
        echo(f"CI: {pct} percentile bootstrap over units, {o.n_resamples} resamples, seed {o.seed}")
        echo("")
    headers, body = _agreement_cells(o, t.rows, False)
    _show(fmt, headers, body, t.rows, "method", f"Agreement of {o.score_column} with {', '.join(o.raters)}")


def _echo_agreement_many(
    rows: list[dict[str, Any]], o: ev.AgreementOptions, scores: str, ratings: str, fmt: str
) -> None:
    """The agreement rows of several metric columns (:func:`masc_engine.jobs.eval_tables.agreement_tables`)."""
    pct = f"{o.confidence * 100:g}%"
    raters = ", ".join(o.rating_columns) or "each metric's own column"
    if fmt == "text":
        echo(
            f"scores: {scores} [{', '.join(dict.fromkeys(r['metric'] for r in rows))}]   ratings: {ratings} "
            f"[{raters}]   mapping: {o.mapping}"
        )
        echo(f"CI: {pct} percentile bootstrap over units, {o.n_resamples} resamples, seed {o.seed}")
        echo("")
    headers, body = _agreement_cells(o, rows, True)
    _show(fmt, headers, body, rows, "method", f"Agreement with human ratings ({raters})")


def _agreement_meta_of(o: ev.AgreementOptions, scores: str, ratings: str) -> dict[str, Any]:
    return {
        "command": "agreement",
        "scores": scores,
        "ratings": ratings,
        "score_column": o.score_column,
        "rating_columns": list(o.rating_columns),
        "key": o.key if isinstance(o.key, str) else ",".join(o.key),
        "ok_statuses": list(o.ok_statuses),
        "levels": list(o.levels),
        "mapping": o.mapping,
        "human_agg": o.human_agg,
        "scale": None if o.scale is None else list(o.scale),
        "confidence": o.confidence,
        "n_resamples": o.n_resamples,
        "seed": o.seed,
    }


def _agreement_meta(t: ev.AgreementTable, scores: str, ratings: str) -> dict[str, Any]:
    return {
        **_agreement_meta_of(t.options, scores, ratings),
        "rating_columns": list(t.joined.rating_columns),
        "counts": t.joined.counts,
    }


def _echo_auc(t: ev.AucTable | list[dict[str, Any]], scores: str, o: ev.AucOptions, fmt: str = "text") -> None:
    """An AUC table: one score column (an :class:`~masc_engine.jobs.evaluation.AucTable`) or the
    rows of several (:func:`masc_engine.jobs.eval_tables.auc_tables`, led by ``metric``)."""
    many = isinstance(t, list)
    rows = t if isinstance(t, list) else t.rows
    pct = f"{o.confidence * 100:g}%"
    if fmt == "text":
        if many:
            echo(
                f"scores: {scores} [{', '.join(dict.fromkeys(r['metric'] for r in rows))}]   within: "
                f"{o.within_column}" + (f" = {o.within_value}" if o.within_value is not None else "")
            )
        elif isinstance(t, ev.AucTable):
            u = t.units
            missing = f", {u.missing} without a score" if u.missing else ""
            echo(
                f"scores: {scores} [{o.score_column}]   within: {o.within_column}"
                + (f" = {o.within_value}" if o.within_value is not None else "")
                + f"   skipped {u.skipped} rows by status{missing}"
            )
        echo(f"CI: {pct} percentile bootstrap stratified by class, {o.n_resamples} resamples, seed {o.seed}")
        echo("")
    body = [
        [
            *([r["metric"]] if many else []),
            r["group"],
            str(r["n"]),
            str(r["n_within"]),
            str(r["n_cross"]),
            _fmt_ci(r, "auc"),
        ]
        for r in rows
    ]
    headers = [*(["metric"] if many else []), "group", "n", "within", "cross", f"AUC [{pct} CI]"]
    _show(fmt, headers, body, rows, "group", "Within- vs cross-subject ROC AUC")


def _auc_meta_of(o: ev.AucOptions, scores: str) -> dict[str, Any]:
    meta = {
        "command": "auc",
        "scores": scores,
        "score_column": o.score_column,
        "within_column": o.within_column,
        "group_column": o.group_column,
        "confidence": o.confidence,
        "n_resamples": o.n_resamples,
        "seed": o.seed,
        "ok_statuses": list(o.ok_statuses),
    }
    if o.within_value is not None:
        meta["within_value"] = o.within_value
    return meta


def _auc_meta(t: ev.AucTable, scores: str) -> dict[str, Any]:
    u = t.units
    meta = {**_auc_meta_of(t.options, scores), "skipped_not_ok": u.skipped}
    if t.options.within_value is not None:  # after skipped_not_ok, as written before
        meta["within_value"] = meta.pop("within_value")
    if u.missing:
        meta["skipped_missing_score"] = u.missing
    return meta


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


class _DefaultGroup(PrintableGroup):
    """``masc-eval SCORES ...`` is short for ``masc-eval agreement SCORES ...``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["agreement", *args]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ImportError as exc:  # the eval extra is missing: one line, not a traceback
            raise click.ClickException(str(exc)) from None


@click.group(cls=_DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Meta-evaluation of MaSC scores (the paper's validation protocols).

    \b
      masc-eval agreement SCORES --ratings RATINGS   agreement with human ratings
      masc-eval SCORES --ratings RATINGS             (same; 'agreement' is the default)
      masc-eval auc SCORES --within-column COL       within- vs cross-subject AUC
      masc-eval table SCORES                         per-method means with CIs, every metric
      masc-eval compare SCORES --a M1 --b M2         paired difference of two methods

    SCORES is a masc-run score file (.csv, .tsv, .jsonl, .json array, .parquet).
    Needs the 'eval' extra: pip install -e '.[eval]' in a checkout (scipy, krippendorff, scikit-learn).
    """
    from .logs import show_library_log

    show_library_log()


@main.command("agreement")
@click.argument("scores", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--ratings",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Human rating file (format described above).",
)
@_apply(_AGREEMENT + _COMMON + _MANY)
@click.pass_context
def agreement_cmd(
    ctx: click.Context, scores: str, ratings: str, out: str | None, metrics: str | None, fmt: str, **options: Any
) -> None:
    """Agreement of a score column with human ratings (DreamBench++ protocol).

    Prints, per method and pooled: n, Krippendorff's alpha (interval and
    ordinal by default) and Spearman's rho, each with a percentile-bootstrap
    CI over units.

    \b
    RATINGS format (CSV/TSV with a header, JSON Lines, or a .json array):
      one row per rated image, a key column matching SCORES, and one numeric
      column per human rater or rater group, on an ordinal scale
      (DreamBench++: 0-4). Empty, NaN or null = not rated.
      key,cp_group1,cp_group2,pf_group1,pf_group2
      dreambooth/live_subject_animal_00_kitten/0,3,4,2,2
    Example: masc-eval scores.csv --ratings human.csv --score-column cp \\
               --rating-column cp_group1 --rating-column cp_group2 --scale 0-4

    Join: inner join on --key; SCORES rows whose status is not an
    --ok-status, empty scores (when there is no status column),
    unrated keys and rating rows without a score are counted and skipped.
    Duplicate keys, missing columns and non-numeric values are errors
    naming the file and line.

    Mapping: alpha compares values, so the metric is first put on the rating
    scale. 'quantile' (default) rank-bins it into the scale's categories so
    its distribution matches the pooled human ratings (fit once on all
    joined units); 'linear' min-max rescales onto the scale's range (rounded
    for ordinal/nominal); 'none' uses the values as they are.
    """
    opts = ev.AgreementOptions(**options)
    if metrics is not None:
        _no_score_column(ctx)
        rows = _evaluate(
            lambda: et.agreement_tables(
                read_table(scores, what="scores"), read_table(ratings, what="ratings"), opts, parse_metrics(metrics)
            )
        )
        warn_random_weights(scores)
        _echo_agreement_many(rows, opts, scores, ratings, fmt)
        meta = {k: v for k, v in _agreement_meta_of(opts, scores, ratings).items() if k != "score_column"}
        _write(out, rows, {**meta, "metrics": list(dict.fromkeys(r["metric"] for r in rows))})
        return
    table = _evaluate(ev.evaluate_agreement, scores, ratings, opts)
    explicit = ctx.get_parameter_source("method_column") == click.core.ParameterSource.COMMANDLINE
    if opts.method_column and explicit and all(m is None for m in table.joined.methods):
        raise click.UsageError(
            f"--method-column {opts.method_column!r}: no such column (or all empty) in {scores} or {ratings}"
        )
    warn_random_weights(scores)
    _echo_agreement(table, scores, ratings, fmt)
    _write(out, table.rows, _agreement_meta(table, scores, ratings))


@main.command("auc")
@click.argument("scores", type=click.Path(exists=True, dir_okay=False))
@_apply(_AUC + _COMMON + _MANY)
@click.pass_context
def auc_cmd(ctx: click.Context, scores: str, out: str | None, metrics: str | None, fmt: str, **options: Any) -> None:
    """ROC AUC of a score for within- vs cross-subject pairs (ORIDa protocol).

    Each SCORES row is one (reference, output) pair; --within-column says
    whether both show the same subject. Higher scores should mean "same".
    The CI is a bootstrap stratified by class. Rows whose status is not an
    --ok-status are skipped; an ok row with a missing or non-numeric score or flag is an
    error naming the file and line (without a status column an empty score is skipped).
    Per-group rows in order of first appearance, then the pooled row
    (--group-column method: per method). --metrics all: one block per
    metric column of SCORES.
    """
    opts = ev.AucOptions(**options)
    if metrics is not None:
        _no_score_column(ctx)
        rows = _evaluate(lambda: et.auc_tables(read_table(scores, what="scores"), opts, parse_metrics(metrics)))
        warn_random_weights(scores)
        _echo_auc(rows, scores, opts, fmt)
        meta = {k: v for k, v in _auc_meta_of(opts, scores).items() if k != "score_column"}
        _write(out, rows, {**meta, "metrics": list(dict.fromkeys(r["metric"] for r in rows))})
        return
    table = _evaluate(ev.evaluate_auc, scores, opts)
    if not table.units.scores.size:
        raise click.ClickException(
            f"{scores}: no usable rows ({table.units.skipped} skipped by status, {table.units.missing} without a score)"
        )
    if opts.group_column and all(g is None for g in table.units.groups or ()):
        raise click.UsageError(f"--group-column {opts.group_column!r}: no such column (or all empty) in {scores}")
    warn_random_weights(scores)
    _echo_auc(table, scores, opts, fmt)
    _write(out, table.rows, _auc_meta(table, scores))


main.add_command(table_cmd)
main.add_command(compare_cmd)

if __name__ == "__main__":  # pragma: no cover
    main()
