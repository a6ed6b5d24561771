"""``masc-report``: one self-contained HTML page from a masc-run score file."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .logs import PrintableCommand

from ..jobs.tables import DEFAULT_MAX_PAIRS_BYTES


@click.command(cls=PrintableCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("scores", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--out",
    "-o",
    "out_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="HTML file to write (default: <scores>.report.html beside the score file).",
)
@click.option(
    "--within-column",
    default=None,
    help="Column telling within-subject from cross-subject pairs (with --within-value, or a boolean "
    "column: 1/0, true/false, yes/no, within/cross, same/different).",
)
@click.option(
    "--within-value",
    default=None,
    help="Rows whose --within-column equals this are within-subject; all others cross-subject.",
)
@click.option(
    "--method-column",
    default="method",
    show_default=True,
    help="Column grouping rows into methods, in order of first appearance, then the pooled row "
    "(absent, or an empty cell: the pooled row only).",
)
@click.option(
    "--top",
    "top_k",
    type=click.IntRange(0, 1000),
    default=5,
    show_default=True,
    help="Best and worst pairs shown per score.",
)
@click.option("--title", default=None, help="Page title (default: MaSC report: <file name>).")
@click.option(
    "--image-root",
    "image_roots",
    type=click.Path(file_okay=False),
    multiple=True,
    help="Folder the report may read images from, besides the score file's folder (repeatable; "
    "symlinks leading out of these folders are not followed; any other image is shown as "
    '"not shown: outside the allowed folders"). The first is also the folder relative '
    "ref_image/out_image paths are resolved against (default: the folder of the pairs CSV "
    "recorded in <scores>.meta.json).",
)
@click.option(
    "--thumb-size",
    type=click.IntRange(16, 1024),
    default=144,
    show_default=True,
    help="Longest side of the thumbnails, pixels.",
)
@click.option(
    "--n-resamples",
    type=click.IntRange(1, 100000),
    default=1000,
    show_default=True,
    help="Bootstrap resamples of the confidence intervals.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option(
    "--max-scores-mb",
    type=click.FloatRange(0.001, 1e7),
    default=DEFAULT_MAX_PAIRS_BYTES / 2**20,
    show_default=True,
    help="Largest score file, MiB, checked before it is read (every row is held in "
    "memory; masc-run's --max-pairs-mb rule).",
)
def main(
    scores,
    out_path,
    within_column,
    within_value,
    method_column,
    top_k,
    title,
    image_roots,
    thumb_size,
    n_resamples,
    seed,
    max_scores_mb,
) -> None:
    """Write a self-contained HTML report (summary, per-method means with 95% CIs, distributions,
    within- vs cross-subject histograms with AUC, best and worst pairs with thumbnails) of SCORES,
    a masc-run output (.csv, .parquet, .jsonl)."""
    from ..report import ReportOptions, write_report
    from .logs import show_library_log

    show_library_log()
    if within_value is not None and not within_column:
        raise click.UsageError("--within-value needs --within-column")
    out_path = out_path or str(Path(scores).with_name(Path(scores).name + ".report.html"))
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    opts = ReportOptions(
        title=title,
        method_column=method_column,
        within_column=within_column,
        within_value=within_value,
        top_k=top_k,
        thumb_px=thumb_size,
        n_resamples=n_resamples,
        seed=seed,
        image_root=image_roots[0] if image_roots else None,
        image_roots=tuple(image_roots[1:]),
        max_scores_bytes=int(max_scores_mb * 2**20),
    )
    from ..errors import MascEngineError

    try:
        write_report(scores, out_path, opts)
    except (ValueError, OSError, MascEngineError) as e:  # MissingDependencyError: Parquet without pyarrow
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":
    sys.exit(main())
