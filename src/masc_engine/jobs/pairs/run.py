"""``run_pairs``: a pairs file scored into one output, resumably, exactly once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ...engine import stage_clock
from ...engine.backends.registry import get_backend
from ...runtime.cache import EncodingStore
from ...runtime.pair_metrics import headline_metrics
from ...runtime.scorer import Scorer
from ...runtime.segmenter import Segmenter
from ..executors import Chunk, LocalExecutor, RayExecutor
from ..mask_source import SAVED_MASK_COLUMNS
from ..tables import number_or_nan
from ..results import Journal, OutputLock, RunRecord, output_errors, output_format, resume, write_output
from .columns import MAP_COLUMNS, check_carried, read_pairs, row_key
from .job import PairsJob, _ray_factory, check_backbones
from .maps_owner import check_maps_owner, claim_maps
from .settings import RunOptions, RunSettings
from .metadata import write_sidecar
from .summary import Summary, table_columns


def run_pairs(
    csv_path: str | Path,
    scorer: Scorer,
    out_path: str | Path,
    settings: RunSettings = RunSettings(),
    options: RunOptions = RunOptions(),
    segmenter: Segmenter | None = None,
    embedders: dict | None = None,
) -> Summary:
    """Score every row of ``csv_path`` into ``out_path`` (format by extension), resumably.

    With a ``segmenter`` the mask columns are optional: a side without a mask gets the segmenter's
    mask for the row's ``object_name`` (module docstring), cached in ``options.cache_dir``'s store too.

    One writer per output: the run holds ``<out>.lock`` (jobs/results.py :class:`OutputLock`)
    from before it reads anything at ``out_path`` until the output is complete. Rows already in
    the journal (or in a complete previous output) with the same ``row_key`` are not scored
    again, provided the results there were made with the same settings and result schema;
    results made with other settings are neither reused nor replaced unless ``options.overwrite``
    (then the run starts afresh). Decoding of the next chunk overlaps inference on the current one.

    Args:
        settings: what a row's result depends on (fingerprinted).
        options: how the run goes (:class:`RunOptions`: chunking, threads, cache, executor, ...).
        embedders: name -> runtime/embedder.py ``Embedder`` for the metrics asked for by name
            (``settings.metrics``; ``clip`` for clip_i and clip_t, ``dino``, ``dino_s8``,
            ``dinov2``); their identities enter the fingerprint.

    Raises:
        PairsFileError: the pairs file is unusable or over ``max_pairs_bytes`` (nothing is written
            then).
        ValueError: an unsupported output extension; a metric whose embedder is not given.
        OutputBusyError: another run holds the output's lock (nothing is written).
        SettingsChangedError: results at ``out_path`` were made with other settings, named in the
            message, and ``overwrite`` is False (nothing is written).
        OutputWriteError: the output, journal, sidecar or maps cannot be written (full disk,
            read-only, permission); the rows journaled so far are kept for the next run.
    """
    out_path = Path(out_path)
    output_format(out_path)
    with OutputLock(out_path):
        return _run_locked(Path(csv_path), scorer, out_path, settings, options, segmenter, embedders or {})


def _run_locked(
    csv_path: Path,
    scorer: Scorer,
    out_path: Path,
    settings: RunSettings,
    opts: RunOptions,
    segmenter: Segmenter | None,
    embedders: dict,
) -> Summary:
    """The run, once the output's lock is held: resume, score what is missing, write the output."""
    t0 = time.time()
    stage_clock.mark("run_pairs")
    if settings.save_masks is not None and segmenter is None:
        raise ValueError("save_masks (--save-masks) needs a segmenter (--segmenter)")
    check_embedders(settings, embedders, opts.executor)
    # A run whose metrics include some that read no mask (the classic ones) takes rows without masks.
    masks_optional = segmenter is not None or bool(settings.embedders_needed())
    fieldnames, rows = read_pairs(csv_path, masks_optional=masks_optional, max_bytes=opts.max_pairs_bytes)
    check_carried(csv_path, fieldnames, settings.result_columns(segmenter is not None))
    base = csv_path.resolve().parent
    keys = [row_key(r, base) for r in rows]
    summary = Summary(duplicates=_duplicates(rows), score_columns=table_columns(settings.run_metrics()))
    journal = Journal(out_path)
    if settings.save_maps:
        check_maps_owner(Path(settings.save_maps), out_path, opts.overwrite)
    prior = resume(
        journal,
        settings.fingerprint(scorer, segmenter, embedders),
        settings.identity(scorer, segmenter, embedders),
        keys,
        str(csv_path),
        opts.overwrite,
    )
    summary.journal_repaired, summary.resumed = prior.repaired, len(prior.done)
    if settings.save_maps:
        with output_errors(settings.save_maps, "--save-maps folder"):
            claim_maps(Path(settings.save_maps), out_path)
    done = prior.done
    todo = [i for i in range(1, len(rows) + 1) if i not in done]
    # Chunks are runs of consecutive row indices only where nothing was done.
    chunks = [
        Chunk(tuple(c), tuple(rows[i - 1] for i in c), tuple(keys[i - 1] for i in c), str(base))
        for c in (todo[i : i + opts.chunk_size] for i in range(0, len(todo), opts.chunk_size))
    ]
    store = opts.store(scorer, settings.exif)
    if store is not None:
        scorer.attach_text_store(store)
    try:
        runner = choose_executor(scorer, settings, opts, store, segmenter, embedders)
        run = RunRecord(prior.next_run, t0, runner, opts.executor, summary.resumed)
        _score_chunks(runner, chunks, journal, run, done, len(rows), opts.progress)
    finally:
        if store is not None:
            store.close()
            scorer.detach_text_store()
    summary.take_stats(runner.stats())  # Ray: summed over the workers' reports
    stage_clock.mark("scored")
    with stage_clock.stage("write"):
        _write_output(out_path, settings.result_columns(segmenter is not None), fieldnames, rows, done, summary)
    summary.seconds = time.time() - run.t0
    write_sidecar(
        csv_path,
        scorer,
        out_path,
        settings,
        summary,
        prior.earlier_runs,
        run,
        {"executor": opts.executor, "chunk_size": opts.chunk_size},
        segmenter,
        embedders,
    )
    stage_clock.mark("written")
    journal.remove()  # last: a fault before this leaves the journal, and the same command finishes the job
    return summary


