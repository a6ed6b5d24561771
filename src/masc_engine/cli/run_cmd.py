"""``masc-run``: score a pairs CSV with a bundle (torch-free), resumably."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..jobs.tables import DEFAULT_MAX_PAIRS_BYTES
from ..runtime.io import default_max_file_bytes
from ..runtime.text import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_PROMPT_TOKENS
from .logs import PrintableCommand, echo, secho, show_library_log
from .options import (
    STORE_SIZE_GB,
    cache_options,
    chunk_size_option,
    embedder_paths,
    exif_option,
    io_workers_option,
    load_embedders,
    load_scorer,
    load_segmenter,
    mask_size_tolerance_option,
    metric_options,
    opted_metrics,
    scorer_config,
    scorer_options,
    segmenter_config,
    segmenter_options,
)


@click.command(cls=PrintableCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("pairs_csv", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--bundle", "-b", required=True, type=click.Path(exists=True, file_okay=False), help="Bundle from masc-export."
)
@click.option(
    "--out",
    "-o",
    "out_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Output file; format by extension: .csv, .parquet, .jsonl or .ndjson (default: <pairs stem>.masc.csv "
    "in the current directory). Rerunning the same command resumes.",
)
@scorer_options
@segmenter_options
@click.option(
    "--save-masks",
    type=click.Path(file_okay=False),
    default=None,
    help="Write each mask the segmenter computed here as a PNG (0/255, usable as a mask file; "
    "DIR/<prompt>/<image>-<key>.png) and add ref_mask_saved / out_mask_saved columns.",
)
@exif_option
@click.option(
    "--paper-filter",
    is_flag=True,
    help="The paper's filtering protocol: drop pairs whose output mask covers < 5% of the image "
    "and all pairs of a reference whose mask covers < 5%.",
)
@click.option(
    "--min-output-mask-frac",
    type=click.FloatRange(0, 1),
    default=None,
    help="Drop a pair whose output mask covers less than this fraction (rows kept with a status).",
)
@click.option(
    "--min-reference-mask-frac",
    type=click.FloatRange(0, 1),
    default=None,
    help="Drop every pair of a reference whose mask covers less than this fraction (ORIDa: 0.005).",
)
@mask_size_tolerance_option
@click.option(
    "--max-prompt-bytes",
    type=click.IntRange(1, 10**7),
    default=DEFAULT_MAX_PROMPT_BYTES,
    show_default=True,
    help="Longest prompt or object_name, UTF-8 bytes, checked before anything is tokenized (masc-serve's "
    "budget): past it the row's status is prompt_too_long / object_name_too_long.",
)
@click.option(
    "--max-prompt-tokens",
    type=click.IntRange(1, 10**7),
    default=DEFAULT_MAX_PROMPT_TOKENS,
    show_default=True,
    help="Longest object_name and stripped prompt in tokens (the text tower reads the "
    "first 64): past it the row's status is prompt_too_long / object_name_too_long.",
)
@click.option(
    "--max-file-mb",
    type=click.FloatRange(0.001, 1e7),
    default=None,
    help="Largest image or mask file, MiB, checked from its size before it is read: past it the row's "
    f"status is file_too_large. Default: 4 bytes a pixel of the pixel budget (Pillow's) plus 16 MiB, "
    f"{default_max_file_bytes() / 2**20:.0f} MiB.",
)
@click.option(
    "--max-pairs-mb",
    type=click.FloatRange(0.001, 1e7),
    default=DEFAULT_MAX_PAIRS_BYTES / 2**20,
    show_default=True,
    help="Largest pairs file, MiB, checked before it is read (every row is held in memory).",
)
@click.option(
    "--baselines",
    is_flag=True,
    help="Add the paper's same-forward-pass baselines: cp_global, cp_mnn, and PF with full / "
    "background / foreground pooling x stripped / unstripped prompt.",
)
@metric_options
@click.option(
    "--save-maps",
    type=click.Path(file_okay=False),
    default=None,
    help="Write per-pair attribution PNGs here (CP: best cosine per reference patch; PF: the "
    "pooling head's background attention) and add cp_map / pf_map columns. Slows the run: 2.6x the "
    "wall time with the tiny bundle (docs/evaluation.md).",
)
@cache_options(
    STORE_SIZE_GB,
    cache_help="Persistent content-keyed cache of patch tokens, text embeddings and the segmenter's masks (shareable).",
    size_help="Bound on the persistent cache's size.",
)
@chunk_size_option
@io_workers_option(" (overlapping inference)")
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Run here, or on a Ray cluster (one scorer per worker slot).",
)
@click.option(
    "--address",
    "ray_address",
    default=None,
    help="Ray cluster address (e.g. ray://head:10001 or auto); default: a local Ray instance.",
)
@click.option(
    "--ray-workers",
    type=click.IntRange(1, 100000),
    default=None,
    help="Ray actors (scorers); default: one per CPU (or GPU with --provider cuda) in the cluster.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace results at --out made with other settings (or a file masc-run did not write) and "
    "score every row afresh. Without it such a run stops, naming what differs.",
)
@click.option("--print-scores", is_flag=True, help="Print each row's key, method, CP, PF and status.")
@click.option(
    "--no-progress", is_flag=True, help="Hide the progress bar (drawn on stderr only when stderr is a terminal)."
)
def main(**params) -> None:
    """Score every row of PAIRS_CSV (columns ref_image, ref_mask, out_image, out_mask, prompt,
    object_name; other columns are carried through) and print a summary. With --segmenter the
    mask columns are optional: a row without a mask gets the segmenter's, prompted by its
    object_name.

    One run writes an output at a time (a second one on the same --out stops at once, naming the
    first); rerunning the same command resumes; a rerun with other settings stops unless
    --overwrite. Every failure is one line on stderr with exit status 1.
    """
    show_library_log()
    config = scorer_config(params)
    seg_config = segmenter_config(params, config)
    if params["save_masks"] and seg_config is None:
        raise click.UsageError("--save-masks writes the segmenter's masks: give --segmenter")
    out_path = params["out_path"] or f"{Path(params['pairs_csv']).stem}.masc.csv"
    try:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)  # --out out/scores.csv on a fresh checkout
    except OSError as e:
        raise click.ClickException(f"cannot create the output folder {Path(out_path).parent}: {e.strerror or e}") from e
    summary = _score(params, config, seg_config, out_path)
    if params["print_scores"]:
        _print_scores(out_path)
    for line in summary.lines():
        echo(line)
    echo(f"scores written to {out_path} (metadata: {out_path}.meta.json)")


def _run_options(p: dict):
    """masc-run's :class:`~masc_engine.jobs.pairs.RunOptions` from its options."""
    from ..jobs.pairs import RunOptions

    return RunOptions(
        chunk_size=p["chunk_size"],
        io_workers=p["io_workers"],
        cache_dir=p["cache_dir"],
        cache_size_limit=int(p["cache_size_gb"] * 2**30),
        executor=p["executor"],
        ray_address=p["ray_address"],
        ray_workers=p["ray_workers"],
        progress=not p["no_progress"],
        overwrite=p["overwrite"],
        max_pairs_bytes=int(p["max_pairs_mb"] * 2**20),
    )


