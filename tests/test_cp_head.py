"""The CP head graph (cp.onnx) on ONNX Runtime CPU equals the numpy head (runtime/heads.py).

Tolerance: ``tolerances.CP_HEAD_ATOL`` (1e-6; how it was measured is written there).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from support import REPO, blob_mask, grid_image

from doubles.runners import ArrayCPRunner
from masc_engine.engine.bundle import Bundle
from masc_engine.runtime.cp_device import CPItem, GraphCP
from masc_engine.errors import ExportValidationError
from masc_engine.runtime.heads import best_match_cosines, masked_maxcos
from masc_engine.runtime.masks import cp_keep, mask_to_patch_grid
from doubles.runners import CountingRunner
from masc_engine.tolerances import CP_BEST_ATOL, CP_HEAD_ATOL, SELF_CP_ATOL


@pytest.fixture(scope="module")
def cp_runner(naflex_bundle):
    return Bundle(naflex_bundle).runner("cp")


def _assert_same(got, expected):
    for (cp, ex), (cp_ref, ex_ref) in zip(got, expected, strict=True):
        assert np.isnan(cp) == np.isnan(cp_ref)
        if not np.isnan(cp_ref):
            assert abs(cp - cp_ref) <= CP_HEAD_ATOL, (cp, cp_ref)
        assert ex["cp_n_ref_fg"] == ex_ref["cp_n_ref_fg"] and ex["cp_n_ref_total"] == ex_ref["cp_n_ref_total"]
        assert ex["cp_fg_frac_ref"] == ex_ref["cp_fg_frac_ref"]


def test_manifest_lists_the_validated_cp_graph(naflex_bundle):
    m = json.loads((naflex_bundle / "manifest.json").read_text())
    g = m["graphs"]["cp"]
    assert g["file"] == "cp.onnx" and [i["name"] for i in g["inputs"]] == [
        "ref_tokens",
        "ref_keep",
        "out_tokens",
        "out_valid",
    ]
    assert [o["name"] for o in g["outputs"]] == ["cp", "best", "n_keep"]
    v = m["validation"]["cp"]
    assert v["atol"] == CP_HEAD_ATOL and v["max_abs"] <= CP_HEAD_ATOL and len(v["cases"]) == 3
    assert all(c["all_finite"] for c in v["cases"])


def test_graph_equals_numpy_head_on_validation_cases(cp_runner):
    from masc_engine.export.validate import cp_validation_cases, validate_cp

    report = validate_cp(cp_runner, 64)
    assert report["max_abs"] <= CP_HEAD_ATOL
    # The no-kept-patch reference: finite 0 from the graph, n_keep 0; the numpy head says NaN.
    case = cp_validation_cases(64)[2]
    res = cp_runner.run(case["feeds"])
    assert res["n_keep"][0] == 0 and np.all(res["cp"][0] == 0) and np.all(res["best"][0] == 0)
    assert all(np.isnan(cp) for a, _, cp, _ in case["pairs"] if a == 0)


def test_validator_fails_on_a_graph_that_ignores_padding(cp_runner):
    from masc_engine.export.validate import validate_cp

    class IgnoresOutValid:
        def run(self, feeds):
            return cp_runner.run({**feeds, "out_valid": np.ones_like(feeds["out_valid"])})

    with pytest.raises(ExportValidationError, match="numpy head"):
        validate_cp(IgnoresOutValid(), 64)


def test_real_tokens_one_reference_many_outputs(naflex_bundle, cp_runner):
    """Tokens from the tiny bundle's vision graph, NaFlex grids of different sizes (so padding in
    both N and M), two references each against several outputs, one reference mask keeping
    nothing, packed into several calls."""
    from masc_engine import Scorer

    scorer = Scorer(naflex_bundle)
    grids = [(12, 16), (16, 12), (7, 9), (20, 20), (14, 18), (9, 31)]
    images = [grid_image(g, seed=i) for i, g in enumerate(grids)]
    encs = scorer.encode_images(images)
    weights = [
        mask_to_patch_grid(blob_mask(im.height, im.width, seed=i), e.grid)
        for i, (im, e) in enumerate(zip(images, encs, strict=True))
    ]
    empty = np.zeros_like(weights[2])
    items = []
    for r in (0, 1, 2):
        w = empty if r == 2 else weights[r]
        for o in range(len(encs)):
            items.append(CPItem(encs[r].tokens, w, encs[o].tokens))
    expected = [masked_maxcos(it.ref_tokens, it.out_tokens, it.ref_weights) for it in items]
    one_call = CountingRunner(cp_runner, shape_of="out_tokens")
    _assert_same(GraphCP(one_call).score_items(items), expected)
    assert one_call.calls == 1 and one_call.shapes[0][:2] == (3, 6)  # 3 references x 6 outputs
    assert sum(np.isnan(cp) for cp, _ in GraphCP(cp_runner).score_items(items)) == 6
    small = CountingRunner(cp_runner, shape_of="out_tokens")
    _assert_same(
        GraphCP(small, max_outs_per_ref=4, max_refs_per_call=2, max_sims=4 * 400 * 400).score_items(items), expected
    )
    assert small.calls > 2
    # Self-pairs: CP = 1.
    for (cp, _), it in zip(GraphCP(cp_runner).score_items(items), items, strict=True):
        if it.out_tokens is it.ref_tokens and not np.isnan(cp):
            assert abs(cp - 1.0) <= SELF_CP_ATOL


def test_best_per_patch_and_degenerate_tokens(cp_runner):
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(30, 64)).astype(np.float32)
    ref[3] = 0  # a zero token normalises to 0 (eps), cosine 0, never NaN
    w = rng.random(30).astype(np.float32)
    outs = [rng.normal(size=(m, 64)).astype(np.float32) for m in (1, 17, 40)]
    outs[1][:] = 0
    got = GraphCP(cp_runner).score(ref, w, outs)
    _assert_same(got, [masked_maxcos(ref, o, w) for o in outs])
    got = GraphCP(cp_runner).score_items([CPItem(ref, w, o) for o in outs], return_best=True)
    keep = cp_keep(w)
    for (cp, ex), o in zip(got, outs, strict=True):
        assert ex["best"].shape == (30,) and np.all(ex["best"][~keep] == 0) and np.isfinite(ex["best"]).all()
        assert np.abs(ex["best"][keep] - best_match_cosines(ref[keep], o)).max() <= CP_BEST_ATOL
        assert abs(float(ex["best"][keep].mean()) - cp) <= CP_HEAD_ATOL
    with pytest.raises(ValueError, match="M >= 1"):
        GraphCP(cp_runner).score(ref, w, [np.zeros((0, 64), np.float32)])


@pytest.mark.slow
def test_so400m_shapes(tmp_path):
    """The graph at so400m's width and the full 1024-patch budget (export + one call)."""
    pytest.importorskip("torch")
    from masc_engine.engine.backends.onnxruntime import OrtRunner
    from masc_engine.export.cp_head import cp_spec
    from masc_engine.export.graphs import export_graph

    export_graph(cp_spec(1152), tmp_path / "cp.onnx")
    runner = OrtRunner(tmp_path / "cp.onnx", "cp")
    rng = np.random.default_rng(1)
    base = rng.normal(size=(1, 1152)).astype(np.float32) * 2
    ref = (rng.normal(size=(1024, 1152)) + base).astype(np.float32)
    w = rng.random(1024).astype(np.float32)
    outs = [(rng.normal(size=(m, 1152)) + base).astype(np.float32) for m in (1024, 700)]
    _assert_same(GraphCP(runner).score(ref, w, outs), [masked_maxcos(ref, o, w) for o in outs])


