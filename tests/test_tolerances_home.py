"""Every tolerance and gate lives in ``masc_engine.tolerances``, each with how it was measured.

A test that compares a computed value against a bare number (``<= 1e-6``, ``abs=1e-12``,
``>= 0.99``) hides the bound from the one module that says how it was measured; this test reads
the tests with ``ast`` and names each such literal. Numbers that are not tolerances (input data,
noise added to inputs, fixture values) are not compared against, so they are not flagged.
"""

from __future__ import annotations

import ast

from support import REPO

TESTS = REPO / "tests"
#: A float in [TINY, SMALL] compared against a computed value is a tolerance; so are the
#: correlation and cosine gates below (0.99... written out).
TINY, SMALL = 1e-15, 1e-2
GATE_VALUES = frozenset({0.99, 0.995, 0.999, 0.9995})
#: Calls whose keyword (and positional, from this index) arguments are tolerances.
CLOSENESS_CALLS = {"approx": 1, "assert_allclose": 2, "allclose": 2, "isclose": 2}
TOLERANCE_KEYWORDS = frozenset({"abs", "rel", "atol", "rtol"})
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)

#: (file, text of the line) -> why that number is not a tolerance.
ALLOWED = {
    (
        "test_masks.py",
        "if arr.max() > 1.0 + 1e-6:",
    ): "the reference's own copy of masc-metric's uint8 value rule (a value convention, kept apart "
    "from runtime/masks.UINT8_SCALE_ABOVE so that the reference stays independent of the code it checks)",
    (
        "test_precision.py",
        "assert np.abs(got - want).max() > 1e-4  # the rounding happened (fp32 reruns agree to ~1e-7)",
    ): "a lower bound showing that bf16 rounding took place, not a bound on an error",
    (
        "test_report.py",
        'assert (sat > 60).mean() > 0.005, "no coloured pixels"',
    ): "the share of coloured pixels in a screenshot of the report: a check that plots are drawn",
    (
        "test_export_memory.py",
        'assert r["seconds"] >= 0 and 0.05 < r["rss_gb_after"] <= r["peak_rss_gb"] + 0.01 < 4',
    ): "memory figures printed to 0.01 GB (export/stages.py): the rounding of a stage line, not a numeric error",
}


def _is_tolerance_like(value) -> bool:
    return isinstance(value, float) and (TINY <= abs(value) <= SMALL or value in GATE_VALUES)


def _floats(node: ast.AST):
    """Float literals of an arithmetic expression (``1e-6``, ``-1e-6``, ``1 + 1e-6``); not inside calls."""
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        yield node
    elif isinstance(node, ast.UnaryOp):
        yield from _floats(node.operand)
    elif isinstance(node, ast.BinOp):
        yield from _floats(node.left)
        yield from _floats(node.right)


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")


def tolerance_literals(source: str) -> list[tuple[int, float]]:
    """``(line, value)`` of each tolerance-like float literal compared against a computed value:
    an operand of ``<``, ``<=``, ``>``, ``>=``, or a tolerance argument of pytest.approx,
    np.testing.assert_allclose, np.allclose or np.isclose."""
    found = []
    for node in ast.walk(ast.parse(source)):
        candidates: list[ast.AST] = []
        if isinstance(node, ast.Compare) and any(isinstance(op, ORDERING) for op in node.ops):
            candidates = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and _call_name(node) in CLOSENESS_CALLS:
            candidates = [k.value for k in node.keywords if k.arg in TOLERANCE_KEYWORDS]
            candidates += node.args[CLOSENESS_CALLS[_call_name(node)] :]
        for c in candidates:
            found += [(f.lineno, f.value) for f in _floats(c) if _is_tolerance_like(f.value)]
    return sorted(found)


def test_the_scanner_finds_what_it_should():
    src = "\n".join(
        [
            "assert abs(a - b) <= 1e-6",  # 1
            "assert x == pytest.approx(y, abs=1e-12)",  # 2
            "assert rho > 0.999",  # 3
            "np.testing.assert_allclose(a, b, rtol=0, atol=2e-3)",  # 4
            "assert y <= x + 1e-12",  # 5
            "assert np.allclose(a, b, 1e-5, 1e-8)",  # 6
            "noise = rng.normal(0, 1e-4, 10)",  # input data: not compared
            'row = {"cp": 0.99}',  # fixture value
            "assert x == 0.005",  # an exact value, not a bound
            "assert x <= TOL and pytest.approx(0.23) == y",  # named; approx's expected value
            "assert 0.5 < x < 0.95",  # a range of the data, not a tolerance
        ]
    )
    assert tolerance_literals(src) == [(1, 1e-6), (2, 1e-12), (3, 0.999), (4, 2e-3), (5, 1e-12), (6, 1e-8), (6, 1e-5)]


def test_no_test_hard_codes_a_tolerance():
    found, used = [], set()
    for path in sorted(TESTS.glob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for lineno, value in tolerance_literals("\n".join(lines)):
            key = (path.name, lines[lineno - 1].strip())
            if key in ALLOWED:
                used.add(key)
            else:
                found.append(f"{path.name}:{lineno}: {value!r} in `{key[1]}`")
    assert not found, (
        "name these in masc_engine.tolerances (with how they were measured) and import them:\n" + "\n".join(found)
    )
    assert used == set(ALLOWED), f"stale allowlist entries: {set(ALLOWED) - used}"


def test_int8_gate_defines_no_numeric_constant_of_its_own():
    from masc_engine import tolerances
    from masc_engine.jobs import int8_gate

    path = REPO / "src" / "masc_engine" / "jobs" / "int8_gate.py"
    own = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.UnaryOp):
            value = value.operand
        if (
            isinstance(value, ast.Constant)
            and isinstance(value.value, (int, float))
            and not isinstance(value.value, bool)
        ):
            own.append(ast.unparse(node))
    assert not own, own
    # The gates stay importable from the job module for its callers, and are the tolerances' own.
    assert int8_gate.INT8_MAX_ABS_DCP is tolerances.INT8_MAX_ABS_DCP
    assert int8_gate.INT8_MIN_SPEARMAN is tolerances.INT8_MIN_SPEARMAN
