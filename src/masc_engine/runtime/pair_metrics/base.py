"""What a pair metric declares, and the registry every consumer loops over.

A :class:`PairMetric` is one score (or a family of columns) computed from an encoded pair: its
name, the result columns it writes, the status column and statuses that say why a value is
undefined, the encoders it needs, when it runs (always, or behind a run option such as
``--baselines``), its identity (for the resume fingerprint and caches) and ``compute``.

The registry is ordered: masc-run's output columns, masc-serve's response schema, masc-report's
tables and masc-eval's metric choices follow registration order. MaSC's CP and PF are registered
first (``masc.py``), then the same-forward-pass baselines (``baselines.py``); a new metric is
one more module that calls :func:`register` (docs/architecture.md, "Adding a metric").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "HostTokens",
    "MetricBatch",
    "PairMetric",
    "register",
    "registered",
    "get_metric",
    "headline_metrics",
    "score_metrics",
    "metrics_for",
    "columns_of",
    "compute_all",
]


@dataclass
class MetricBatch:
    """One scoring call's pairs, as every metric's ``compute`` sees them.

    Attributes:
        items: the encoded pairs (``runtime.scorer.EncodedPair``: tokens ``[Hp*Wp, D] float32``
            per image, mask weights on each patch grid).
        results: the scorer's ``MaSCResult`` per item (CP, PF and their diagnostics in ``extras``).
        host_tokens: ``encoding -> [Hp*Wp, D] float32`` numpy tokens (copied from a device once
            per image and call).
        fg_threshold: the mask weight above which a patch is foreground, ``[0, 1)``.
        ref_any_foreground: per item, whether the reference mask has any foreground pixel.
        ref_mask_names: per item, how the reference mask is named in messages.
        scorer: the SigLIP2 :class:`~masc_engine.runtime.scorer.Scorer` that encoded the items
            (its pooling head ``pool_background`` and text tower ``encode_texts``), for metrics
            that need more than the tokens.
        memo: intermediates shared by the metrics of one batch (:meth:`shared`).
        image_keys: per item, ``(reference, output)`` content keys (sha256) of its images, the keys of
            :attr:`embeddings`.
        embeddings: ``embedder name -> image key -> [D] float32`` image embeddings (unnormalised),
            filled by the job for the embedders its classic metrics read (runtime/embedder.py).
        text_embeddings: ``embedder name -> prompt -> [D] float32`` text embeddings of the items'
            prompts as given (CLIP-T).
    """

    items: Sequence[Any]
    results: Sequence[Any]
    host_tokens: Callable[[Any], np.ndarray]
    fg_threshold: float
    ref_any_foreground: Sequence[bool] = ()
    ref_mask_names: Sequence[str] = ()
    scorer: Any = None
    memo: dict[str, Any] = field(default_factory=dict)
    image_keys: Sequence[tuple[str, str]] = ()
    embeddings: dict[str, Any] = field(default_factory=dict)
    text_embeddings: dict[str, Any] = field(default_factory=dict)

    def shared(self, key: str, make: Callable[["MetricBatch"], Any]) -> Any:
        """``make(self)``, computed once per batch under ``key``: what two metrics both need (a
        pooling of every image) is run once."""
        if key not in self.memo:
            self.memo[key] = make(self)
        return self.memo[key]


class HostTokens:
    """Host copies of encodings' tokens within one scoring call, each image copied once.

    Args:
        to_host: ``encoding -> encoding`` with numpy tokens (``Scorer.host_encoding``).
    """

    def __init__(self, to_host: Callable[[Any], Any]):
        self._to_host = to_host
        self._memo: dict[int, np.ndarray] = {}

    def __call__(self, enc: Any) -> np.ndarray:
        """The encoding's patch tokens as a host array (converted once per encoding)."""
        if id(enc) not in self._memo:
            self._memo[id(enc)] = self._to_host(enc).tokens
        return self._memo[id(enc)]


#: ``compute(batch) -> one dict per item``: column -> value, and optionally ``"status"`` (why the
#: value is undefined; ``"ok"`` when defined) and ``"note"`` (a ``status_detail`` part).
Compute = Callable[[MetricBatch], list[dict[str, Any]]]


