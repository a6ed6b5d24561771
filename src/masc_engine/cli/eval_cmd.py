"""masc-eval: agreement of MaSC scores with human ratings, and ORIDa-style AUC.

A thin shell: files read by the job layer (:mod:`masc_engine.jobs.tables`), joined by
:mod:`masc_engine.cli.eval_tables`, statistics from :mod:`masc_engine.metrics.agreement`; prints a
table, optionally writes CSV/JSON.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ..jobs.tables import TableError, parse_bool, parse_number, read_table
from ..metrics import agreement as ag
from .eval_tables import DataError, join_scores_ratings


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------


def read_rows(path: str | Path) -> tuple[list[dict[str, Any]], list[int] | None]:
    """Rows of a CSV/TSV, JSON Lines, JSON (array of objects) or Parquet file, read by the job
    layer's :func:`~masc_engine.jobs.tables.read_table`.

    Returns:
        ``(rows, lines)``: ``lines[i]`` is the 1-based source line of row i (CSV/TSV: the
        header is line 1; JSON Lines: the line of the object), or None for JSON arrays and
        Parquet (errors then say "row i").

    Raises:
        TableError: the file is missing or unparsable (file and line named).
    """
    t = read_table(path, what="input")
    return t.rows, t.lines


def _score_status_column(rows: list[dict[str, Any]], score_column: str, status_column: str | None) -> str | None:
    """masc-run writes one status per score (``cp_status``, ``pf_status``): with the default
    ``status`` column, filter on the score's own status when the file has it."""
    own = f"{score_column}_status"
    if status_column == "status" and rows and own in rows[0]:
        return own
    return status_column


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


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def _clean(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.3f}"
    return str(v)


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


def _check_out(out: str | None) -> str | None:
    if out is not None and Path(out).suffix.lower() not in (".csv", ".tsv", ".json"):
        raise click.BadParameter(f"{out}: must end in .csv, .tsv or .json", param_hint="--out")
    return out


