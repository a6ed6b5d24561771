"""Graph runners that stand in for or wrap the real ones: counting what ran, or running a graph's
arithmetic on an array module (numpy here, CuPy on a GPU)."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np


class CountingRunner:
    """A graph runner that counts what it is run on, then runs the real one: what ran is counted
    where the graphs run, not by the scorer's or segmenter's own counters.

    ``calls`` counts runs, ``shapes`` records the shape of each run's first feed (or of the feed
    named ``shape_of``), ``counts[graph]`` the batch rows run per graph when a shared ``Counter``
    is given. Loader threads run graphs at once, so every count goes through one lock (``+=`` is a
    read and a write).
    """

    lock = threading.Lock()

    def __init__(self, runner, counts: Counter | None = None, graph: str = "", shape_of: str | None = None):
        self.runner, self.counts, self.graph, self.shape_of = runner, counts, graph, shape_of
        self.calls, self.shapes = 0, []

    def run(self, feeds: dict) -> dict:
        first = feeds[self.shape_of] if self.shape_of else next(iter(feeds.values()))
        with self.lock:
            self.calls += 1
            self.shapes.append(first.shape)
            if self.counts is not None:
                self.counts[self.graph] += int(first.shape[0])
        return self.runner.run(feeds)

    def __getattr__(self, name):
        return getattr(self.runner, name)


class ArrayCPRunner:
    """The ``cp`` graph's arithmetic (runtime/heads.py ``cp_forward``) as a runner of the ``cp``
    graph, over an array module (numpy here, CuPy on a GPU): what ``GraphCP`` packs pairs for.
    ``run`` returns numpy arrays; ``run_device`` the module's (on the GPU with CuPy)."""

    name = "cp"
    input_names = ["ref_tokens", "ref_keep", "out_tokens", "out_valid"]
    output_names = ["cp", "best", "n_keep"]

    def __init__(self, xp=np, gemm_dtype: str = "float32"):
        self.xp, self.gemm_dtype = xp, gemm_dtype

    def run_device(self, feeds: dict, device=None) -> dict:
        from masc_engine.runtime.heads import cp_forward

        return cp_forward(
            *(self.xp.asarray(feeds[k]) for k in self.input_names), xp=self.xp, gemm_dtype=self.gemm_dtype
        )

    def run(self, feeds: dict) -> dict:
        to_host = getattr(self.xp, "asnumpy", np.asarray)
        return {k: to_host(v) for k, v in self.run_device(feeds).items()}
