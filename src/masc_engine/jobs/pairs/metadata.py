"""The sidecar ``<out>.meta.json``: what made an output, cumulative over its runs."""

from __future__ import annotations

import platform
import time
from collections.abc import Mapping
from pathlib import Path

from ...runtime.embedder import Embedder
from ...runtime.pair_metrics.classic import COLUMN_RECIPES
from ...runtime.scorer import Scorer
from ...runtime.segmenter import Segmenter
from ..results import MASK_COUNTERS, RunRecord, meta_path, output_errors, write_meta
from .settings import RunSettings
from .summary import Summary


def _versions() -> dict:
    import numpy
    import onnxruntime
    import PIL
    import tokenizers

    from ... import __version__

    return {
        "masc_engine": __version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": numpy.__version__,
        "pillow": PIL.__version__,
        "tokenizers": tokenizers.__version__,
        "python": platform.python_version(),
    }


def write_sidecar(
    csv_path: Path,
    scorer: Scorer,
    out_path: Path,
    settings: RunSettings,
    summary: Summary,
    earlier_runs: list[dict],
    run: RunRecord,
    how: dict,
    segmenter: Segmenter | None = None,
    embedders: Mapping[str, Embedder] | None = None,
) -> dict:
    """Write ``<out>.meta.json`` (:func:`sidecar`) with this run's finished record appended to
    the earlier runs'; returns it.

    Raises:
        OutputWriteError: the sidecar cannot be written.
    """
    this_run = {k: v for k, v in run(True).items() if k != "type"}
    this_run["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    meta = sidecar(csv_path, scorer, out_path, settings, summary, earlier_runs + [this_run], how, segmenter, embedders)
    with output_errors(meta_path(out_path), "sidecar"):
        write_meta(meta_path(out_path), meta)
    return meta


def sidecar(
    csv_path: Path,
    scorer: Scorer,
    out_path: Path,
    settings: RunSettings,
    summary: Summary,
    all_runs: list[dict],
    how: dict,
    segmenter: Segmenter | None = None,
    embedders: Mapping[str, Embedder] | None = None,
) -> dict:
    """The sidecar ``<out>.meta.json``: cumulative over every run that produced this output (a
    resumed or repeated command adds its record to ``runs`` and never erases what the earlier
    ones measured). With a segmenter it is described under ``segmenter`` (its bundle, identity and
    the whole mask recipe) and its counters are summed under ``counts``; the embedders the metrics
    read (``--embedder``) are described under ``embedders``, and each classic column's recipe
    (runtime/pair_metrics/classic.py ``COLUMN_RECIPES``) under ``column_recipes``."""
    total_s = sum(float(r.get("seconds") or 0.0) for r in all_runs)
    total_scored = sum(int(r.get("rows_scored") or 0) for r in all_runs)
    counts = summary.counts()
    counted = ("images_encoded", "cache_hits") + (MASK_COUNTERS if segmenter is not None else ())
    counts.update({k: sum(int(r.get(k) or 0) for r in all_runs) for k in counted})
    b = scorer.bundle
    meta = {
        "fingerprint": settings.fingerprint(scorer, segmenter, embedders),
        "identity": settings.identity(scorer, segmenter, embedders),
        "input": str(csv_path.resolve()),
        "output": str(out_path.resolve()),
        "bundle": str(b.path),
        "bundle_fingerprint": b.fingerprint,
        "source_model": b.manifest["source"],
        "bundle_versions": b.manifest.get("versions"),
        "runtime_versions": _versions(),
        "settings": {**settings.as_dict(), **scorer.config.to_dict(), **how},
        # Reduced precision (fp16/bf16/int8 graphs, bf16 on OpenVINO): what the scores are certified to.
        "precision_certificate": _certificate_summary(scorer.certificate),
        "counts": counts,
        "seconds": round(total_s, 2),
        "pairs_per_second": round(total_scored / total_s, 3) if total_s > 0 and total_scored else None,
        "runs": all_runs,
        "finished": all_runs[-1]["finished"],
    }
    if segmenter is not None:
        meta["segmenter"] = segmenter.describe()
    given = embedders or {}
    used = {k: given[k].describe() for k in settings.embedders_needed() if k in given}
    if used:
        meta["embedders"] = used
    recipes = {m: COLUMN_RECIPES[m] for m in settings.metrics or () if m in COLUMN_RECIPES}
    if recipes:  # each classic column's recipe (scale, clamp, pairing...): what its number means
        meta["column_recipes"] = recipes
    return meta


def _certificate_summary(cert: dict | None) -> dict | None:
    """The parts of a bundle's precision record a reader of the sidecar needs (not the search log)."""
    if cert is None:
        return None
    return {k: cert[k] for k in ("mode", "claim", "gates", "keep_fp32", "backend") if k in cert}
