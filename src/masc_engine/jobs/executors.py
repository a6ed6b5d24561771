"""Executors: where a job's chunks of rows are scored, behind one small interface.

A *job* is any object with

- ``load(rows, base) -> loaded``: decode a chunk's files (runs in a prefetch thread);
- ``score_chunk(chunk, loaded=None) -> list[dict]``: the chunk's result rows;
- ``stats() -> dict``: counters (``images_encoded``, ``cache_hits``) since it was made.

An *executor* has ``run(chunks) -> iterator of result lists`` (in any order: the caller journals
each list as it arrives and orders the output itself) and ``stats() -> dict`` (the same
counters, summed over wherever the job ran).

- :class:`LocalExecutor`: one job in this process; the next chunk is decoded while the current
  one is inferred.
- :class:`RayExecutor` (``masc-run --executor ray``): Ray actors, one job per worker slot
  (``num_cpus=1`` each, or ``num_gpus=1`` on a GPU), each built on its worker by a picklable
  ``make_job`` factory, so this module knows nothing of what a job scores. The rows equal the
  local executor's (tests/test_ray.py).

On a Ray cluster the bundle directory and the image paths must be readable by every node (a
shared filesystem), and masc-engine installed on every node::

    ray start --head                       # on the head node
    ray start --address HEAD_IP:6379       # on each worker node
    masc-run pairs.csv --bundle /shared/bundles/so400m --executor ray --address auto --out scores.parquet
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BackendUnavailableError

#: How many times one chunk may lose its Ray worker before the run stops (a chunk that kills
#: every worker it meets, e.g. out of memory, must not respawn workers forever).
MAX_CHUNK_LOSSES = 3


@dataclass(frozen=True)
class Chunk:
    """Rows to score together.

    Attributes:
        indices: 1-based row indices in the input table (not necessarily consecutive on resume).
        rows: the rows, one dict each.
        keys: each row's ``row_key`` (identity of its cells and files, for the journal).
        base: the folder relative paths resolve against.
    """

    indices: tuple[int, ...]
    rows: tuple[dict, ...]
    keys: tuple[str, ...]
    base: str


class LocalExecutor:
    """Run a job's chunks in this process, decoding chunk n+1 while chunk n is inferred."""

    def __init__(self, job):
        self.job = job

    def run(self, chunks: Iterable[Chunk]) -> Iterator[list[dict]]:
        """Each chunk's results, in chunk order."""
        chunks = list(chunks)
        if not chunks:
            return
        with ThreadPoolExecutor(1) as prefetch:
            pending = prefetch.submit(self.job.load, chunks[0].rows, chunks[0].base)
            for n, chunk in enumerate(chunks):
                loaded = pending.result()
                if n + 1 < len(chunks):
                    pending = prefetch.submit(self.job.load, chunks[n + 1].rows, chunks[n + 1].base)
                yield self.job.score_chunk(chunk, loaded)

    def stats(self) -> dict:
        """The job's counters."""
        return dict(self.job.stats())


class _ChunkScorer(Protocol):
    """What a Ray actor needs of the job it builds (jobs/pairs ``PairsJob``)."""

    def score_chunk(self, chunk: Chunk, loaded: Any = None) -> list[dict]: ...

    def stats(self) -> Mapping[str, int]: ...


def _actor_class(ray):
    @ray.remote
    class JobActor:
        def __init__(self, make_job: Callable[[], _ChunkScorer]):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. RandomWeightsWarning, already shown by the driver
                self.job = make_job()
            self.reported: Counter[str] = Counter()

        def score(self, chunk: Chunk) -> tuple[list[dict], dict]:
            # Counters travel with the results as deltas, so a restarted actor never reports twice.
            results = self.job.score_chunk(chunk)
            now: Counter[str] = Counter(self.job.stats())
            delta = {k: now[k] - self.reported[k] for k in now}
            self.reported = now
            return results, delta

    return JobActor


