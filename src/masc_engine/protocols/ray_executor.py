"""``masc-run --executor ray``: the same job on a Ray cluster.

Ray actors, one scorer per worker slot (``num_cpus=1`` each, or ``num_gpus=1`` with
``--provider cuda``), each running the very :class:`~masc_engine.protocols.pairs.PairsJob` code the
local executor runs on chunks of rows; the driver journals results as they arrive and writes the
output in input order, so the rows equal the local executor's (tests/test_ray.py).

On a cluster: the bundle directory and the image paths must be readable by every node (a shared
filesystem), and masc-engine installed on every node::

    ray start --head                       # on the head node
    ray start --address HEAD_IP:6379       # on each worker node
    masc-run pairs.csv --bundle /shared/bundles/so400m --executor ray --address auto --out scores.parquet
"""

from __future__ import annotations

from pathlib import Path

from ..engine.device import is_gpu
from ..errors import BackendUnavailableError


def _actor_class(ray):
    @ray.remote
    class ScorerActor:
        def __init__(self, bundle_dir: str, scorer_kwargs: dict, settings: dict, io_workers: int):
            import warnings

            from ..runtime.scorer import Scorer
            from .pairs import PairsJob, RunSettings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scorer = Scorer(bundle_dir, **scorer_kwargs)
            self.job = PairsJob(scorer, RunSettings(**settings), io_workers=io_workers)

        def score(self, chunk: list[int], rows: list[dict], keys: list[str], base: str) -> list[dict]:
            results = self.job.score_rows(rows, Path(base), indices=chunk)
            for r, k in zip(results, keys):
                r["row_key"] = k
            return results

    return ScorerActor


def run_chunks_on_ray(chunks, rows, keys, base, scorer, settings, address=None, workers=None, io_workers=4):
    """Yield each chunk's results (in completion order) computed by Ray actors.

    Raises:
        BackendUnavailableError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as e:
        from ..extras import install_hint

        raise BackendUnavailableError(f"--executor ray needs Ray, which is not installed: {install_hint('ray')}") from e
    from dataclasses import asdict

    if not chunks:
        return
    started_here = not ray.is_initialized()
    if started_here:
        local = {} if address or not workers else {"num_cpus": int(workers)}
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **local)
    try:
        gpu = is_gpu(scorer.backend, scorer.provider)
        resources = ray.cluster_resources()
        slots = int(resources.get("GPU" if gpu else "CPU", 1))
        n = max(1, min(workers or slots, len(chunks)))
        Actor = _actor_class(ray).options(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1)
        kwargs = {"provider": scorer.provider, "stripper": scorer.stripper, "fg_threshold": scorer.fg_threshold,
                  "naflex_max_patches": scorer.image_settings.max_num_patches, "batch_size": scorer.batch_size,
                  "verify": False, "cp_head": scorer.cp_head, "backend": scorer.backend,
                  "precision": scorer.precision, "device_resident": scorer.device is not None,
                  "ort_memory": getattr(scorer, "ort_memory", "lean")}
        actors = [Actor.remote(str(Path(scorer.bundle.path).resolve()), kwargs, asdict(settings), io_workers)
                  for _ in range(n)]
        pool = ray.util.ActorPool(actors)
        jobs = ((c, [rows[i - 1] for i in c], [keys[i - 1] for i in c]) for c in chunks)
        yield from pool.map_unordered(lambda a, j: a.score.remote(j[0], j[1], j[2], str(base)), jobs)
    finally:
        if started_here:
            ray.shutdown()
