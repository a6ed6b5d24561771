"""bench/fidelity_gates.py on synthetic score arrays (the reduced-precision gates, item 4)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from support import REPO
from masc_engine import tolerances as tol


@pytest.fixture(scope="module")
def fg():
    spec = importlib.util.spec_from_file_location("fidelity_gates", REPO / "bench" / "fidelity_gates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _scores(n=1500, seed=0):
    rng = np.random.default_rng(seed)
    cp = rng.uniform(0.3, 0.95, n).astype(np.float32)
    pf = rng.uniform(0.0, 0.2, n).astype(np.float32)
    emb = rng.normal(size=(200, 64)).astype(np.float32)
    return rng, {"cp": cp, "pf": pf, "embeddings": emb}


def test_spearman_matches_scipy(fg):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    a = rng.normal(size=300)
    b = a + rng.normal(size=300) * 0.5
    b[::7] = b[0]  # ties
    assert fg.spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0], abs=tol.FLOAT64_SAME_FORMULA_TOL)
    assert np.isnan(fg.spearman(np.ones(5), np.arange(5.0)))


def test_small_noise_passes(fg):
    rng, ref = _scores()
    test = {
        "cp": ref["cp"] + rng.normal(0, 2e-4, 1500).astype(np.float32),
        "pf": ref["pf"] + rng.normal(0, 2e-4, 1500).astype(np.float32),
        "embeddings": ref["embeddings"] + rng.normal(0, 1e-3, ref["embeddings"].shape).astype(np.float32),
    }
    r = fg.fidelity_gates(ref, test)
    assert r["pass"], r["gates"]
    assert r["gates"]["max_abs_delta_cp"]["threshold"] == tol.FIDELITY_MAX_ABS_DELTA
    assert r["gates"]["spearman_pf"]["value"] > tol.FIDELITY_MIN_SPEARMAN


def test_each_gate_fails_on_its_own(fg):
    rng, ref = _scores()
    bumped = dict(ref, cp=ref["cp"].copy())
    bumped["cp"][17] += 1.5 * tol.FIDELITY_MAX_ABS_DELTA  # one pair past the gate
    r = fg.fidelity_gates(ref, bumped)
    assert not r["pass"] and not r["gates"]["max_abs_delta_cp"]["pass"] and r["gates"]["spearman_cp"]["pass"]

    narrow = dict(ref, pf=rng.uniform(0.10, 0.12, 1500).astype(np.float32))  # PF spread of 0.02
    within = rng.uniform(-0.95, 0.95, 1500).astype(np.float32) * tol.FIDELITY_MAX_ABS_DELTA  # within the gate
    noisy = dict(narrow, pf=narrow["pf"] + within)
    r = fg.fidelity_gates(narrow, noisy)
    assert r["gates"]["max_abs_delta_pf"]["pass"] and not r["gates"]["spearman_pf"]["pass"]

    few = {k: v[:999] if k != "embeddings" else v for k, v in ref.items()}
    r = fg.fidelity_gates(few, few)
    assert not r["pass"] and not r["gates"]["min_pairs"]["pass"] and r["gates"]["max_abs_delta_cp"]["pass"]

    emb = ref["embeddings"].copy()
    emb[3] = emb[3] + np.abs(emb[3]).mean() * 0.1 * rng.normal(size=64).astype(np.float32)
    r = fg.fidelity_gates(ref, dict(ref, embeddings=emb))
    assert not r["pass"] and r["gates"]["min_embedding_cosine"]["value"] < tol.FIDELITY_MIN_EMBEDDING_COSINE


def test_nan_and_inf(fg):
    _, ref = _scores()
    ref = dict(ref, pf=ref["pf"].copy())
    ref["pf"][5] = np.nan  # undefined in fp32 (no background): NaN allowed there
    assert fg.fidelity_gates(ref, ref)["pass"]
    for k, i, v in (("cp", 9, np.nan), ("pf", 2, np.inf), ("pf", 5, 0.1)):
        test = dict(ref, **{k: ref[k].copy()})
        test[k][i] = v
        r = fg.fidelity_gates(ref, test)
        assert not r["pass"] and not r["gates"]["no_nan_inf"]["pass"], (k, i, v)
    emb = ref["embeddings"].copy()
    emb[0, 0] = np.nan
    assert not fg.fidelity_gates(ref, dict(ref, embeddings=emb))["gates"]["no_nan_inf"]["pass"]


def test_cli(fg, tmp_path):
    rng, ref = _scores()
    np.savez(tmp_path / "a.npz", **ref)
    np.savez(tmp_path / "b.npz", **ref)
    assert fg.main([str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--out", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["pass"] is True
    np.savez(tmp_path / "c.npz", **dict(ref, cp=ref["cp"] + 0.01))
    assert fg.main([str(tmp_path / "a.npz"), str(tmp_path / "c.npz")]) == 1