class RayExecutor:
    """Run chunks on Ray actors (one job per worker slot).

    Args:
        make_job: a picklable zero-argument factory building the job on a worker.
        gpu: give each actor a GPU (``num_gpus=1``) instead of a CPU.
        address: Ray cluster address (``auto``, ``HOST:6379``); None starts a local Ray.
        workers: number of actors (default: one per CPU, or GPU, slot of the cluster).

    Raises (on :meth:`run`):
        BackendUnavailableError: Ray is not installed.
    """

    def __init__(
        self,
        make_job: Callable[[], object],
        *,
        gpu: bool = False,
        address: str | None = None,
        workers: int | None = None,
    ):
        self.make_job = make_job
        self.gpu = gpu
        self.address = address
        self.workers = workers
        self._stats: Counter = Counter()
        #: Workers lost during :meth:`run` (their chunks were scored again by others).
        self.lost_workers = 0

    def run(self, chunks: Iterable[Chunk]) -> Iterator[list[dict]]:
        """Each chunk's results, in completion order.

        A worker that dies (its process killed, its node lost) costs nothing but time: its
        chunk goes back to the queue and is scored by another worker, and a replacement worker
        is started where the cluster still has a free slot. Each chunk's results are yielded
        exactly once (the driver journals only what it receives). If every worker is gone,
        :class:`BackendUnavailableError` says so; the journal keeps every finished row, and the
        same command finishes the rest.
        """
        try:
            import ray
        except ImportError as e:
            from ..extras import install_hint

            raise BackendUnavailableError(
                f"--executor ray needs Ray, which is not installed: {install_hint('ray')}"
            ) from e
        from ray.exceptions import RayActorError

        queue = deque(chunks)
        if not queue:
            return
        started_here = not ray.is_initialized()
        if started_here:
            num_cpus = None if self.address or not self.workers else int(self.workers)  # None: Ray's default
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False, num_cpus=num_cpus)
        slot = "GPU" if self.gpu else "CPU"
        actor = _actor_class(ray).options(num_gpus=1 if self.gpu else 0, num_cpus=0 if self.gpu else 1, max_restarts=0)
        try:
            n = max(1, min(self.workers or int(ray.cluster_resources().get(slot, 1)), len(queue)))
            idle = [actor.remote(self.make_job) for _ in range(n)]
            inflight: dict = {}
            losses: dict[int, int] = {}
            while queue or inflight:
                while idle and queue:
                    a, c = idle.pop(), queue.popleft()
                    inflight[a.score.remote(c)] = (a, c)
                if not inflight:
                    raise BackendUnavailableError(
                        f"every Ray worker died with {len(queue)} chunk(s) left; the finished rows are in the "
                        "journal: run the same command again to score the rest"
                    )
                (ref,), _ = ray.wait(list(inflight), num_returns=1)
                a, c = inflight.pop(ref)
                try:
                    results, delta = ray.get(ref)
                except RayActorError as e:
                    if getattr(e, "actor_init_failed", False):  # it would fail the same way again, forever
                        raise BackendUnavailableError(f"a Ray worker could not start its scorer: {e}") from e
                    self.lost_workers += 1
                    losses[id(c)] = losses.get(id(c), 0) + 1
                    if losses[id(c)] > MAX_CHUNK_LOSSES:  # a chunk that kills every worker it meets
                        raise BackendUnavailableError(
                            f"the chunk of rows {c.indices[0]}-{c.indices[-1]} lost its Ray worker "
                            f"{losses[id(c)]} times (out of memory?); the finished rows are in the journal: "
                            "run the same command again, or with a smaller --batch-size / --chunk-size"
                        ) from e
                    queue.appendleft(c)  # scored again elsewhere; nothing of it was yielded
                    if ray.available_resources().get(slot, 0) >= 1:
                        idle.append(actor.remote(self.make_job))
                    continue
                idle.append(a)
                self._stats.update(delta)
                yield results
        finally:
            if started_here:
                ray.shutdown()

    def stats(self) -> dict:
        """Counters summed over the workers' reports (``lost_workers`` too, when any)."""
        return {**self._stats, **({"lost_workers": self.lost_workers} if self.lost_workers else {})}