@dataclass(frozen=True)
class PairMetric:
    """One registered pair metric.

    Attributes:
        name: the metric's name (``cp``; a family of columns may have its own, ``pf_pooling``);
            unique in the registry.
        columns: every value column it writes, its score first; floats (NaN where undefined) unless
            ``column_types`` says otherwise.
        description: one line for schemas and help: what the value is, its range and units.
        compute: see :data:`Compute`.
        status_column: the column holding ``ok`` or why the value is undefined (``cp_status``);
            None for a metric whose undefined values need no reason of their own.
        statuses: the reasons only this metric gives (documented in docs/commands.md).
        encoders: the encoders it reads (``"siglip2.vision"``, ``"siglip2.text"``): a run loads
            these and no others for it.
        option: None when every run computes it; else the run option that asks for it
            (``"baselines"``: ``RunSettings.baselines``, ``masc-run --baselines``).
        headline: a headline score (CP, PF): its value column leads the output, its status sets
            the row's ``status`` (in registration order), the run summary prints its mean.
        version: bumped when its values change for the same inputs; part of :meth:`identity`.
        reference: where the rule comes from (paper section, reference implementation).
        label: a short axis or table label (``CP (concept preservation)``); default: the first
            column in capitals.
    """

    name: str
    columns: tuple[str, ...]
    description: str
    compute: Compute
    status_column: str | None = None
    statuses: tuple[str, ...] = ()
    encoders: tuple[str, ...] = ("siglip2.vision",)
    option: str | None = None
    headline: bool = False
    version: int = 1
    reference: str = ""
    label: str = ""

    def __post_init__(self) -> None:
        if not self.columns:
            raise ValueError(f"metric {self.name!r} declares no column")
        # masc-eval and masc-report find a score's status by this name (jobs/evaluation.py).
        if self.status_column is not None and self.status_column != f"{self.columns[0]}_status":
            raise ValueError(f"metric {self.name!r}: its status column must be {self.columns[0]}_status")

    def identity(self) -> dict[str, Any]:
        """What a stored result of this metric depends on besides the inputs and the bundle:
        ``{"name", "version", "columns"}`` (part of the resume fingerprint when the registry is
        not the built-in one)."""
        return {"name": self.name, "version": self.version, "columns": list(self.columns)}

    @property
    def score_column(self) -> str:
        """The column holding the metric's score (its first)."""
        return self.columns[0]

    @property
    def axis_label(self) -> str:
        """:attr:`label`, else the score column in capitals."""
        return self.label or self.score_column.upper()

    def output_columns(self) -> tuple[str, ...]:
        """The value columns, then the status column when it has one."""
        return self.columns + ((self.status_column,) if self.status_column else ())


_REGISTRY: dict[str, PairMetric] = {}


def register(metric: PairMetric) -> PairMetric:
    """Add ``metric`` to the registry (after those registered before it).

    Raises:
        ValueError: a metric of that name, or one writing one of its columns, is registered.
    """
    if metric.name in _REGISTRY:
        raise ValueError(f"a pair metric named {metric.name!r} is registered already")
    taken = {c for m in _REGISTRY.values() for c in m.output_columns()}
    clash = sorted(taken & set(metric.output_columns()))
    if clash:
        raise ValueError(f"metric {metric.name!r}: column(s) {', '.join(clash)} belong to another metric")
    _REGISTRY[metric.name] = metric
    return metric


def registered() -> tuple[PairMetric, ...]:
    """Every registered metric, in registration order."""
    return tuple(_REGISTRY.values())


def get_metric(name: str) -> PairMetric:
    """The registered metric ``name``.

    Raises:
        KeyError: no metric of that name (the message lists the registered ones).
    """
    metrics = {m.name: m for m in registered()}
    if name not in metrics:
        raise KeyError(f"no pair metric {name!r}; registered: {', '.join(metrics)}")
    return metrics[name]


def headline_metrics() -> tuple[PairMetric, ...]:
    """The headline scores (CP, PF), in order."""
    return tuple(m for m in registered() if m.headline)


def score_metrics() -> tuple[PairMetric, ...]:
    """The metrics every run computes (no run option), in order: the scores masc-report tables and
    masc-serve returns."""
    return metrics_for()


def metrics_for(options: set[str] | frozenset[str] = frozenset()) -> tuple[PairMetric, ...]:
    """The metrics a run computes: every metric without an option, and those whose option is in
    ``options`` (``{"baselines"}``)."""
    return tuple(m for m in registered() if m.option is None or m.option in options)


def compute_all(metrics: Sequence[PairMetric], batch: MetricBatch) -> list[dict[str, Any]]:
    """Every metric's values for each item of ``batch``, merged into one dict per item: the value
    columns and, for a metric with a status column, its status there (notes left out). What the
    pairs job does column by column, for the Python API and tests."""
    rows: list[dict[str, Any]] = [{} for _ in batch.items]
    for m in metrics:
        for row, got in zip(rows, m.compute(batch)):
            row.update({c: got[c] for c in m.columns})
            if m.status_column:
                row[m.status_column] = got.get("status", "ok")
    return rows


def columns_of(metrics: Sequence[PairMetric]) -> tuple[str, ...]:
    """The output columns of ``metrics`` (values, then status), in order."""
    return tuple(c for m in metrics for c in m.output_columns())
