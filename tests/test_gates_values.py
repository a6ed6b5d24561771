"""Each acceptance gate's value, pinned once, beside what was measured against it.

The other tests import the gates from ``masc_engine.tolerances`` (so a gate loosened there would
loosen its tests with it); here each value is written out once, with the measurement that the
documentation records against it, and the documentation is checked to state the same value.
"""

from __future__ import annotations

import pytest

from support import REPO
from masc_engine import tolerances as tol

#: (constant, its value, where the docs state it, the measurement recorded against it)
GATES = [
    (
        "FIDELITY_MAX_ABS_DELTA",
        2e-3,
        ("docs/fidelity.md", "2e-3"),
        "bf16-cpu so400m held-out max |dCP| 1.72e-3 (bench/results/cpu_precision_so400m_certificate.json)",
    ),
    (
        "FIDELITY_MIN_SPEARMAN",
        0.999,
        ("docs/fidelity.md", "0.999"),
        "bf16-cpu so400m held-out Spearman CP 0.99999, PF 0.99978",
    ),
    (
        "FIDELITY_MIN_EMBEDDING_COSINE",
        0.9995,
        ("docs/fidelity.md", "0.9995"),
        "fp16 pooled-embedding cosine (bench/results/precision_fidelity.json)",
    ),
    ("FIDELITY_MIN_PAIRS", 1000, ("docs/cpu_precision.md", "1,000"), "the held-out set's size"),
    ("REDUCED_TOKEN_COSINE_MEDIAN", 0.999, None, "fp16 token cosine median 0.9999996"),
    ("REDUCED_TOKEN_COSINE_P001", 0.99, None, "fp16 token cosine 0.1st percentile 0.9999993"),
    (
        "INT8_MAX_ABS_DCP",
        1e-2,
        ("src/masc_engine/jobs/int8_gate.py", "Delta CP| <= 1e-2"),
        "int8 base NaFlex on the shared pairs: max |dCP| 0.059 (refused); tiny: 5.0e-3 (accepted)",
    ),
    (
        "INT8_MIN_SPEARMAN",
        0.995,
        ("src/masc_engine/jobs/int8_gate.py", "rho >= 0.995"),
        "int8 base NaFlex on the shared pairs: Spearman CP 0.9985, PF 0.937 (refused)",
    ),
    ("SEGMENTER_REDUCED_MIN_MASK_IOU", 0.99, None, "fp16 segmenter min mask IoU 0.9994"),
    ("SEGMENTER_REFERENCE_MIN_IOU", 0.99, None, "torch-free mask rule vs reference: min IoU 1.0"),
    ("EXPORT_BUG_MIN_ABS_ERROR", 1e-2, None, "a wrong key_padding_mask or position resize"),
]


@pytest.mark.parametrize("name, value, doc, measured", GATES, ids=[g[0] for g in GATES])
def test_gate_value_is_pinned(name, value, doc, measured):
    assert getattr(tol, name) == value, f"{name} moved from {value} (measured against it: {measured})"
    if doc is not None:
        path, text = doc
        assert text in (REPO / path).read_text(encoding="utf-8"), f"{path} no longer states {name} = {text}"


def test_the_gate_modules_use_the_pinned_values():
    from masc_engine.export import cpu_precision
    from masc_engine.jobs import int8_gate

    assert cpu_precision.FIDELITY_MIN_SPEARMAN == 0.999 and cpu_precision.FIDELITY_MAX_ABS_DELTA == 2e-3
    assert int8_gate.INT8_MIN_SPEARMAN == 0.995 and int8_gate.INT8_MAX_ABS_DCP == 1e-2
