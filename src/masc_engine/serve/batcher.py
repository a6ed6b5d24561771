"""Dynamic micro-batching: concurrent requests coalesced into one scoring call.

The policy of Triton's dynamic batcher and Ray Serve's ``@serve.batch``: the first waiting item
opens a batch, which closes when it holds ``max_batch`` items or ``max_wait_ms`` after that
first item arrived, whichever comes first. One worker thread runs the batches (inference is
blocking native code that releases the GIL; request threads meanwhile decode the next items).
A request that timed out or was cancelled before its batch started is skipped.

If a batch raises, each of its items is run alone, so one item that breaks the engine fails
only its own request ("one bad row never sinks a batch").
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Sequence


class QueueFull(Exception):
    """The batcher's queue holds ``max_queue`` items: the caller answers 503 with Retry-After."""


@dataclass
class _Pending:
    item: object
    future: Future
    enqueued: float = field(default_factory=time.perf_counter)


class MicroBatcher:
    """Run ``fn(items) -> results`` (same length, same order) on micro-batches of submitted items.

    Args:
        fn: the batch function (``ServiceScorer.score``); called from one thread only.
        max_batch: most items per call (1 disables batching).
        max_wait_ms: longest time, milliseconds, a batch stays open after its first item.
        max_queue: most items waiting; :meth:`submit` raises :class:`QueueFull` past it.
        on_batch: ``on_batch(size, queue_waits_s, seconds)`` after each call (metrics).
    """

    def __init__(
        self,
        fn: Callable[[list], Sequence],
        max_batch: int = 8,
        max_wait_ms: float = 5.0,
        max_queue: int = 256,
        on_batch: Callable | None = None,
    ):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.fn = fn
        self.max_batch = int(max_batch)
        self.max_wait = max(0.0, float(max_wait_ms)) / 1000.0
        self.max_queue = int(max_queue)
        self.on_batch = on_batch
        self._q: queue.Queue[_Pending | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="masc-batcher", daemon=True)
        self._stopping = False
        self._thread.start()

    def depth(self) -> int:
        return self._q.qsize()

    def submit(self, item) -> Future:
        """Queue one item; its future gets the result (or the exception the item raised)."""
        if self._stopping:
            raise QueueFull("the service is shutting down")
        if self._q.qsize() >= self.max_queue:
            raise QueueFull(f"{self._q.qsize()} requests are waiting (--max-queue {self.max_queue})")
        fut: Future = Future()
        self._q.put(_Pending(item, fut))
        return fut

    def close(self, timeout: float | None = None) -> None:
        """Finish every queued item, then stop the worker."""
        self._stopping = True
        self._q.put(None)
        self._thread.join(timeout)

    # ------------------------------------------------------------------ worker

    def _collect(self, first: _Pending) -> tuple[list[_Pending], bool]:
        batch, stop = [first], False
        deadline = first.enqueued + self.max_wait
        while len(batch) < self.max_batch:
            left = deadline - time.perf_counter()
            try:
                nxt = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                stop = True
                break
            batch.append(nxt)
        return batch, stop

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._q.get()
            if first is None:
                break
            batch, stop = self._collect(first)
            # Skip requests whose caller gave up (timeout, disconnect) before the batch started.
            live = [p for p in batch if p.future.set_running_or_notify_cancel()]
            if not live:
                continue
            t0 = time.perf_counter()
            waits = [t0 - p.enqueued for p in live]
            try:
                results = self.fn([p.item for p in live])
                for p, r in zip(live, results):
                    p.future.set_result(r)
            except Exception as e:  # noqa: BLE001 - isolate the item that failed
                if len(live) == 1:
                    live[0].future.set_exception(e)
                else:
                    for p in live:
                        try:
                            p.future.set_result(self.fn([p.item])[0])
                        except Exception as e1:  # noqa: BLE001
                            p.future.set_exception(e1)
            if self.on_batch is not None:
                self.on_batch(len(live), waits, time.perf_counter() - t0)
        # Drain anything queued after the stop marker (submit refuses new items by then).
        while True:
            try:
                left = self._q.get_nowait()
            except queue.Empty:
                break
            if left is not None and left.future.set_running_or_notify_cancel():
                try:
                    left.future.set_result(self.fn([left.item])[0])
                except Exception as e:  # noqa: BLE001
                    left.future.set_exception(e)
