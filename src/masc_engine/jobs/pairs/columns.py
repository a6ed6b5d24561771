"""The pairs table's columns: what a row must hold, what a run writes, and the result schema.

The result columns are laid out from the pair-metric registry (runtime/pair_metrics): the
headline scores (CP, PF) lead, their statuses follow ``status`` and ``status_detail``, the
diagnostics every scored pair fills, the mask coverages, then every other metric a run computes
(values, then its status column), in registration order. Opt-in metrics (``--baselines``) come
after the segmenter's columns.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from ...runtime.pair_metrics import PairMetric, columns_of, metrics_for, registered
from ..tables import DEFAULT_MAX_PAIRS_BYTES, TableError, read_table, resolve_path

REQUIRED_COLUMNS = ("ref_image", "ref_mask", "out_image", "out_mask", "prompt", "object_name")
FILE_COLUMNS = REQUIRED_COLUMNS[:4]
MASK_COLUMNS = ("ref_mask", "out_mask")
#: Opt-in columns (``--save-maps DIR``): PNG overlays, paths relative to the output file's folder.
MAP_COLUMNS = ("cp_map", "pf_map")


class PairsFileError(TableError):
    """The pairs file itself is unusable (missing, no header, missing columns)."""


def read_pairs(
    csv_path: str | Path, masks_optional: bool = False, max_bytes: int | None = DEFAULT_MAX_PAIRS_BYTES
) -> tuple[list[str], list[dict]]:
    """Read a pairs table with the job layer's reader (:func:`~masc_engine.jobs.tables.read_table`;
    CSV: UTF-8, byte-order mark tolerated, quoted commas/newlines allowed).

    Args:
        masks_optional: the mask columns may be absent (a run with a segmenter).
        max_bytes: the file's byte budget (``--max-pairs-mb``), checked before it is read.

    Returns:
        ``(columns, rows)``; the required columns' cells are strings (``""`` for a missing or
        null cell, numbers as text); other columns are carried through as read.

    Raises:
        PairsFileError: the file is missing, over ``max_bytes``, empty, unparsable, or lacks
            required columns (named).
    """
    try:
        required = [c for c in REQUIRED_COLUMNS if not (masks_optional and c in MASK_COLUMNS)]
        t = read_table(
            csv_path, required, "pairs", extra_fields="ignore", max_bytes=max_bytes, budget_option="--max-pairs-mb"
        )
    except TableError as e:
        hint = (
            "; without mask columns, give a segmenter (--segmenter): masks from each row's object_name"
            if not masks_optional and "missing column" in e.detail and "_mask" in e.detail.split(";")[0]
            else ""
        )
        raise PairsFileError(e.reason, e.detail + hint) from None
    return t.columns, [
        {k: (_cell(v) if k in REQUIRED_COLUMNS else ("" if v is None else v)) for k, v in r.items()} for r in t.rows
    ]


def check_carried(csv_path: str | Path, fieldnames: list[str], result_columns: tuple[str, ...]) -> None:
    """Refuse an input column named like a column the run writes (``cp``, ``status``): its cells
    would be replaced by the results, silently. Names compare exactly, as the output writes them.

    Raises:
        PairsFileError: one line naming the column(s) and the way out (rename them).
    """
    clash = [c for c in fieldnames if c in result_columns]
    if clash:
        names = ", ".join(repr(c) for c in clash)
        raise PairsFileError(
            "bad_pairs_file",
            f"{csv_path}: column(s) {names} are also result columns masc-run writes, so the results "
            "would replace their cells; rename them in the pairs file (e.g. human_cp), nothing was scored",
        )


def _cell(v) -> str:
    """A required cell as text: JSON and Parquet tables can hold numbers (a numeric object_name or
    file name) or nulls (NaN from pandas); those are data, not a reason to stop the run."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return v if isinstance(v, str) else str(v)


