"""runtime/heads.py: one CP for any array module, its constants from the reference.

CuPy cannot run here (no GPU), so the array-module path runs on a strict stand-in for it
(tests/doubles/device.py :class:`DeviceArray`, :data:`fake_xp`): like a CuPy array, a device array refuses implicit
conversion to numpy (``np.asarray`` raises ``TypeError``), so a numpy call slipped into the heads
fails here as it would on the GPU. The device path must give numpy's bits (same operations, the
cosine product on one BLAS thread on both sides).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from doubles.device import DeviceArray, fake_xp
from masc_engine.runtime import heads
from masc_engine.runtime.blas import single_thread_blas
from masc_engine.runtime.masks import cp_keep


def _to_device(x):
    return fake_xp.asarray(x)


def test_the_fake_device_refuses_implicit_conversion():
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(_to_device(np.ones(3, np.float32)))


def _tokens(rng, n, d, base):
    return (rng.normal(size=(n, d)) + base).astype(np.float32)


def test_heads_on_another_array_module_give_numpy_bits():
    rng = np.random.default_rng(0)
    for d in (64, 768):
        base = rng.normal(size=(1, d)).astype(np.float32)
        ref, w = _tokens(rng, 50, d, base), rng.random(50).astype(np.float32)
        for out in (_tokens(rng, 50, d, base), _tokens(rng, 7, d, base), _tokens(rng, 1, d, base)):
            want_cp, want_ex = heads.masked_maxcos(ref, out, w)
            with single_thread_blas():
                got_cp, got_ex = heads.masked_maxcos(_to_device(ref), _to_device(out), _to_device(w), xp=fake_xp)
            assert got_cp == want_cp and got_ex == want_ex
            with single_thread_blas():  # the fake's matmul is numpy's: same thread count, same bits
                got_best = heads.best_match_cosines(_to_device(ref), _to_device(out), xp=fake_xp)
            assert isinstance(got_best, DeviceArray)
            np.testing.assert_array_equal(fake_xp.asnumpy(got_best), heads.best_match_cosines(ref, out))
        with single_thread_blas():
            assert heads.cosine(_to_device(ref[0]), _to_device(ref[1]), xp=fake_xp) == heads.cosine(ref[0], ref[1])
        nothing = heads.masked_maxcos(
            _to_device(ref), _to_device(ref), _to_device(np.zeros(50, np.float32)), xp=fake_xp
        )[0]
        assert np.isnan(nothing)


def test_packed_cp_on_another_array_module_gives_numpy_bits():
    """cp_forward (the cp graph's arithmetic) on device arrays, host masks moved by the head."""
    from masc_engine.export.validate import cp_validation_cases

    for case in cp_validation_cases(64, seed=3):
        f = case["feeds"]
        want = heads.cp_forward(**f)
        with single_thread_blas():
            got = heads.cp_forward(
                _to_device(f["ref_tokens"]), f["ref_keep"], _to_device(f["out_tokens"]), f["out_valid"], xp=fake_xp
            )
        for k in ("cp", "best", "n_keep"):
            assert isinstance(got[k], DeviceArray)
            np.testing.assert_array_equal(fake_xp.asnumpy(got[k]), want[k])


def test_packed_cp_is_the_per_pair_head():
    """cp_forward keeps the patches cp_keep keeps and scores padding as absent."""
    from masc_engine.export.validate import cp_validation_cases
    from masc_engine.tolerances import CP_BEST_ATOL, CP_HEAD_ATOL

    for case in cp_validation_cases(64, seed=4):
        res = heads.cp_forward(**case["feeds"])
        for a, b, cp, best in case["pairs"]:
            if not np.isnan(cp):
                assert abs(float(res["cp"][a, b]) - cp) <= CP_HEAD_ATOL
            n = best.shape[0]
            assert np.abs(res["best"][a, b, :n] - best).max() <= CP_BEST_ATOL
        assert res["n_keep"].tolist() == case["n_keep"]


def test_normalize_eps_is_torch_normalize_default():
    """NORMALIZE_EPS is F.normalize's eps (read from torch, the reference's library), and
    l2_normalize divides by max(||x||, eps): tokens of norm below eps are scaled, not unit."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    eps = inspect.signature(F.normalize).parameters["eps"].default
    assert heads.NORMALIZE_EPS == eps
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, 64)).astype(np.float32)
    x[1] *= np.float32(eps) * 4  # norm a few eps: normalised to unit length
    x[2] *= np.float32(eps) / 64  # norm below eps: divided by eps, so shorter than 1
    x[3] = 0  # zero stays zero, never NaN
    n = np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32))
    np.testing.assert_array_equal(heads.l2_normalize(x), x / np.maximum(n, np.float32(eps)))
    want = F.normalize(torch.from_numpy(x), dim=-1).numpy()
    np.testing.assert_array_equal(np.sign(heads.l2_normalize(x)), np.sign(want))
    assert np.all(heads.l2_normalize(x)[3] == 0)
    assert np.linalg.norm(heads.l2_normalize(x)[2]) < np.linalg.norm(heads.l2_normalize(x)[1])


def test_thresholds_at_the_threshold():
    """CP keeps weight > threshold; PF hides weight >= threshold (masc-metric 0.3.0)."""
    from masc_engine.runtime.masks import DEFAULT_FG_THRESHOLD, foreground

    t = DEFAULT_FG_THRESHOLD
    w = np.array(
        [0.0, np.nextafter(np.float32(t), np.float32(0)), t, np.nextafter(np.float32(t), np.float32(1)), 1.0],
        np.float32,
    )
    assert cp_keep(w).tolist() == [False, False, False, True, True]
    assert foreground(w).tolist() == [False, False, True, True, True]
    assert heads.background_key_padding_mask(w).tolist() == foreground(w).tolist()
    ref = np.eye(5, 8, dtype=np.float32)
    _, ex = heads.masked_maxcos(ref, ref, w)
    assert ex["cp_n_ref_fg"] == 2
