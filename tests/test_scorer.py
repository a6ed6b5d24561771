"""Invariants of the torch-free scorer (no oracle needed beyond a bundle)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from support import EXAMPLES, blob_mask, load_pair, read_rows
from masc_engine.errors import InputError
from masc_engine.runtime.heads import masked_maxcos
from masc_engine.runtime.scorer import Pair, Scorer
from masc_engine.tolerances import BATCH_INVARIANCE_ATOL, FLOAT32_SAME_ARITHMETIC_ATOL, SELF_CP_ATOL


@pytest.fixture(scope="module")
def example_pairs():
    rows = read_rows(EXAMPLES)
    return [Pair(*load_pair(EXAMPLES, r)) for r in rows]


def test_identical_reference_and_output_give_cp_one(any_bundle):
    s = Scorer(any_bundle)
    for row in read_rows(EXAMPLES)[:4]:
        im, m, *_ = load_pair(EXAMPLES, row)
        r = s.score(im, m, im, m, row["prompt"], row["object_name"])
        assert abs(r.cp - 1.0) <= SELF_CP_ATOL


def test_scores_do_not_depend_on_batch_composition_or_order(naflex_bundle, example_pairs):
    alone = [Scorer(naflex_bundle, batch_size=1).score_batch([p])[0] for p in example_pairs[:8]]
    s = Scorer(naflex_bundle, batch_size=5)
    order = np.random.default_rng(0).permutation(len(example_pairs))
    shuffled = s.score_batch([example_pairs[i] for i in order])
    by_index = {int(i): r for i, r in zip(order, shuffled, strict=True)}
    for i, a in enumerate(alone):
        b = by_index[i]
        assert abs(a.cp - b.cp) <= BATCH_INVARIANCE_ATOL and abs(a.pf - b.pf) <= BATCH_INVARIANCE_ATOL


def test_concurrent_threads_share_one_scorer(naflex_bundle, example_pairs):
    s = Scorer(naflex_bundle)
    expected = [s.score_batch([p])[0] for p in example_pairs[:6]]
    got: dict[int, object] = {}
    errors: list = []

    def work(i):
        try:
            got[i] = s.score_batch([example_pairs[i % 6]])[0]
        except Exception as e:  # noqa: BLE001 - surfaced by the assert below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, r in got.items():
        assert abs(r.cp - expected[i % 6].cp) <= BATCH_INVARIANCE_ATOL
        assert abs(r.pf - expected[i % 6].pf) <= BATCH_INVARIANCE_ATOL


def test_mask_size_mismatch_is_refused_unless_stretch_requested(naflex_bundle, example_pairs):
    p = example_pairs[0]
    small = p.ref_mask[::2, ::2]
    with pytest.raises(InputError) as e:
        Scorer(naflex_bundle).score(p.ref_image, small, p.out_image, p.out_mask, p.prompt, p.object_name)
    assert e.value.reason == "mask_size_mismatch"
    r = Scorer(naflex_bundle, mask_size_policy="stretch").score(
        p.ref_image, small, p.out_image, p.out_mask, p.prompt, p.object_name
    )
    assert math.isfinite(r.cp)


def test_masked_maxcos_known_values():
    ref = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
    out = np.array([[1, 0], [-1, 0]], np.float32)
    # Patch 0 matches out[0] exactly (cos 1); patch 1 is orthogonal to both (0); patch 2 is masked out.
    cp, ex = masked_maxcos(ref, out, np.array([1.0, 0.9, 0.5], np.float32))
    assert cp == pytest.approx(0.5, abs=FLOAT32_SAME_ARITHMETIC_ATOL)
    assert ex == {"cp_n_ref_fg": 2, "cp_n_ref_total": 3, "cp_fg_frac_ref": pytest.approx(0.8)}
    cp, _ = masked_maxcos(ref, out, np.zeros(3, np.float32))
    assert math.isnan(cp)


def test_pf_is_nan_only_when_no_background(naflex_bundle):
    from masc_engine.export.validate import synthetic_image

    im = synthetic_image(96, 96, 1)
    full = np.full((96, 96), 255, np.uint8)
    r = Scorer(naflex_bundle).score(im, blob_mask(96, 96), im, full, "a dog", "dog")
    assert math.isnan(r.pf) and r.extras["pf_n_bg_pooled"] == 0 and math.isfinite(r.cp)


def test_api_input_errors_and_undefined_reasons(naflex_bundle, example_pairs):
    p = example_pairs[0]
    s = Scorer(naflex_bundle)
    with pytest.raises(TypeError, match="PIL"):
        s.score("examples/dreambooth/images/cat/00.jpg", p.ref_mask, p.out_image, p.out_mask, p.prompt)
    r = s.score(p.ref_image, np.zeros_like(p.ref_mask), p.out_image, p.out_mask, p.prompt, p.object_name)
    assert math.isnan(r.cp) and "mask weight" in r.extras["cp_undefined"] and "pf_undefined" not in r.extras
