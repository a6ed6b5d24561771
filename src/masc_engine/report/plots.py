"""The report's plots, drawn by matplotlib's SVG backend and inlined in the page.

matplotlib writes a standalone SVG document; :func:`inline_svg` turns it into an element for an
HTML page: the XML declaration, DOCTYPE and namespace declarations go (the HTML parser knows SVG
and ``xlink:href`` without them, and they are URLs a reader might take for requests), and every
``id`` gets a prefix made from the plot's content, so two plots on one page never share one and
the same data gives the same page. What remains refers
only to its own definitions (``href="#..."``, ``url(#...)``): the page still makes no request.
Text stays text (``svg.fonttype: none``), set in the page's font, and is never read as mathtext
(``text.parse_math: False``): a label is drawn as the characters it holds, ``$`` included.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # matplotlib is the report extra's, imported where a plot is drawn
    from matplotlib.typing import RcKeyType

# tab10, the palette people read plots in (matplotlib's default cycle)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
WITHIN_COLOR, CROSS_COLOR = "#1f77b4", "#ff7f0e"
STRIP_MAX_POINTS = 400  # points drawn per method in a strip plot (the box uses all values)

#: Every label is drawn as the text it is: method names come from the score file, and mathtext would
#: read ``$x^{2}$`` as a formula and fail the whole report on ``$\foo$`` (``text.parse_math``).
_RC: dict[RcKeyType, Any] = {
    "text.parse_math": False,
    "text.usetex": False,
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "axes.grid.axis": "x",
    "grid.color": "#e3e3e3",
}


def _figure(width_px: int, height_px: int):
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_px / 72, height_px / 72), dpi=72)  # 1 pt = 1 px in the SVG
    FigureCanvasSVG(fig)
    return fig


def inline_svg(fig, title: str) -> str:
    """A matplotlib figure as an ``<svg class="plot">`` element for an HTML page (see module
    docstring), with ``title`` as its accessible name."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "masc-report"}):
        fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    s = buf.getvalue()
    s = s[s.index("<svg") :]
    s = re.sub(r'\s+xmlns(:xlink)?="[^"]*"', "", s, count=2)
    prefix = "p" + hashlib.sha1(s.encode()).hexdigest()[:8] + "-"  # deterministic; one per distinct plot
    s = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}\1"', s)
    s = s.replace('href="#', f'href="#{prefix}').replace("url(#", f"url(#{prefix}")
    from html import escape

    return s.replace("<svg ", f'<svg class="plot" role="img" aria-label="{escape(title, quote=True)}" ', 1)


def svg_box_strip(
    groups: Sequence[tuple[str, np.ndarray]], label: str, *, width: int = 560, row_h: int = 38, seed: int = 0
) -> str:
    """Horizontal box plot (quartiles, median, whiskers to min/max, mean as a diamond) with the
    values jittered over it, one row per group; NaN values are left out. At most
    ``STRIP_MAX_POINTS`` points are drawn per group (an evenly spaced subset of the sorted
    values); the box uses all."""
    import matplotlib
    from matplotlib.colors import to_rgba

    vals = [np.asarray(v, dtype=np.float64) for _, v in groups]
    vals = [v[~np.isnan(v)] for v in vals]
    rng = np.random.default_rng(seed)
    with matplotlib.rc_context(_RC):
        fig = _figure(width, 80 + row_h * max(1, len(groups)))
        ax = fig.add_subplot()
        n = len(groups)
        for gi, (_, v) in enumerate(zip(groups, vals)):
            color = PALETTE[gi % len(PALETTE)]
            y = n - 1 - gi  # first group on top
            if v.size == 0:
                ax.text(0.01, y, "no scores", transform=ax.get_yaxis_transform(), va="center")
                continue
            ax.boxplot(
                [v],
                positions=[y],
                orientation="horizontal",
                widths=0.56,
                whis=(0, 100),
                patch_artist=True,
                showfliers=False,
                manage_ticks=False,
                boxprops={"facecolor": to_rgba(color, 0.28), "edgecolor": color},
                medianprops={"color": color, "linewidth": 2.4},
                whiskerprops={"color": color},
                capprops={"color": color},
            )
            pts = np.sort(v)
            if pts.size > STRIP_MAX_POINTS:
                pts = pts[np.linspace(0, pts.size - 1, STRIP_MAX_POINTS).round().astype(int)]
            ax.scatter(pts, y + rng.uniform(-0.28, 0.28, size=pts.size), s=7, color=color, alpha=0.7, linewidths=0)
            ax.scatter([float(v.mean())], [y], marker="D", s=36, facecolor="#fff", edgecolor="#222", zorder=3)
        ax.set_yticks(
            range(n),
            [
                f"{name if len(name) <= 20 else name[:19] + '…'}\nn={v.size}"
                for (name, _), v in zip(reversed(groups), reversed(vals))
            ],
        )
        ax.set_ylim(-0.6, n - 0.4)
        ax.set_xlabel(label.split(" ")[0])
        ax.set_title(label)
        fig.tight_layout()
        return inline_svg(fig, f"{label} by method")


def svg_histograms(
    series: Sequence[tuple[str, np.ndarray, str]],
    label: str,
    *,
    title: str = "",
    width: int = 560,
    height: int = 290,
    bins: int = 30,
) -> str:
    """Overlaid density histograms (shared bins) of several series ``(name, values, color)``;
    NaN values are left out. Densities, so classes of different sizes compare."""
    import matplotlib
    from matplotlib.colors import to_rgba

    vals = [np.asarray(v, dtype=np.float64) for _, v, _ in series]
    vals = [v[~np.isnan(v)] for v in vals]
    allv = np.concatenate(vals) if vals else np.empty(0)
    lo, hi = (float(allv.min()), float(allv.max())) if allv.size else (0.0, 1.0)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.01, hi + 0.01
    edges = np.linspace(lo, hi, bins + 1)
    with matplotlib.rc_context(_RC):
        fig = _figure(width, height)
        ax = fig.add_subplot()
        for (name, _, color), v in zip(series, vals):
            if v.size:
                ax.hist(
                    v,
                    bins=edges,
                    density=True,
                    histtype="stepfilled",
                    facecolor=to_rgba(color, 0.35),
                    edgecolor=color,
                    linewidth=1.5,
                    label=f"{name} (n={v.size})",
                )
            else:
                ax.plot([], [], color=color, label=f"{name} (n=0)")
        ax.set_xlabel(label)
        ax.set_ylabel("density")
        ax.set_title(title or label)
        ax.legend(loc="upper left", frameon=False)
        fig.tight_layout()
        return inline_svg(fig, title or label)
