"""Exactly once under executor faults: a Ray worker node lost in the middle of
``masc-run --executor ray`` on a two-node local cluster (a head and a worker raylet on this
machine, started and stopped here by ``ray.cluster_utils.Cluster``) loses and duplicates no row,
and the output equals a local run's. Also: the run records and counters the workers report.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from masc_engine.jobs.pairs import RunOptions, run_pairs
from masc_engine.jobs.results import journal_path, meta_path, read_output
from masc_engine.runtime.scorer import Scorer
from test_resume_and_cache import _big_pairs

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'masc-engine[ray]')")

#: Bound on the whole test (cluster start, two runs, shutdown); it takes ~40 s on 2 idle cores.
TIMEOUT_S = 300


@pytest.fixture
def two_node_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes(timeout=120)
        yield cluster, worker
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _journal_rows(path) -> int:
    try:
        return sum('"row_index"' in line for line in path.read_text(encoding="utf-8").splitlines())
    except OSError:
        return 0


@pytest.fixture
def watchdog():
    """Bound the test in time: past TIMEOUT_S the process dumps its stacks and exits (a hung
    Ray call fails CI instead of stalling it)."""
    import faulthandler

    faulthandler.dump_traceback_later(TIMEOUT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.slow
def test_worker_node_lost_mid_run_no_row_lost_or_duplicated(naflex_bundle, tmp_path, watchdog, two_node_cluster):
    cluster, worker = two_node_cluster
    pairs = _big_pairs(tmp_path, copies=2)  # 40 rows
    local, remote = tmp_path / "local.csv", tmp_path / "ray.csv"
    run_pairs(pairs, Scorer(naflex_bundle), local, options=RunOptions(chunk_size=2, progress=False))

    killed = threading.Event()
    t0 = time.time()

    def kill_worker_node():
        # As soon as the first chunks are journaled (the workers are busy), the worker node dies.
        while _journal_rows(journal_path(remote)) < 4 and time.time() - t0 < TIMEOUT_S / 2:
            time.sleep(0.02)
        cluster.remove_node(worker, allow_graceful=False)
        killed.set()

    killer = threading.Thread(target=kill_worker_node, daemon=True)
    killer.start()
    s = run_pairs(
        pairs,
        Scorer(naflex_bundle),
        remote,
        options=RunOptions(chunk_size=2, executor="ray", ray_address=cluster.address, progress=False),
    )
    killer.join(timeout=60)
    assert killed.is_set(), "the worker node was never removed"
    assert s.lost_workers >= 1, "no chunk was in flight on the lost node: the fault was not exercised"
    a, b = read_output(local), read_output(remote)
    assert [r["row_index"] for r in b] == [str(i) for i in range(1, 41)]  # each row exactly once, in order
    for x, y in zip(a, b):
        assert {k: x[k] for k in x if k != "row_key"} == {k: y[k] for k in y if k != "row_key"}
    meta = json.loads(meta_path(remote).read_text())
    run = meta["runs"][-1]
    assert run["executor"] == "ray" and run["lost_workers"] == s.lost_workers and run["rows_scored"] == 40
    # the workers' own counters come back to the driver (22 distinct images in the pairs)
    assert run["images_encoded"] >= 22 and meta["counts"]["images_encoded"] == run["images_encoded"]
    assert not journal_path(remote).exists()