def _score(p: dict, config, seg_config, out_path: str):
    """Load the scorer (and segmenter) and run the job; every failure as one line (exit status 1)."""
    from ..errors import MascEngineError
    from ..jobs.pairs import run_pairs
    from ..jobs.pairs.run import check_embedders

    settings = _run_settings(p)
    bundles = embedder_paths(p["embedder_specs"])
    try:
        check_embedders(settings, bundles, p["executor"])
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    try:
        scorer = load_scorer(p["bundle"], config)
        segmenter = load_segmenter(seg_config, scorer)
        if scorer.certificate is not None:
            secho(
                f"NOTE: {scorer.certificate['claim']} (the gates are in the bundle's manifest and "
                f"{out_path}.meta.json)",
                err=True,
            )
        embedders = load_embedders({k: bundles[k] for k in settings.embedders_needed()})
        return run_pairs(p["pairs_csv"], scorer, out_path, settings, _run_options(p), segmenter, embedders)
    except KeyboardInterrupt:
        from ..jobs.results import Journal

        journal = Journal(out_path)
        echo(
            f"\ninterrupted: {journal.rows_saved()} finished rows are saved in {journal.path}; run the same "
            "command again to score only the rest",
            err=True,
        )
        sys.exit(130)
    except (MascEngineError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:  # an environment fault the job layer did not name (e.g. the cache folder)
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        raise click.ClickException(
            f"masc-run stopped:{where} {e.strerror or e}; finished rows stay in "
            f"{out_path}.journal.jsonl: run the same command again to finish"
        ) from e


def _run_settings(p: dict):
    """masc-run's :class:`~masc_engine.jobs.pairs.RunSettings` from its options."""
    from ..jobs.pairs import RunSettings

    lo_out, lo_ref = p["min_output_mask_frac"], p["min_reference_mask_frac"]
    if p["paper_filter"]:  # the paper's 5% coverage filter, unless a threshold is given
        lo_out = 0.05 if lo_out is None else lo_out
        lo_ref = 0.05 if lo_ref is None else lo_ref
    try:
        return RunSettings(
            exif=p["exif"],
            min_reference_mask_frac=lo_ref,
            min_output_mask_frac=lo_out,
            mask_size_tolerance=p["mask_size_tolerance"],
            baselines=p["baselines"],
            save_maps=str(Path(p["save_maps"]).resolve()) if p["save_maps"] else None,
            save_masks=str(Path(p["save_masks"]).resolve()) if p["save_masks"] else None,
            max_prompt_bytes=p["max_prompt_bytes"],
            max_prompt_tokens=p["max_prompt_tokens"],
            max_file_bytes=None if p["max_file_mb"] is None else int(p["max_file_mb"] * 2**20),
            metrics=opted_metrics(p["metrics"]),
        )
    except ValueError as e:
        raise click.ClickException(str(e)) from None


def _print_scores(out_path: str) -> None:
    from ..jobs.results import read_output

    rows = read_output(out_path)
    label = next((c for c in ("key", "out_image") if c in rows[0]), "row_index") if rows else "row_index"
    echo(f"{'row':>5}  {label:<34} {'method':<22} {'CP':>8} {'PF':>8}  status")
    for r in rows:
        cp, pf = (
            float(r["cp"] if r["cp"] not in ("", None) else "nan"),
            float(r["pf"] if r["pf"] not in ("", None) else "nan"),
        )
        echo(
            f"{r['row_index']:>5}  {str(r.get(label, ''))[:34]:<34} {str(r.get('method', ''))[:22]:<22} "
            f"{cp:>8.4f} {pf:>8.4f}  {r['status']}"
        )


if __name__ == "__main__":
    sys.exit(main())