@pytest.mark.slow
def test_cp_device_is_torch_free():
    code = (
        "import sys; sys.modules['torch'] = None; import masc_engine.runtime.cp_device; "
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_array_module_cp_head_equals_numpy_head():
    """heads.cp_forward (numpy here; CuPy on a GPU in bench/gpu_check.py) is the graph's head."""
    from masc_engine.export.validate import validate_cp

    for width in (64, 768):
        assert validate_cp(ArrayCPRunner(np), width)["max_abs"] <= CP_HEAD_ATOL
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(50, 64)).astype(np.float32)
    w = rng.random(50).astype(np.float32)
    outs = [rng.normal(size=(m, 64)).astype(np.float32) for m in (50, 13, 1)]
    _assert_same(GraphCP(ArrayCPRunner(np)).score(ref, w, outs), [masked_maxcos(ref, o, w) for o in outs])


def test_scorer_graph_cp_head_equals_numpy_head(naflex_bundle):
    from support import EXAMPLES, load_pair, read_rows
    from masc_engine.runtime.scorer import Pair, Scorer
    from masc_engine.tolerances import CP_HEAD_ATOL

    pairs = [Pair(*load_pair(EXAMPLES, r)) for r in read_rows(EXAMPLES)]
    a = Scorer(naflex_bundle).score_batch(pairs)
    b = Scorer(naflex_bundle, cp_head="graph").score_batch(pairs)
    for x, y in zip(a, b, strict=True):
        assert abs(x.cp - y.cp) <= CP_HEAD_ATOL and x.pf == y.pf
        assert x.extras["cp_n_ref_fg"] == y.extras["cp_n_ref_fg"]


def test_cp_cosines_run_on_one_blas_thread():
    """runtime/blas.py: inside the limit numpy's BLAS runs one thread (so CP's bits do not depend on
    the process's thread count, tests/test_batch_invariance.py), and threadpoolctl does find
    numpy's BLAS (an old threadpoolctl missing numpy 2's scipy-openblas would make the limit a no-op)."""
    from threadpoolctl import threadpool_info

    from masc_engine.runtime.blas import single_thread_blas

    # numpy's own BLAS (numpy.libs/...): another one loaded later in the process (scipy's, once a
    # test imports scipy) is not what CP's products run on.
    numpy_blas = [i for i in threadpool_info() if i["user_api"] == "blas" and "numpy" in i["filepath"]]
    assert numpy_blas, "threadpoolctl finds no numpy BLAS"
    with single_thread_blas():
        assert {
            i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas" and "numpy" in i["filepath"]
        } == {1}
