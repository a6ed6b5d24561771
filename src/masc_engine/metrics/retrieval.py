"""Retrieval metrics of Finer-Personalization Rank (arXiv 2512.19026), pure functions (no I/O).

Average precision (AP) per query, the CMC curve and top-k rates, the ranking with its tie rule,
and the per-(method, class) summary of ``masc-rank``. Inputs are score and relevance arrays or
per-query dicts; nothing here reads files or knows about images.

Tie rule (pessimistic):
Gallery items are ranked by descending score; among items with *exactly equal* scores the
irrelevant ones are ranked first, so a tie never helps a query: AP and the rank of the first
correct item are the worst values any ordering of the tied items could give. Why this rule rather
than ranking ties by gallery order (a stable sort by score, as the Market-1501 style evaluations
effectively do through ``argsort``): (1) the result depends only on the scores and the labels,
never on how the gallery CSV happens to be ordered (``masc-rank`` results are identical under any
permutation of the gallery rows, which the tests check); (2) a degenerate encoder that gives every
image the same score gets the lowest AP, not a lucky one; (3) it is exactly defined, whereas
``np.argsort``'s default quicksort is not stable. Where no ties exist it equals every other rule
and ``sklearn.metrics.average_precision_score``; with ties, sklearn (which credits every relevant
item of a tied group with the precision at the group's end) gives a value >= ours, at times above
the AP of every ordering of the tied items. Ties among items of the same
relevance cannot change AP; for the reported ``top1_image`` they fall back to the gallery's
canonical order (sorted by resolved path).

Undefined queries: a query with no relevant gallery item (its identity is absent, or its only
image was the excluded query itself) has no AP: it is reported with status
``no_relevant_gallery_item`` and AP NaN, counted in ``n_undefined`` and left out of mAP and CMC,
never counted as 0.

Undefined queries: a query with no relevant gallery item has no AP: :func:`average_precision`
gives NaN, :func:`first_correct_rank` None, and :func:`summarize` counts it in ``n_undefined`` and
leaves it out of mAP and CMC, never counting it as 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

TOP_KS = (1, 5)
ALL = "*"  # the "all methods" / "all classes" label in the summary


def _as_arrays(scores, relevant) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    r = np.asarray(relevant, dtype=bool).reshape(-1)
    if s.shape != r.shape:
        raise ValueError(f"scores and relevant differ in length: {s.shape[0]} vs {r.shape[0]}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN; a similarity must be a number (or -inf) for every gallery item")
    return s, r


def ranking(scores, relevant) -> np.ndarray:
    """Gallery indices in rank order under the pessimistic tie rule (module docstring):
    descending score; among equal scores irrelevant before relevant; then by index."""
    s, r = _as_arrays(scores, relevant)
    return np.lexsort((np.arange(s.size), r.astype(np.int8), -s))


def _hit_positions(scores, relevant) -> np.ndarray:
    s, r = _as_arrays(scores, relevant)
    return np.flatnonzero(r[ranking(s, r)]) + 1  # 1-based ranks of the relevant items


def average_precision(scores, relevant) -> float:
    """AP of one query: mean over the relevant items of the precision at their rank.

    Args:
        scores (array_like of float): ``[G]`` similarities (higher = more similar); NaN is refused, -inf allowed.
        relevant (array_like of bool): ``[G]``, True for the query's identity.

    Returns:
        AP in ``(0, 1]``; NaN when no item is relevant (undefined, not 0). Ties: pessimistic.

    Raises:
        ValueError: lengths differ, or a score is NaN.
    """
    pos = _hit_positions(scores, relevant)
    if pos.size == 0:
        return float("nan")
    return float(np.mean(np.arange(1, pos.size + 1) / pos))


def first_correct_rank(scores, relevant) -> int | None:
    """1-based rank of the first relevant item (pessimistic ties), None when none is relevant."""
    pos = _hit_positions(scores, relevant)
    return int(pos[0]) if pos.size else None


@dataclass(frozen=True)
class QueryRanking:
    """One query's retrieval result: ``ap`` (NaN if undefined), ``first_rank`` (None if undefined),
    ``n_relevant``, ``n_gallery``, ``top_index`` (gallery index ranked first, None if empty)."""

    ap: float
    first_rank: int | None
    n_relevant: int
    n_gallery: int
    top_index: int | None

    @property
    def defined(self) -> bool:
        return self.first_rank is not None

    def top(self, k: int) -> bool | None:
        return None if self.first_rank is None else self.first_rank <= k


def rank_query(scores, relevant) -> QueryRanking:
    """AP, first correct rank and counts of one query (see :func:`average_precision`)."""
    s, r = _as_arrays(scores, relevant)
    order = ranking(s, r)
    pos = np.flatnonzero(r[order]) + 1
    ap = float(np.mean(np.arange(1, pos.size + 1) / pos)) if pos.size else float("nan")
    return QueryRanking(
        ap=ap,
        first_rank=int(pos[0]) if pos.size else None,
        n_relevant=int(r.sum()),
        n_gallery=int(s.size),
        top_index=int(order[0]) if s.size else None,
    )


def cmc(first_ranks: Iterable[int | None], max_rank: int) -> np.ndarray:
    """CMC curve: ``curve[k - 1]`` = share of defined queries whose first correct rank is <= k,
    for k = 1..max_rank. Undefined queries (None) are left out; no defined query gives NaNs."""
    ranks = np.array([r for r in first_ranks if r is not None], dtype=np.int64)
    if ranks.size and ranks.min() < 1:
        raise ValueError("ranks are 1-based")
    if ranks.size == 0:
        return np.full(max_rank, np.nan)
    return np.array([(ranks <= k).mean() for k in range(1, max_rank + 1)])


def cmc_at(first_ranks: Iterable[int | None], k: int) -> float:
    """The CMC value at rank k (top-k accuracy over defined queries; NaN if none)."""
    return float(cmc(first_ranks, k)[k - 1])


def summarize(rows: Sequence[dict], ks: Sequence[int] = TOP_KS) -> list[dict]:
    """mAP and CMC top-k per (method, class), per method (class ``*``), per class (method ``*``)
    and overall (``*``, ``*``).

    Args:
        rows: per-query dicts with ``method``, ``class``, ``status`` and, for scored queries
            (status ``ok``), ``ap`` and ``first_rank``. Status ``no_relevant_gallery_item`` counts
            as undefined; any other non-ok status as failed.

    Returns:
        dicts with ``method, class, n_queries, n_scored, n_undefined, n_failed, mAP`` and
        ``top{k}``; mAP/top-k are NaN for a group without scored queries. The values do not
        depend on the order of ``rows`` (mAP is an exactly rounded sum over the queries).
    """
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        m, c = str(row.get("method", "")), str(row.get("class", ""))
        for key in ((m, c), (m, ALL), (ALL, c), (ALL, ALL)):
            groups[key].append(row)

    def order(key):  # specific groups first, "*" last, otherwise alphabetical
        return tuple((k == ALL, k) for k in key)

    out = []
    for key in sorted(groups, key=order):
        g = groups[key]
        scored = [r for r in g if r["status"] == "ok"]
        n_undef = sum(r["status"] == "no_relevant_gallery_item" for r in g)
        ranks = [int(r["first_rank"]) for r in scored]
        res = {
            "method": key[0],
            "class": key[1],
            "n_queries": len(g),
            "n_scored": len(scored),
            "n_undefined": n_undef,
            "n_failed": len(g) - len(scored) - n_undef,
            # fsum: exactly rounded, so the summary does not depend on the order of the queries
            "mAP": math.fsum(float(r["ap"]) for r in scored) / len(scored) if scored else float("nan"),
        }
        for k in ks:
            res[f"top{k}"] = cmc_at(ranks, k) if ranks else float("nan")
        out.append(res)
    return out
