"""``masc-rank``: Finer-Personalization Rank (arXiv 2512.19026), generated images as queries
against an identity-labelled gallery of real images; mAP and CMC top-1/top-5 per method and class.

A thin shell over :mod:`masc_engine.jobs.rank` (the protocol; the tie rule is in
:mod:`masc_engine.metrics.retrieval`, the encoder manifest format in :mod:`masc_engine.jobs.rank_encoders`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .logs import PrintableCommand, echo

from .options import (
    io_workers_option,
    load_scorer,
    load_segmenter,
    scorer_config,
    scorer_options,
    segmenter_config,
    segmenter_options,
)


@click.command(cls=PrintableCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("queries_csv", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--gallery",
    "-g",
    "gallery_csv",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Gallery CSV: image, identity (mask, class optional); paths relative to its folder.",
)
@click.option(
    "--bundle",
    "-b",
    default=None,
    type=click.Path(exists=True, file_okay=False),
    help="Bundle from masc-export (the SigLIP2 encoder). Not needed with --encoder-manifest.",
)
@click.option(
    "--similarity",
    type=click.Choice(["global", "maxcos"]),
    default="global",
    show_default=True,
    help="global: cosine of pooled embeddings (all patches visible); maxcos: CP's masked max-cosine "
    "of query patches to gallery patches.",
)
@click.option(
    "--oracle",
    is_flag=True,
    help="Use the gallery images themselves as queries (method 'oracle'), each against the rest "
    "of the gallery. Give no QUERIES_CSV then.",
)
@click.option(
    "--encoder-manifest",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="JSON manifest of an ONNX image encoder ([B, D] embeddings) replacing SigLIP2 (global similarity only).",
)
@click.option(
    "--level",
    type=click.Choice(["identity", "class"]),
    default="identity",
    show_default=True,
    help="Relevance: same identity (instance level) or same class (category level).",
)
@click.option("--no-masks", is_flag=True, help="maxcos: use all query patches even when a query has a mask.")
@click.option(
    "--out",
    "-o",
    "out_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Per-query CSV (default: <queries stem>.rank.csv, or gallery stem with --oracle).",
)
@click.option(
    "--summary",
    "summary_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Summary CSV (default: the --out path with .summary.csv).",
)
@scorer_options
@segmenter_options
@io_workers_option()
@click.option(
    "--no-progress", is_flag=True, help="Hide the progress bar (drawn on stderr only when stderr is a terminal)."
)
def main(
    queries_csv,
    gallery_csv,
    bundle,
    similarity,
    oracle,
    encoder_manifest,
    level,
    no_masks,
    out_path,
    summary_path,
    io_workers,
    no_progress,
    **scorer_params,
) -> None:
    """Rank the gallery for every query of QUERIES_CSV (columns image, identity, method; mask and
    class optional; other columns carried through), or for every gallery image with --oracle, and
    print mAP and CMC top-1/top-5 per method, per class and overall. With --segmenter (maxcos), a
    query without a mask gets the segmenter's, prompted by its object_name or class cell."""
    from ..errors import MascEngineError
    from ..jobs.rank import run_rank, write_rank_outputs
    from .logs import show_library_log

    show_library_log()
    config = scorer_config(scorer_params)  # the same option groups as masc-run and masc-serve
    seg_config = segmenter_config(scorer_params, config)
    from ..jobs.rank_encoders import EngineEncoder, OnnxEmbeddingEncoder

    if oracle and queries_csv:
        raise click.UsageError("--oracle uses the gallery images as queries: give no QUERIES_CSV")
    if not oracle and not queries_csv:
        raise click.UsageError("give QUERIES_CSV, or --oracle")
    if (bundle is None) == (encoder_manifest is None):
        raise click.UsageError("give exactly one of --bundle and --encoder-manifest")
    if seg_config is not None and (similarity != "maxcos" or no_masks):
        raise click.UsageError(
            "--segmenter makes query masks, which only --similarity maxcos (without --no-masks) reads"
        )
    if encoder_manifest and similarity == "maxcos":
        raise click.UsageError(
            "--similarity maxcos needs patch tokens from a bundle; an encoder manifest "
            "gives one embedding per image (use --similarity global)"
        )
    stem = Path(gallery_csv if oracle else queries_csv).stem + (".oracle" if oracle else "")
    out_path = out_path or f"{stem}.rank.csv"
    summary_path = summary_path or str(Path(out_path).with_suffix("")) + ".summary.csv"
    for p in (out_path, summary_path):  # --out out/rank.csv on a fresh checkout
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    try:
        encoder: OnnxEmbeddingEncoder | EngineEncoder
        if encoder_manifest:
            encoder = OnnxEmbeddingEncoder(
                encoder_manifest,
                provider=config.provider or "cpu",
                intra_op_threads=config.intra_op_threads,
                batch_size=config.batch_size,
            )
        else:
            scorer = load_scorer(bundle, config)
            encoder = EngineEncoder(scorer)
        segmenter = load_segmenter(seg_config, None if encoder_manifest else scorer)
        report = run_rank(
            gallery_csv,
            encoder,
            queries_csv=None if oracle else queries_csv,
            oracle=oracle,
            similarity=similarity,
            level=level,
            use_masks=not no_masks,
            io_workers=io_workers,
            progress=not no_progress,
            segmenter=segmenter,
        )
        write_rank_outputs(report, out_path, summary_path)
    except (MascEngineError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    for line in report.lines():
        echo(line)
    echo(f"per-query results written to {out_path}; summary to {summary_path}")


if __name__ == "__main__":
    sys.exit(main())
