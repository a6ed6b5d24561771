"""Export-validation budgets are per shape, measured, and applied.

Each budget in ``tolerances.EXPORT_VALIDATION_BUDGETS`` must sit between its measurement in
bench/results/export_validation.json and 20x it (the module says 10x, rounded up): a budget that
drifts from its measurement, or a measurement that grows past its budget, fails here.
"""

from __future__ import annotations

import json

import pytest

from support import REPO
from masc_engine.tolerances import (
    EXPORT_BUG_MIN_ABS_ERROR,
    EXPORT_VALIDATION_ATOL,
    EXPORT_VALIDATION_BUDGETS,
    export_validation_atol,
)

RESULTS = json.loads((REPO / "bench/results/export_validation.json").read_text())
SHAPE_OF = {"tiny-naflex": "tiny", "tiny-fixed": "tiny", "base-naflex": "base", "so400m-naflex": "so400m"}


def test_every_shape_was_measured():
    assert {SHAPE_OF[p["preset"]] for p in RESULTS["presets"]} == set(EXPORT_VALIDATION_BUDGETS)


@pytest.mark.parametrize("shape", sorted(EXPORT_VALIDATION_BUDGETS))
@pytest.mark.parametrize("graph", ["vision", "pool", "text"])
def test_budget_is_ten_times_its_measurement(shape, graph):
    runs = [p for p in RESULTS["presets"] if SHAPE_OF[p["preset"]] == shape]
    b = EXPORT_VALIDATION_BUDGETS[shape]
    assert all(p["vision_width"] == b["width"] and p["vision_layers"] == b["layers"] for p in runs)
    measured = max(p["graphs"][graph]["max_abs"] for p in runs)
    assert measured < b[graph] <= 20 * measured, (shape, graph, measured, b[graph])
    assert b[graph] < EXPORT_BUG_MIN_ABS_ERROR / 100  # far below what an export bug gives


def test_budget_lookup_by_width():
    assert export_validation_atol("vision", 64)[0] == EXPORT_VALIDATION_BUDGETS["tiny"]["vision"]
    assert export_validation_atol("text", 768)[0] == EXPORT_VALIDATION_BUDGETS["base"]["text"]
    assert export_validation_atol("pool", 1152)[0] == EXPORT_VALIDATION_BUDGETS["so400m"]["pool"]
    atol, why = export_validation_atol("vision", 1536)
    assert atol == EXPORT_VALIDATION_ATOL and "unmeasured" in why


def test_tiny_bundle_was_held_to_the_tiny_budget(naflex_bundle):
    report = json.loads((naflex_bundle / "manifest.json").read_text())["validation"]
    for graph in ("vision", "pool", "text"):
        r = report[graph]
        assert r["atol"] == EXPORT_VALIDATION_BUDGETS["tiny"][graph] and "tiny" in r["budget_from"]
        assert r["max_abs"] <= r["atol"]
