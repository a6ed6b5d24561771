"""The pairs job behind ``masc-run`` (and, one item at a time, the service): resumable, exactly
once, at scale.

Input columns: ``ref_image, ref_mask, out_image, out_mask, prompt, object_name``; paths relative
to the CSV's folder or absolute; every other column is carried through. Output: one row per input
row, in input order, with ``row_index`` (1-based data row), ``row_key``, ``cp``, ``pf``, ``status``,
``status_detail`` (file and cause), ``cp_status``, ``pf_status``, ``prompt_empty`` and the
reference's extras.

With a segmenter (``run_pairs(..., segmenter=...)``, ``masc-run --segmenter``) the mask columns
are optional: a side whose mask cell is empty or absent gets the segmenter's mask of its image,
prompted by the row's ``object_name`` (jobs/mask_source.py); the output then records each mask's
source (``ref_mask_source`` / ``out_mask_source``: ``file`` or ``segmenter``) and, with
``RunSettings.save_masks``, the PNG each computed mask was saved as (``ref_mask_saved`` /
``out_mask_saved``).

Each score has its own outcome: ``cp_status`` / ``pf_status`` is ``ok`` exactly when that score is
defined, else the reason it is NaN; ``status`` is ``ok`` when both are, else the first reason (CP's,
then PF's). A bad row never stops the run, a defined score is never dropped, and NaN never appears
without its reason:

- both scores (the row cannot be scored): ``prompt_too_long`` / ``object_name_too_long`` (over
  the text budget, checked before the row's files are read or its text tokenized: see
  :class:`RunSettings`); ``missing_file``, ``bad_path`` (a path the operating system refuses: a
  NUL byte, a name too long), ``unreadable_image``, ``unreadable_mask``, ``image_too_large``,
  ``file_too_large`` (over the byte cap, from its size, before it is read);
  ``mask_size_mismatch`` (a mask's size differs from its image's; the reference stretches it);
  ``mask_orientation_mismatch`` (the mask fits the image only rotated by 90 degrees, EXIF); ``bad_row`` (an empty image cell, or an empty mask cell without
  a segmenter); ``no_mask_source`` (no mask and no ``object_name`` to prompt the segmenter with),
  ``mask_prompt_too_long`` (the ``object_name`` is over the segmenter's prompt budget);
  ``filtered_reference_mask`` / ``filtered_output_mask`` (dropped on request by the paper's
  coverage filter);
- CP only: ``empty_reference_mask`` (no foreground pixel), ``reference_mask_below_threshold``
  (no reference patch above the threshold);
- PF only: ``no_background`` (the output mask hides every patch).

An empty prompt, or one that is only the subject name (it strips to nothing), is data: scored as
masc-metric scores it (PF against the empty text) and flagged ``prompt_empty`` (also in
``status_detail``), never a failed row.

Exactly once: finished rows go to an append-only journal (jobs/results.py) keyed by
``row_index`` and ``row_key`` (a hash of the row's cells and its files' size and mtime) under a
settings fingerprint (bundle, stripper, threshold, budget, EXIF policy, filters, provider, graph
variant; the segmenter and its recipe when there is one). A rerun of the same command scores only what is missing, and a changed row is scored
again; a rerun with other settings stops, naming what differs, unless asked to replace the
results (``overwrite``). One writer per output (``<out>.lock``); a full disk, a read-only folder
or a refused permission on the output side is one :class:`~.results.OutputWriteError`, and the
journal keeps what was finished (docs/input-policies.md, "Outputs").

Inputs are decoded and reduced to what scoring needs one file at a time (jobs/items.py); the
in-memory path (:meth:`PairsJob.decode_pair`, :meth:`PairsJob.check_pair`,
:meth:`PairsJob.score_decoded`) is what masc-serve calls.

The package's modules, along the job's seams: ``columns`` (the table's columns, the result
schema), ``settings`` (:class:`RunSettings`, fingerprinted; :class:`RunOptions`, not), ``job``
(:class:`PairsJob`), ``outcome`` (a row's result while scored), ``summary``, ``metadata`` (the sidecar) and
``run`` (:func:`run_pairs`).
"""

from .columns import (
    BASELINE_COLUMNS,
    FILE_COLUMNS,
    MAP_COLUMNS,
    MASK_COLUMNS,
    REQUIRED_COLUMNS,
    RESULT_COLUMNS,
    RESULT_SCHEMA_VERSION,
    SCORED_COLUMNS,
    PairsFileError,
    read_pairs,
    result_schema,
    row_key,
)
from .job import PairsJob, _ray_factory, build_pairs_job
from .outcome import RowOutcome
from .run import choose_executor, run_pairs
from .settings import RunOptions, RunSettings, encoding_namespace
from .metadata import sidecar, write_sidecar
from .summary import Summary

__all__ = [
    "BASELINE_COLUMNS",
    "FILE_COLUMNS",
    "MAP_COLUMNS",
    "MASK_COLUMNS",
    "REQUIRED_COLUMNS",
    "RESULT_COLUMNS",
    "RESULT_SCHEMA_VERSION",
    "SCORED_COLUMNS",
    "PairsFileError",
    "PairsJob",
    "RowOutcome",
    "RunOptions",
    "RunSettings",
    "Summary",
    "build_pairs_job",
    "choose_executor",
    "encoding_namespace",
    "read_pairs",
    "result_schema",
    "row_key",
    "run_pairs",
    "sidecar",
    "write_sidecar",
    "_ray_factory",
]
