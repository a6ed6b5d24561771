"""``masc-run``: score a pairs CSV with a bundle (torch-free), resumably."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import click

from .options import exif_option, mask_size_tolerance_option, max_num_patches_option, threads_option


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("pairs_csv", type=click.Path(dir_okay=False))
@click.option("--bundle", "-b", required=True, type=click.Path(file_okay=False), help="Bundle from masc-export.")
@click.option("--out", "-o", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Output file; format by extension: .csv, .parquet, .jsonl (default: <pairs stem>.masc.csv "
                   "in the current directory). Rerunning the same command resumes.")
@click.option("--provider", default=None,
              help="Execution provider: cpu or cuda (default: cpu; cuda with --backend tensorrt). A missing "
                   "provider is an error.")
@click.option("--stripper", type=click.Choice(["regex", "spacy", "none"]), default="regex", show_default=True,
              help="How the subject is removed from the PF prompt (regex is the paper's).")
@max_num_patches_option
@exif_option
@click.option("--paper-filter", is_flag=True,
              help="The paper's filtering protocol: drop pairs whose output mask covers < 5% of the image "
                   "and all pairs of a reference whose mask covers < 5%.")
@click.option("--min-output-mask-frac", type=click.FloatRange(0, 1), default=None,
              help="Drop a pair whose output mask covers less than this fraction (rows kept with a status).")
@click.option("--min-reference-mask-frac", type=click.FloatRange(0, 1), default=None,
              help="Drop every pair of a reference whose mask covers less than this fraction (ORIDa: 0.005).")
@mask_size_tolerance_option
@click.option("--baselines", is_flag=True,
              help="Add the paper's same-forward-pass baselines: cp_global, cp_mnn, and PF with full / "
                   "background / foreground pooling x stripped / unstripped prompt.")
@click.option("--save-maps", type=click.Path(file_okay=False), default=None,
              help="Write per-pair attribution PNGs here (CP: best cosine per reference patch; PF: the "
                   "pooling head's background attention) and add cp_map / pf_map columns.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Persistent content-keyed cache of patch tokens and text embeddings (shareable).")
@click.option("--cache-size-gb", type=click.FloatRange(0.01, 1e6), default=8.0, show_default=True,
              help="Bound on the persistent cache's size.")
@click.option("--batch-size", type=click.IntRange(1, 1024), default=8, show_default=True,
              help="Images per vision-tower call.")
@click.option("--chunk-size", type=click.IntRange(1, 100000), default=64, show_default=True,
              help="Rows decoded, scored and journaled per step.")
@threads_option
@click.option("--io-workers", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Threads decoding images and masks (overlapping inference).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Run here, or on a Ray cluster (one scorer per worker slot).")
@click.option("--address", "ray_address", default=None,
              help="Ray cluster address (e.g. ray://head:10001 or auto); default: a local Ray instance.")
@click.option("--ray-workers", type=click.IntRange(1, 100000), default=None,
              help="Ray actors (scorers); default: one per CPU (or GPU with --provider cuda) in the cluster.")
@click.option("--cp-head", type=click.Choice(["numpy", "graph"]), default=None,
              help="CP on the host in numpy, or through the bundle's cp graph on the chosen provider. "
                   "Default: graph when device-resident, else numpy.")
@click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt"]), default="onnxruntime", show_default=True,
              help="ONNX Runtime on the bundle's ONNX graphs, or the TensorRT engines built by masc-export "
                   "--backend tensorrt (on CUDA: --provider defaults to cuda with it; unverified: see the README's support matrix).")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="TensorRT engine set to load (default: the only one in the bundle).")
@click.option("--graph-variant", type=click.Choice(["auto", "portable", "ort-cpu"]), default="auto", show_default=True,
              help="ONNX graphs to run: the fused ort-cpu vision and text graphs (ONNX Runtime on CPU; auto picks "
                   "them when the bundle has them), or the portable standard-op graphs. A variant the bundle "
                   "lacks is an error. The choice is recorded in <out>.meta.json.")
@click.option("--device-resident/--no-device-resident", default=None,
              help="Keep patch tokens in GPU memory between the vision graph, the pooling head and the CP "
                   "graph, and cache reference tokens there (needs CuPy). Default: on for --provider cuda "
                   "and --backend tensorrt, off on CPU.")
@click.option("--ort-memory", type=click.Choice(["lean", "arena"]), default="lean", show_default=True,
              help="ONNX Runtime CPU memory: lean (no CPU arena, no memory patterns: memory is weights + "
                   "the batch in flight) or arena (ONNX Runtime's defaults; keeps its high-water mark).")
@click.option("--overwrite", is_flag=True,
              help="Replace results at --out made with other settings (or a file masc-run did not write) and "
                   "score every row afresh. Without it such a run stops, naming what differs.")
@click.option("--print-scores", is_flag=True, help="Print each row's key, method, CP, PF and status.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def main(pairs_csv, bundle, out_path, provider, stripper, max_num_patches, exif, paper_filter,
         min_output_mask_frac, min_reference_mask_frac, mask_size_tolerance, baselines, save_maps, cache_dir, cache_size_gb,
         batch_size, chunk_size, threads, io_workers, executor, ray_address, ray_workers, cp_head, backend, precision, graph_variant,
         device_resident, ort_memory, overwrite, print_scores, no_progress) -> None:
    """Score every row of PAIRS_CSV (columns ref_image, ref_mask, out_image, out_mask, prompt,
    object_name; other columns are carried through) and print a summary.

    One run writes an output at a time (a second one on the same --out stops at once, naming the
    first); rerunning the same command resumes; a rerun with other settings stops unless
    --overwrite. Every failure is one line on stderr with exit status 1.
    """
    from ..engine.bundle import RandomWeightsWarning
    from ..errors import MascEngineError
    from ..jobs.pairs import RunSettings, run_pairs
    from ..runtime.scorer import Scorer

    out_path = out_path or f"{Path(pairs_csv).stem}.masc.csv"
    try:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)  # --out out/scores.csv on a fresh checkout
    except OSError as e:
        raise click.ClickException(f"cannot create the output folder {Path(out_path).parent}: {e.strerror or e}") from e
    if paper_filter:
        min_output_mask_frac = 0.05 if min_output_mask_frac is None else min_output_mask_frac
        min_reference_mask_frac = 0.05 if min_reference_mask_frac is None else min_reference_mask_frac
    settings = RunSettings(exif=exif, min_reference_mask_frac=min_reference_mask_frac,
                           min_output_mask_frac=min_output_mask_frac, mask_size_tolerance=mask_size_tolerance,
                           baselines=baselines, save_maps=str(Path(save_maps).resolve()) if save_maps else None)
    if provider is None:
        provider = "cuda" if backend == "tensorrt" else "cpu"
    if device_resident is None:
        from ..engine.device import is_gpu

        device_resident = is_gpu(backend, provider)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RandomWeightsWarning)
            scorer = Scorer(bundle, provider=provider, stripper=stripper, batch_size=batch_size,
                            intra_op_threads=threads or None, naflex_max_patches=max_num_patches,
                            cp_head=cp_head, backend=backend, precision=precision,
                            device_resident=device_resident, ort_memory=ort_memory,
                            graph_variant=graph_variant)
        for w in caught:
            click.secho(f"WARNING: {w.message}", fg="yellow", err=True)
        summary = run_pairs(pairs_csv, scorer, out_path, settings, chunk_size=chunk_size, io_workers=io_workers,
                            cache_dir=cache_dir, cache_size_limit=int(cache_size_gb * 2**30), executor=executor,
                            ray_address=ray_address, ray_workers=ray_workers, progress=not no_progress,
                            log=lambda s: click.echo(s, err=True), overwrite=overwrite)
    except KeyboardInterrupt:
        from ..jobs.results import journal_path, read_journal

        jp = journal_path(out_path)
        n = sum("row_index" in e for e in read_journal(jp)[1])
        click.echo(f"\ninterrupted: {n} finished rows are saved in {jp}; run the same command again to "
                   "score only the rest", err=True)
        sys.exit(130)
    except (MascEngineError, ValueError) as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:  # an environment fault the job layer did not name (e.g. the cache folder)
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        raise click.ClickException(f"masc-run stopped:{where} {e.strerror or e}; finished rows stay in "
                                   f"{out_path}.journal.jsonl: run the same command again to finish") from e
    if print_scores:
        from ..jobs.results import read_output

        rows = read_output(out_path)
        label = next((c for c in ("key", "out_image") if c in rows[0]), "row_index") if rows else "row_index"
        click.echo(f"{'row':>5}  {label:<34} {'method':<22} {'CP':>8} {'PF':>8}  status")
        for r in rows:
            cp, pf = float(r["cp"] if r["cp"] not in ("", None) else "nan"), float(r["pf"] if r["pf"] not in ("", None) else "nan")
            click.echo(f"{r['row_index']:>5}  {str(r.get(label, ''))[:34]:<34} {str(r.get('method', ''))[:22]:<22} "
                       f"{cp:>8.4f} {pf:>8.4f}  {r['status']}")
    for line in summary.lines():
        click.echo(line)
    click.echo(f"scores written to {out_path} (metadata: {out_path}.meta.json)")


if __name__ == "__main__":
    sys.exit(main())
