r"""The score tables as text: Markdown, LaTeX (booktabs) and CSV, one cell rule for all.

A mean (or difference) with its interval is one cell, ``0.812 [0.700, 0.900]``; a group too small
for an interval shows its note instead of brackets, ``0.500 (n=1: no CI)``; an undefined value is
``n/a``. Markdown escapes ``|`` and ``\``; LaTeX escapes its ten special characters (a method
named ``a_b & c%`` prints as those characters). CSV keeps the numbers (one column each: value,
low, high, note), with the job layer's missing-value convention (:func:`~masc_engine.jobs.tables.csv_cell`).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from typing import Any

from .tables import csv_cell

__all__ = [
    "FORMATS",
    "SUFFIX_FORMATS",
    "latex_escape",
    "markdown_escape",
    "num_cell",
    "ci_cell",
    "means_layout",
    "means_notes",
    "TORCHMETRICS_HEADER",
    "TORCHMETRICS_NOTE",
    "compare_layout",
    "render",
    "csv_text",
]

#: The formats :func:`render` writes.
FORMATS = ("md", "latex", "csv")
#: ``--out`` suffix -> format.
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".tex": "latex", ".csv": "csv"}

_LATEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: Any) -> str:
    r"""``text`` as LaTeX prints it literally: ``\ & % $ # _ { } ~ ^`` escaped (text mode)."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


def markdown_escape(text: Any) -> str:
    r"""``text`` for a Markdown table cell: ``\`` and ``|`` escaped, line breaks as spaces."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _isnan(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num_cell(value: float, digits: int = 3) -> str:
    """A number as a cell: ``digits`` decimals, ``n/a`` for NaN or None."""
    return "n/a" if _isnan(value) else f"{value:.{digits}f}"


def ci_cell(value: float, low: float, high: float, note: str = "", digits: int = 3) -> str:
    """One table cell: ``v [lo, hi]``; ``v (note)`` without an interval (a group too small: the
    note says ``n=1: no CI``); ``n/a`` when the value is undefined.

    Args:
        value: the mean or difference, NaN for undefined.
        low: the interval's lower end, NaN without an interval.
        high: the interval's upper end, NaN without an interval.
        note: shown in parentheses when there is no interval.
        digits: decimals.
    """
    if _isnan(value):
        return "n/a"
    if _isnan(low) or _isnan(high):
        return f"{value:.{digits}f}" + (f" ({note})" if note else " [n/a]")
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


_NUMERIC = re.compile(r"^(-?\d|n/a$)")


def _left(headers: Sequence[str], body: Sequence[Sequence[str]]) -> list[bool]:
    """Per column: left-aligned (the first, and any holding text), or right-aligned (numbers)."""
    return [i == 0 or any(not _NUMERIC.match(str(r[i])) for r in body) for i in range(len(headers))]


def _markdown(headers: Sequence[str], body: Sequence[Sequence[str]], notes: Sequence[str], caption: str) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(markdown_escape(c) for c in cells) + " |"

    out = [f"**{markdown_escape(caption)}**", ""] if caption else []
    out += [line(headers), "|" + "|".join(":---" if left else "---:" for left in _left(headers, body)) + "|"]
    out += [line(r) for r in body]
    if notes:
        out += [""] + [f"- {markdown_escape(n)}" for n in notes]
    return "\n".join(out) + "\n"


def _latex(headers: Sequence[str], body: Sequence[Sequence[str]], notes: Sequence[str], caption: str) -> str:
    def line(cells: Sequence[str]) -> str:
        return " & ".join(latex_escape(c) for c in cells) + r" \\"

    out = [r"\begin{table}[t]", r"\centering"]
    if caption:
        out.append(r"\caption{" + latex_escape(caption) + "}")
    spec = "".join("l" if left else "r" for left in _left(headers, body))
    out += [r"\begin{tabular}{" + spec + "}", r"\toprule", line(headers), r"\midrule"]
    out += [line(r) for r in body]
    out += [r"\bottomrule", r"\end{tabular}"]
    out += [r"\par\footnotesize " + latex_escape(n) for n in notes]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def csv_text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """``rows`` as CSV text (header, then one line per row; NaN ``nan``, None empty)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: csv_cell(r.get(k)) for k in columns})
    return buf.getvalue()


