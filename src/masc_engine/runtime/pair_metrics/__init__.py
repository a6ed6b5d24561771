"""Pair metrics: each score a run can write, declared once (``base.PairMetric``) and registered.

``registered()`` is every metric in order; ``metrics_for({"baselines"})`` those a run computes;
``masc.py`` holds CP and PF, ``baselines.py`` the paper's same-pass baselines, ``classic.py``
the classic metrics (CLIP-I, CLIP-T, DINO, DINOv2) asked for by name (``masc-run --metrics``).
"""

from .base import (
    HostTokens,
    compute_all,
    MetricBatch,
    PairMetric,
    columns_of,
    get_metric,
    headline_metrics,
    metrics_for,
    register,
    registered,
    score_metrics,
)

# The built-in metrics, registered on import in this order (registration order is column order):
# MaSC's scores first, then the opt-in baselines, then the classic metrics. A new metric module is
# imported here.
from . import masc  # noqa: E402,F401  isort: skip
from . import baselines  # noqa: E402,F401  isort: skip
from . import classic  # noqa: E402,F401  isort: skip


def _load_plugins() -> None:
    """Import the modules other packages name in the entry-point group ``masc_engine.pair_metrics``
    (each registers its metrics on import), after the built-ins, in name order."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="masc_engine.pair_metrics"), key=lambda e: e.name):
        ep.load()


_load_plugins()

__all__ = [
    "HostTokens",
    "compute_all",
    "MetricBatch",
    "PairMetric",
    "columns_of",
    "get_metric",
    "headline_metrics",
    "metrics_for",
    "register",
    "registered",
    "score_metrics",
]
