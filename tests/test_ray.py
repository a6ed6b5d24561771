"""masc-run --executor ray writes the same rows as the local executor (local Ray instance)."""

from __future__ import annotations

import pytest

from masc_engine.jobs.pairs import RunOptions, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.runtime.scorer import Scorer
from test_resume_and_cache import _big_pairs

pytest.importorskip("ray", reason="Ray is not installed (pip install 'masc-engine[ray]')")


@pytest.mark.slow
def test_ray_executor_equals_local(naflex_bundle, tmp_path):
    pairs = _big_pairs(tmp_path, copies=2)
    local, remote = tmp_path / "local.csv", tmp_path / "ray.csv"
    run_pairs(pairs, Scorer(naflex_bundle), local, options=RunOptions(chunk_size=8, progress=False))
    s = run_pairs(
        pairs,
        Scorer(naflex_bundle),
        remote,
        options=RunOptions(chunk_size=8, executor="ray", ray_workers=2, progress=False),
    )
    assert s.rows == 40 and s.ok == 40
    a, b = read_output(local), read_output(remote)
    assert [r["row_index"] for r in a] == [r["row_index"] for r in b] == [str(i) for i in range(1, 41)]
    for x, y in zip(a, b, strict=True):
        assert x["key"] == y["key"] and x["status"] == y["status"] and x["row_key"] == y["row_key"]
        # Same code, bit-identical whatever the batch (one patch count per batch) and whatever the
        # workers' BLAS thread count (runtime/blas.py): equal, not close.
        assert (x["cp"], x["pf"]) == (y["cp"], y["pf"])


@pytest.mark.slow
def test_ray_workers_share_the_persistent_cache(naflex_bundle, tmp_path):
    """--cache-dir under --executor ray: the workers write the same store the driver names, so a
    later local run with that cache encodes nothing."""
    pairs = _big_pairs(tmp_path, copies=1)
    cache = tmp_path / "cache"
    s = run_pairs(
        pairs,
        Scorer(naflex_bundle),
        tmp_path / "ray.csv",
        options=RunOptions(chunk_size=8, executor="ray", ray_workers=2, cache_dir=cache, progress=False),
    )
    assert s.rows == 20 and s.images_encoded > 0
    again = run_pairs(
        pairs, Scorer(naflex_bundle), tmp_path / "local.csv", options=RunOptions(cache_dir=cache, progress=False)
    )
    assert again.images_encoded == 0 and again.cache_hits > 0
    assert [(r["cp"], r["pf"]) for r in read_output(tmp_path / "ray.csv")] == [
        (r["cp"], r["pf"]) for r in read_output(tmp_path / "local.csv")
    ]