def row_key(row: dict, base: Path) -> str:
    """Identity of a row's inputs: its cells plus size and mtime of its four files (20 hex digits;
    an empty or absent cell names no file, not the CSV's folder)."""
    h = hashlib.sha256(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
    for c in FILE_COLUMNS:
        if not (row.get(c) or "").strip():
            h.update(b"|empty")
            continue
        try:
            st = os.stat(resolve_path(base, row[c]))
            h.update(f"|{st.st_size}:{st.st_mtime_ns}".encode())
        except (OSError, ValueError):  # ValueError: a path the OS refuses (a NUL byte): the row's status
            h.update(b"|missing")
    return h.hexdigest()[:20]


#: Result columns every scored pair fills from its ``MaSCResult.extras``, in order.
SCORED_COLUMNS = (
    "prompt_text",
    "prompt_stripped",
    "prompt_truncated",
    "cp_n_ref_fg",
    "cp_n_ref_total",
    "pf_n_bg_pooled",
    "pf_n_total",
)

#: The layout's version: with the built-in metrics of :data:`BUILTIN_METRICS` it is the layout of
#: every output written before the version was recorded, so it enters the resume fingerprint only
#: when the layout differs (a resume onto an output of another layout then refuses, naming it).
RESULT_SCHEMA_VERSION = 1

#: The metrics (name, version, columns) of result schema 1, as outputs written before it record them.
BUILTIN_METRICS = (
    {"name": "cp", "version": 1, "columns": ["cp"]},
    {"name": "pf", "version": 1, "columns": ["pf"]},
    {"name": "cp_global", "version": 1, "columns": ["cp_global"]},
    {"name": "cp_mnn", "version": 1, "columns": ["cp_mnn", "cp_mnn_frac"]},
    {
        "name": "pf_pooling",
        "version": 1,
        "columns": [f"pf_{r}_{k}" for r in ("full", "bg", "fg") for k in ("stripped", "unstripped")],
    },
)


#: Run options asked for by a flag (``--baselines``): their metrics are in the result schema of every
#: run, as in the outputs written before the schema was recorded. A metric behind any other option
#: (``classic``: asked for by name, ``--metrics``) enters it only in the runs that compute it.
FLAG_OPTIONS = ("baselines",)


def _in_schema(m: PairMetric, computed: frozenset[str]) -> bool:
    return m.option is None or m.option in FLAG_OPTIONS or m.name in computed


def result_schema(computed: tuple[PairMetric, ...] = ()) -> dict:
    """``{"version", "metrics"}``: the result layout of this installation for a run computing
    ``computed``: every registered metric's identity, in order, but the by-name opt-in metrics
    (``--metrics``) only when in ``computed``."""
    names = frozenset(m.name for m in computed)
    return {"version": RESULT_SCHEMA_VERSION, "metrics": [m.identity() for m in registered() if _in_schema(m, names)]}


def schema_identity(computed: tuple[PairMetric, ...] = ()) -> dict:
    """The result schema of a run computing ``computed`` as the fingerprint and the resume check see
    it: ``{}`` for schema 1 with the built-in metrics (so outputs written before keep their
    fingerprint, and so do runs without by-name opt-in metrics), else ``{"result_schema": ...}``."""
    schema = result_schema(computed)
    if schema == {"version": 1, "metrics": list(BUILTIN_METRICS)}:
        return {}
    return {"result_schema": schema}


def schema_label(identity: dict) -> str:
    """The schema of an identity as one short label for messages (``v1: cp, pf, ...``)."""
    schema = identity.get("result_schema") or {"version": 1, "metrics": list(BUILTIN_METRICS)}
    return f"v{schema['version']}: " + ", ".join(
        f"{m['name']}" + (f" v{m['version']}" if m["version"] != 1 else "") for m in schema["metrics"]
    )


def result_columns(metrics: tuple[PairMetric, ...]) -> tuple[str, ...]:
    """The result columns of a run computing ``metrics`` (segmenter, opt-in, map and saved-mask
    columns aside): headline values, status, detail, headline statuses, :data:`SCORED_COLUMNS`,
    coverages, then the other always-computed metrics' columns."""
    head = [m for m in metrics if m.headline]
    rest = [m for m in metrics if not m.headline and m.option is None]
    return (
        "row_index",
        "row_key",
        *(c for m in head for c in m.columns),
        "status",
        "status_detail",
        *(m.status_column for m in head if m.status_column),
        "prompt_empty",
        *SCORED_COLUMNS,
        "ref_mask_coverage",
        "out_mask_coverage",
        *columns_of(rest),
    )


def option_columns(option: str) -> tuple[str, ...]:
    """The columns of the metrics a run option asks for (``baselines``), in order."""
    return columns_of(tuple(m for m in registered() if m.option == option))


#: The result columns of a run with the built-in options (no segmenter, baselines, maps or masks).
RESULT_COLUMNS = result_columns(metrics_for())
#: Opt-in columns (``--baselines``): the paper's same-forward-pass ablations (runtime/pair_metrics/baselines.py).
BASELINE_COLUMNS = option_columns("baselines")
