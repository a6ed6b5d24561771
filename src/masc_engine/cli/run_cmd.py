"""``masc-run``: score a pairs CSV with a bundle (torch-free)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("pairs_csv", type=click.Path(dir_okay=False))
@click.option("--bundle", "-b", required=True, type=click.Path(file_okay=False), help="Bundle from masc-export.")
@click.option("--out", "-o", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Output CSV (default: <pairs stem>.masc.csv in the current directory).")
@click.option("--provider", default="cpu", show_default=True,
              help="ONNX Runtime execution provider: cpu or cuda. A missing provider is an error.")
@click.option("--stripper", type=click.Choice(["regex", "spacy", "none"]), default="regex", show_default=True,
              help="How the subject is removed from the PF prompt (regex is the paper's).")
@click.option("--batch-size", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Images per vision-tower call.")
@click.option("--chunk-size", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Rows read, decoded and written per step.")
@click.option("--threads", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="ONNX Runtime intra-op threads (0: ONNX Runtime's default).")
@click.option("--io-workers", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Threads decoding images and masks.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def main(pairs_csv, bundle, out_path, provider, stripper, batch_size, chunk_size, threads, io_workers,
         no_progress) -> None:
    """Score every row of PAIRS_CSV (columns ref_image, ref_mask, out_image, out_mask, prompt,
    object_name; other columns are carried through) and print a summary."""
    from ..engine.bundle import RandomWeightsWarning
    from ..errors import MascEngineError
    from ..protocols.pairs import run_pairs_csv
    from ..runtime.scorer import Scorer

    out_path = out_path or f"{Path(pairs_csv).stem}.masc.csv"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RandomWeightsWarning)
            scorer = Scorer(bundle, provider=provider, stripper=stripper, batch_size=batch_size,
                            intra_op_threads=threads or None)
        for w in caught:
            click.secho(f"WARNING: {w.message}", fg="yellow", err=True)
        summary = run_pairs_csv(pairs_csv, scorer, out_path, chunk_size=chunk_size, io_workers=io_workers,
                                progress=not no_progress)
    except MascEngineError as e:
        raise click.ClickException(str(e)) from e
    for line in summary.lines():
        click.echo(line)
    click.echo(f"scores written to {out_path}")


if __name__ == "__main__":
    sys.exit(main())