def _write_out(out: str, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    p = Path(out)
    suffix = p.suffix.lower()
    if suffix == ".json":
        doc = dict(meta)
        doc["rows"] = [{k: _clean(v) for k, v in r.items()} for r in rows]
        p.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    elif suffix in (".csv", ".tsv"):
        with p.open("w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()), delimiter="\t" if suffix == ".tsv" else ",")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if _clean(v) is None else v) for k, v in r.items()})
    else:
        raise click.BadParameter(f"{out}: --out must end in .csv, .tsv or .json", param_hint="--out")


# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------


class _DefaultGroup(click.Group):
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

    SCORES is a masc-run score file (.csv, .tsv, .jsonl, .json array, .parquet).
    Needs the 'eval' extra: pip install -e '.[eval]' in a checkout (scipy, krippendorff, scikit-learn).
    """


_common = [
    click.option("--score-column", default="cp", show_default=True, help="Metric column in SCORES (cp or pf)."),
    click.option(
        "--status-column",
        default="status",
        show_default=True,
        help="Only rows whose status is an --ok-status are used; ignored if the column is absent. Empty string "
        "disables. Left at 'status' with a masc-run file, the score's own <score-column>_status is used, so "
        "a PF defined on a row whose CP is undefined still counts.",
    ),
    click.option(
        "--ok-status",
        "ok_statuses",
        multiple=True,
        default=("ok",),
        show_default=True,
        help="Status value(s) whose rows are used; repeatable (e.g. add no_background for CP, whose CP is valid).",
    ),
    click.option("--n-resamples", default=1000, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples."),
    click.option("--confidence", default=0.95, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True)),
    click.option("--seed", default=0, show_default=True, type=int, help="Bootstrap seed (results are deterministic per seed)."),
    click.option(
        "--out",
        type=click.Path(dir_okay=False),
        default=None,
        callback=lambda ctx, param, v: _check_out(v),
        help="Also write the rows to FILE (.csv, .tsv or .json).",
    ),
]


def _with_common(f: Any) -> Any:
    for opt in reversed(_common):
        f = opt(f)
    return f


@main.command("agreement")
@click.argument("scores", type=click.Path(exists=True, dir_okay=False))
@click.option("--ratings", required=True, type=click.Path(exists=True, dir_okay=False), help="Human rating file (format described above).")
@click.option(
    "--rating-column",
    "rating_columns",
    multiple=True,
    help="Human rating column; repeat for several raters/groups. Default: same name as --score-column.",
)
@click.option("--key", default="key", show_default=True, help="Join column(s), comma-separated for a composite key (e.g. method,key).")
@click.option(
    "--method-column",
    default="method",
    show_default=True,
    help="Per-method rows from this column (SCORES first, else RATINGS); empty string = pooled only.",
)
@click.option("--scale", default=None, help="Rating scale, e.g. 0-4 or 0,1,2,3,4. Default: the observed ratings. Off-scale ratings are errors.")
@click.option(
    "--level",
    "levels",
    multiple=True,
    type=click.Choice(ag.LEVELS),
    help="Krippendorff levels to report; repeatable. Default: interval and ordinal.",
)
@click.option(
    "--mapping",
    default="quantile",
    show_default=True,
    type=click.Choice(ag.MAPPINGS),
    help="How the metric is put on the rating scale for alpha (see below).",
)
@click.option(
    "--human-agg",
    default="per_rater",
    show_default=True,
    type=click.Choice(ag.HUMAN_AGGS),
    help="Several rating columns: average per-rater statistics, or one joint alpha / rho vs the mean rating.",
)
@_with_common
@click.pass_context
def agreement_cmd(
    ctx: click.Context,
    scores: str,
    ratings: str,
    rating_columns: tuple[str, ...],
    key: str,
    method_column: str,
    scale: str | None,
    levels: tuple[str, ...],
    mapping: str,
    human_agg: str,
    score_column: str,
    status_column: str,
    ok_statuses: tuple[str, ...],
    n_resamples: int,
    confidence: float,
    seed: int,
    out: str | None,
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
    try:
        score_rows, score_lines = read_rows(scores)
        rating_rows, rating_lines = read_rows(ratings)
        status_column = _score_status_column(score_rows, score_column, status_column)
        scale_vals = _parse_scale(scale)
        joined = join_scores_ratings(
            score_rows,
            rating_rows,
            score_column=score_column,
            rating_columns=list(rating_columns) or None,
            key=key,
            method_column=method_column or None,
            status_column=status_column or None,
            ok_status=ok_statuses,
            scale=scale_vals,
            scores_name=scores,
            ratings_name=ratings,
            scores_lines=score_lines,
            ratings_lines=rating_lines,
        )
    except (TableError, DataError) as exc:
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    src = ctx.get_parameter_source("method_column")
    if method_column and src == click.core.ParameterSource.COMMANDLINE and joined.keys and all(m is None for m in joined.methods):
        raise click.UsageError(f"--method-column {method_column!r}: no such column (or all empty) in {scores} or {ratings}")
    c = joined.counts
    if c["units"] == 0:
        raise click.ClickException(
            f"no units to evaluate: {c['score_rows']} score rows ({c['not_ok']} not ok, {c['missing_score']} without a score, "
            f"{c['unrated']} without a rating), {c['rating_rows']} rating rows ({c['unscored']} without a score). "
            f"Check --key ({key}) and the file contents."
        )
    levels = levels or ("interval", "ordinal")
    try:
        rows = ag.agreement_rows(
            joined,
            levels=levels,
            mapping=mapping,
            categories=scale_vals,
            human_agg=human_agg,
            n_resamples=n_resamples,
            confidence=confidence,
            seed=seed,
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None

    pct = f"{confidence * 100:g}%"
    click.echo(
        f"scores: {scores} [{score_column}]   ratings: {ratings} [{', '.join(joined.rating_columns)}]   "
        f"mapping: {mapping}   raters: {human_agg if len(joined.rating_columns) > 1 else 'single'}"
    )
    click.echo(
        f"units: {c['units']} joined; skipped {c['not_ok']} not ok, {c['missing_score']} without score, "
        f"{c['unrated']} unrated, {c['unscored']} rating rows without score"
    )
    click.echo(f"CI: {pct} percentile bootstrap over units, {n_resamples} resamples, seed {seed}")
    click.echo("")
    headers = ["method", "n", *[f"alpha {lv} [{pct} CI]" for lv in levels], f"spearman [{pct} CI]"]
    body = [
        [r["method"], str(r["n"]), *[_fmt_ci(r, f"alpha_{lv}") for lv in levels], _fmt_ci(r, "spearman")] for r in rows
    ]
    click.echo(render_table(headers, body))
    notes = [f"  {r['method']}: {r['note']}" for r in rows if r["note"]]
    if notes:
        click.echo("\nnotes:")
        click.echo("\n".join(notes))
    if out:
        meta = {
            "command": "agreement",
            "scores": scores,
            "ratings": ratings,
            "score_column": score_column,
            "rating_columns": list(joined.rating_columns),
            "key": key,
            "ok_statuses": list(ok_statuses),
            "levels": list(levels),
            "mapping": mapping,
            "human_agg": human_agg,
            "scale": scale_vals,
            "confidence": confidence,
            "n_resamples": n_resamples,
            "seed": seed,
            "counts": c,
        }
        _write_out(out, rows, meta)
        click.echo(f"\nwrote {out}")


@main.command("auc")
@click.argument("scores", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--within-column",
    required=True,
    help="Column that is true for within-subject pairs (true/false, 1/0, yes/no, within/cross).",
)
@click.option("--group-column", default=None, help="Optional grouping column for per-group rows (e.g. environment).")
@_with_common
def auc_cmd(
    scores: str,
    within_column: str,
    group_column: str | None,
    score_column: str,
    status_column: str,
    ok_statuses: tuple[str, ...],
    n_resamples: int,
    confidence: float,
    seed: int,
    out: str | None,
) -> None:
    """ROC AUC of a score for within- vs cross-subject pairs (ORIDa protocol).

    Each SCORES row is one (reference, output) pair; --within-column says
    whether both show the same subject. Higher scores should mean "same".
    The CI is a bootstrap stratified by class. Rows whose status is not an
    --ok-status are skipped; an ok row with a missing or non-numeric score or flag is an
    error naming the file and line.
    """
    try:
        rows, lines = read_rows(scores)
    except (TableError, DataError) as exc:
        raise click.ClickException(str(exc)) from None
    status_column = _score_status_column(rows, score_column, status_column)
    present = set().union(*(r.keys() for r in rows)) if rows else set()
    for col in (score_column, within_column):
        if rows and col not in present:  # a header problem, not a row's: say so once, up front
            raise click.ClickException(f"{scores}: no column {col!r} (columns: "
                                       f"{', '.join(sorted(map(str, present)))})")
    vals: list[float] = []
    within: list[bool] = []
    groups: list[str | None] = []
    skipped = 0
    for i, row in enumerate(rows):
        where = f"{scores}, {'line' if lines else 'row'} {lines[i] if lines else i + 1}"
        if status_column and status_column in row and str(row[status_column]).strip() not in ok_statuses:
            skipped += 1
            continue
        for col in (score_column, within_column):
            if col not in row:
                raise click.ClickException(f"{where}: no column {col!r} (columns: {', '.join(map(str, row.keys()))})")
        try:
            v = parse_number(row[score_column])
        except ValueError:
            raise click.ClickException(f"{where}: score column {score_column!r} value {row[score_column]!r} is not a number") from None
        if v is None:
            raise click.ClickException(f"{where}: score column {score_column!r} is empty")
        try:
            w = parse_bool(row[within_column])
        except ValueError as exc:
            raise click.ClickException(f"{where}: column {within_column!r}: {exc}") from None
        vals.append(v)
        within.append(w)
        groups.append(None if not group_column else (None if row.get(group_column) in (None, "") else str(row[group_column])))
    if not vals:
        raise click.ClickException(f"{scores}: no usable rows ({skipped} skipped by status)")
    if group_column and all(g is None for g in groups):
        raise click.UsageError(f"--group-column {group_column!r}: no such column (or all empty) in {scores}")
    table = ag.auc_rows(vals, within, groups if group_column else None, n_resamples=n_resamples, confidence=confidence, seed=seed)
    pct = f"{confidence * 100:g}%"
    click.echo(f"scores: {scores} [{score_column}]   within: {within_column}   skipped {skipped} rows by status")
    click.echo(f"CI: {pct} percentile bootstrap stratified by class, {n_resamples} resamples, seed {seed}")
    click.echo("")
    body = [[r["group"], str(r["n"]), str(r["n_within"]), str(r["n_cross"]), _fmt_ci(r, "auc")] for r in table]
    click.echo(render_table(["group", "n", "within", "cross", f"AUC [{pct} CI]"], body))
    notes = [f"  {r['group']}: {r['note']}" for r in table if r["note"]]
    if notes:
        click.echo("\nnotes:")
        click.echo("\n".join(notes))
    if out:
        meta = {
            "command": "auc",
            "scores": scores,
            "score_column": score_column,
            "within_column": within_column,
            "group_column": group_column,
            "confidence": confidence,
            "n_resamples": n_resamples,
            "seed": seed,
            "ok_statuses": list(ok_statuses),
            "skipped_not_ok": skipped,
        }
        _write_out(out, table, meta)
        click.echo(f"\nwrote {out}")


if __name__ == "__main__":  # pragma: no cover
    main()