def choose_executor(
    scorer: Scorer,
    settings: RunSettings,
    opts: RunOptions,
    store: EncodingStore | None,
    segmenter: Segmenter | None = None,
    embedders: dict | None = None,
):
    """The executor ``opts.executor`` names (jobs/executors.py): a :class:`LocalExecutor` over one
    :class:`PairsJob` on ``scorer``, ``store`` and ``segmenter``, or a :class:`RayExecutor` whose
    workers each build their own job (:func:`build_pairs_job`: the same settings, store folder and
    resolved scorer and segmenter configs, the embedders' bundle folders and runner settings), on a GPU
    slot when the scorer's backend computes on one."""
    if opts.executor == "ray":
        factory = _ray_factory(
            scorer, settings, opts.io_workers, opts.cache_dir, opts.cache_size_limit, segmenter, embedders
        )
        return RayExecutor(
            factory,
            gpu=get_backend(scorer.backend).is_gpu(scorer.provider),
            address=opts.ray_address,
            workers=opts.ray_workers,
        )
    return LocalExecutor(
        PairsJob(scorer, settings, store=store, io_workers=opts.io_workers, segmenter=segmenter, embedders=embedders)
    )


def check_embedders(settings: RunSettings, embedders: dict, executor: str = "local") -> None:
    """Refuse, before any work, a metric whose embedder is not given (on either executor), or is a
    bundle of another backbone than its column's recipe names (job.py :func:`check_backbones`).

    Args:
        embedders: name -> bundle folder, or a loaded ``Embedder``.

    Raises:
        ValueError: one line naming the metric and ``--embedder NAME=BUNDLE``.
    """
    for m in settings.run_metrics():
        for name in dict.fromkeys(e.split(".")[0] for e in m.encoders if not e.startswith("siglip2.")):
            if name not in embedders:
                raise ValueError(f"--metrics {m.name} reads the {name} embedder: give --embedder {name}=BUNDLE")
    check_backbones(settings, embedders)


def _duplicates(rows: list[dict]) -> list[tuple[int, int]]:
    """``(row, first row with the same cells)`` for each repeated input row (1-based)."""
    seen: dict[str, int] = {}
    dups = []
    for i, r in enumerate(rows, start=1):
        k = json.dumps(r, sort_keys=True)
        if k in seen:
            dups.append((i, seen[k]))
        else:
            seen[k] = i
    return dups


def _score_chunks(
    runner, chunks: list[Chunk], journal: Journal, run: RunRecord, done: dict, total: int, progress: bool
) -> None:
    """Score the chunks, journaling each one's rows (tagged with the run) and then the run's figures."""
    from tqdm import tqdm

    # disable=None: tqdm draws only when stderr is a terminal (a log file or pipe gets no bar lines)
    bar = tqdm(total=total, initial=len(done), unit="pair", disable=None if progress else True, desc="masc-run")
    try:
        for results in runner.run(chunks):
            run.scored += len(results)
            # The run's figures so far travel in the journal, so a killed run's work stays on record.
            journal.append(results, run)
            for r in results:
                done[int(r["row_index"])] = r
            bar.update(len(results))
    finally:
        bar.close()


def _write_output(
    out_path: Path, result_cols: tuple[str, ...], fieldnames: list[str], rows: list[dict], done: dict, summary: Summary
) -> None:
    """Write the output in input order (input columns, then ``result_cols``) and count each row
    into ``summary``; map and saved-mask paths relative to the output's folder."""
    method_col = "method" if "method" in fieldnames else None
    headline = [c for m in headline_metrics() for c in m.columns]
    ordered = []
    for i in range(1, len(rows) + 1):
        r = {**rows[i - 1], **{k: v for k, v in done[i].items() if k in result_cols}}
        for c in headline:
            r[c] = number_or_nan(r.get(c))
        for k in MAP_COLUMNS + SAVED_MASK_COLUMNS:
            if r.get(k) and os.path.isabs(r[k]):
                r[k] = os.path.relpath(r[k], out_path.resolve().parent)
        ordered.append(r)
        summary.add(r, r.get(method_col) if method_col else None)
    columns = fieldnames + [c for c in result_cols if c not in fieldnames]
    with output_errors(out_path, "output"):
        write_output(out_path, ordered, columns)
