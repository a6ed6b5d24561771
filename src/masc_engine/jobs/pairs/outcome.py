"""One pair's result while it is scored: a value and a status per metric, the notes, the record."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypeVar

from ...errors import InputError
from ...runtime.pair_metrics import PairMetric
from ...runtime.scorer import EncodedPair
from ..items import DecodedPair

T = TypeVar("T")


@dataclass
class RowOutcome:
    """One pair's result while :meth:`PairsJob.score_decoded` works on it.

    Attributes:
        item: the decoded pair.
        metrics: the pair metrics the run computes (runtime/pair_metrics), in order.
        scores: each headline value column (``cp``, ``pf``) -> its value (NaN until scored, or
            where undefined); the other metrics' values are in ``values`` once computed.
        statuses: each metric's status column (``cp_status``) -> ``ok`` or why it is undefined.
        notes: the parts of ``status_detail`` (conversions, notes, why a score is undefined).
        prompt_empty: PF compared with an empty text.
        coverage: ``(reference, output)`` mask coverage, once the masks were checked.
        values: the other result columns (:data:`SCORED_COLUMNS`, other metrics, map paths).
        pair: the pair ready for the heads, once admitted.
        error: the failure that keeps the row from being scored (every score), if any.
    """

    item: DecodedPair
    metrics: tuple[PairMetric, ...] = ()
    scores: dict = field(default_factory=dict)
    statuses: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    prompt_empty: bool = False
    coverage: tuple[float, float] | None = None
    values: dict = field(default_factory=dict)
    pair: EncodedPair | None = None
    error: InputError | None = None

    def __post_init__(self):
        for m in self.metrics:
            if m.headline:
                self.scores.update({c: math.nan for c in m.columns})
            if m.status_column:
                self.statuses[m.status_column] = "ok"

    def fail(self, e: InputError) -> None:
        """The row cannot be scored: every score gets ``e``'s reason, ``status_detail`` its detail."""
        self.error = e
        self.statuses = dict.fromkeys(self.statuses, e.reason)

    def take(self, metric: PairMetric, computed: dict) -> None:
        """One metric's values for this pair (``compute``'s dict: columns, ``status``, ``note``)."""
        target = self.scores if metric.headline else self.values
        target.update({c: computed[c] for c in metric.columns})
        if metric.status_column:
            self.statuses[metric.status_column] = computed.get("status", "ok")
        if computed.get("note"):
            self.notes.append(computed["note"])

    @property
    def encoded(self) -> EncodedPair:
        """:attr:`pair`, for the code that runs on admitted pairs only.

        Raises:
            ValueError: the pair was not admitted (no :attr:`pair`).
        """
        if self.pair is None:
            raise ValueError(f"row {self.item.row_index} was not admitted: it has no encoded pair")
        return self.pair

    @property
    def status(self) -> str:
        """``ok``, or the first reason a score is undefined (in metric order: CP's, then PF's)."""
        return next((x for x in self.statuses.values() if x != "ok"), "ok")

    def record(self) -> dict:
        """The row's masc-run record: the item's cells, ``row_index`` and the result columns."""
        it = self.item
        detail = self.error.detail if self.error is not None else "; ".join(n for n in self.notes if n)
        rec = {
            **it.cells,
            "row_index": it.row_index,
            **self.scores,
            "status": self.status,
            "status_detail": detail,
            **self.statuses,
            "prompt_empty": self.prompt_empty,
        }
        if self.coverage is not None:
            rec["ref_mask_coverage"], rec["out_mask_coverage"] = self.coverage
        rec.update(self.values)
        return rec


def _row_text(row: dict) -> tuple[str, str]:
    """A row's ``(prompt, object_name)`` cells (``""`` when empty)."""
    return row.get("prompt") or "", row.get("object_name") or ""


def _raise(v: T | InputError) -> T:
    """A loader's result, raising it when it is an :class:`InputError` (load_all keeps it)."""
    if isinstance(v, InputError):
        raise v
    return v