def render(
    fmt: str,
    headers: Sequence[str],
    body: Sequence[Sequence[str]],
    *,
    notes: Sequence[str] = (),
    caption: str = "",
    rows: Sequence[dict] = (),
    columns: Sequence[str] = (),
) -> str:
    r"""A table as Markdown (``md``), LaTeX (``latex``, a booktabs ``table``) or CSV (``csv``).

    Args:
        fmt: one of :data:`FORMATS`.
        headers: the column titles as shown (``md`` and ``latex``), escaped here.
        body: the cells as shown, one sequence a row, escaped here.
        notes: lines under the table (``md``: a list; ``latex``: footnote-size paragraphs).
        caption: the table's title (``md``: bold line; ``latex``: ``\caption``).
        rows: ``csv``: the numbers themselves, one dict a row (:func:`csv_text`).
        columns: ``csv``: the keys of ``rows`` written, in order.

    Raises:
        ValueError: an unknown ``fmt``.
    """
    if fmt == "md":
        return _markdown(headers, body, notes, caption)
    if fmt == "latex":
        return _latex(headers, body, notes, caption)
    if fmt == "csv":
        return csv_text(rows, columns)
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def _pct(confidence: float) -> str:
    return f"{confidence * 100:g}%"


#: The header of a metric's torchmetrics aggregate column (``{m}``: the metric column).
TORCHMETRICS_HEADER = "{m} [torchmetrics: max(mean, 0)]"
#: The note under a table that shows a torchmetrics aggregate column.
TORCHMETRICS_NOTE = (
    "{m} [torchmetrics: max(mean, 0)]: the number torchmetrics' CLIPScore reports for the group, "
    "its per-sample scores averaged and then clamped at 0 (the clamp is on the mean, not per row; no "
    "interval); the {m} column beside it is the plain mean of the unclamped per-row scores with its CI"
)


def _torchmetrics_columns(table: Any) -> set[str]:
    return {m for m in table.units.metrics if table.rows and f"{m}_torchmetrics" in table.rows[0]}


def means_layout(table: Any) -> tuple[list[str], list[list[str]], list[str]]:
    """The cells of a :class:`~masc_engine.jobs.eval_tables.MeansTable`: ``(headers, body,
    csv_columns)``; a metric cell whose ``n`` is below the row's says ``n=k``. A metric with a
    torchmetrics aggregate (``clip_score_tm``) is followed by that number's column, headed
    :data:`TORCHMETRICS_HEADER` (CSV: ``<metric>_torchmetrics``)."""
    metrics, tm = table.units.metrics, _torchmetrics_columns(table)
    lead = ["subject", "method"] if table.by_subject else ["method"]
    headers = [*lead, "n"]
    for m in metrics:
        headers += [m, TORCHMETRICS_HEADER.format(m=m)] if m in tm else [m]
    body = []
    for r in table.rows:
        cells = [str(r[c]) for c in lead] + [str(r["n"])]
        for m in metrics:
            c = ci_cell(r[m], r[f"{m}_low"], r[f"{m}_high"], r[f"{m}_note"])
            if r[f"{m}_n"] != r["n"] and not r[f"{m}_note"]:
                c += f" n={r[f'{m}_n']}"
            cells += [c, num_cell(r[f"{m}_torchmetrics"])] if m in tm else [c]
        body.append(cells)
    columns = ["scope", *lead, "n"]
    for m in metrics:
        columns += [f"{m}{s}" for s in ("_n", "", "_low", "_high", "_note")]
        columns += [f"{m}_torchmetrics"] if m in tm else []
    return headers, body, columns


def means_notes(table: Any) -> list[str]:
    """The lines a :class:`~masc_engine.jobs.eval_tables.MeansTable` adds under itself: one
    :data:`TORCHMETRICS_NOTE` per metric with a torchmetrics aggregate column."""
    tm = _torchmetrics_columns(table)
    return [TORCHMETRICS_NOTE.format(m=m) for m in table.units.metrics if m in tm]


def compare_layout(table: Any) -> tuple[list[str], list[list[str]], list[str]]:
    """The cells of a :class:`~masc_engine.jobs.eval_tables.CompareTable`: ``(headers, body,
    csv_columns)``."""
    pct = _pct(table.units.options.confidence)
    headers = ["metric", "n", table.a, table.b, f"{table.a} - {table.b} [{pct} CI]"]
    body = [
        [
            r["metric"],
            str(r["n"]),
            num_cell(r["mean_a"]),
            num_cell(r["mean_b"]),
            ci_cell(r["diff"], r["diff_low"], r["diff_high"], r["note"]),
        ]
        for r in table.rows
    ]
    return headers, body, ["metric", "n", "mean_a", "mean_b", "diff", "diff_low", "diff_high", "note"]
