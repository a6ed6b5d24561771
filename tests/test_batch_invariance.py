"""Batch-independent to the bit on CPU: the same pair gives bit-identical CP and PF
whatever else is in its batch and whatever the batch size, on a base-shaped bundle (the user
shape where padding changes ONNX Runtime's reduction order), through the API and masc-run."""

from __future__ import annotations


import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES
from masc_engine.jobs.pairs import RunOptions, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.runtime.scorer import Pair, Scorer
from test_row_semantics import table  # noqa: F401  (the issue's rows as a pairs CSV)

pytestmark = pytest.mark.slow


def _pairs():
    rows = [("cat/00", "cat/01"), ("dog2/00", "dog2/01"), ("backpack/00", "backpack/01")]
    out = []
    for k, (a, b) in enumerate(rows):
        ref, outim = Image.open(EXAMPLES / f"images/{a}.jpg"), Image.open(EXAMPLES / f"images/{b}.jpg")
        rm = np.array(Image.open(EXAMPLES / f"masks/{a}.png").convert("L"))
        om = np.array(Image.open(EXAMPLES / f"masks/{b}.png").convert("L"))
        size = [(512, 512), (500, 300), (300, 470)][k]  # three patch counts: batches would pad
        outim, om = outim.resize(size), np.array(Image.fromarray(om).resize(size, Image.NEAREST))
        out.append(Pair(ref, rm, outim, om, "a photo on the beach", a.split("/")[0]))
    return out


def test_scores_do_not_depend_on_the_batch(base_bundle):
    pairs = _pairs()
    alone = [Scorer(base_bundle, batch_size=1).score_batch([p])[0] for p in pairs]
    for bs in (1, 2, 8):
        together = Scorer(base_bundle, batch_size=bs).score_batch(pairs[::-1])[::-1]
        for a, b in zip(alone, together):
            assert (a.cp, a.pf) == (b.cp, b.pf), bs  # equality, not closeness


def test_masc_run_batch_size_1_equals_default(base_bundle, table, tmp_path):  # noqa: F811
    one, default = tmp_path / "b1.jsonl", tmp_path / "b8.jsonl"
    run_pairs(table["csv"], Scorer(base_bundle, batch_size=1), one, options=RunOptions(progress=False))
    run_pairs(table["csv"], Scorer(base_bundle), default, options=RunOptions(progress=False))
    a, b = read_output(one), read_output(default)
    assert [(r["key"], r["cp"], r["pf"], r["status"]) for r in a] == [
        (r["key"], r["cp"], r["pf"], r["status"]) for r in b
    ]


def test_scores_do_not_depend_on_the_blas_thread_count(naflex_bundle, tmp_path):
    """CP's cosine matrix is a numpy GEMM; OpenBLAS splits it differently on 1 and 2+ threads and
    the float32 bits differed (6e-8 on 2 of these 20 rows) between a Ray worker
    (``OMP_NUM_THREADS=1``) and a local run, until runtime/blas.py pinned that product to one
    thread. The same rows through masc-run in a child process with one BLAS thread: equal bits."""
    import os
    import subprocess
    import sys

    from test_resume_and_cache import _big_pairs

    pairs = _big_pairs(tmp_path, copies=1)  # 20 rows of the shipped examples
    here, there = tmp_path / "here.csv", tmp_path / "there.csv"
    run_pairs(pairs, Scorer(naflex_bundle), here, options=RunOptions(progress=False))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.run_cmd",
            str(pairs),
            "--bundle",
            str(naflex_bundle),
            "--out",
            str(there),
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    a, b = read_output(here), read_output(there)
    assert len(a) == 20
    assert [(r["cp"], r["pf"]) for r in a] == [(r["cp"], r["pf"]) for r in b]  # equality, not closeness
