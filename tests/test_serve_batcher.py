"""masc-serve's micro-batcher (serve/batcher.py): bounds, order, isolation of a failing item."""

from __future__ import annotations

import threading
import time

import pytest

from masc_engine.serve.batcher import MicroBatcher, QueueFull


def test_batches_respect_max_batch_and_keep_order():
    sizes, gate = [], threading.Event()

    def fn(items):
        gate.wait(5)  # hold the first batch so the others queue up
        sizes.append(len(items))
        return [x * 10 for x in items]

    b = MicroBatcher(fn, max_batch=4, max_wait_ms=50, max_queue=100)
    futs = [b.submit(i) for i in range(11)]
    gate.set()
    assert [f.result(10) for f in futs] == [i * 10 for i in range(11)]
    b.close(10)
    assert sum(sizes) == 11 and max(sizes) <= 4 and len(sizes) >= 3


def test_max_wait_closes_a_partial_batch():
    b = MicroBatcher(lambda items: items, max_batch=64, max_wait_ms=20)
    t0 = time.perf_counter()
    assert b.submit("x").result(10) == "x"
    assert time.perf_counter() - t0 < 5  # did not wait for 63 more items
    b.close(10)


def test_a_failing_item_fails_alone():
    def fn(items):
        if "bad" in items:
            raise RuntimeError("engine failure on this item")
        return [x.upper() for x in items]

    gate = threading.Event()
    b = MicroBatcher(lambda items: (gate.wait(5), fn(items))[1], max_batch=8, max_wait_ms=50)
    futs = [b.submit(x) for x in ("a", "bad", "c")]
    gate.set()
    assert futs[0].result(10) == "A" and futs[2].result(10) == "C"
    with pytest.raises(RuntimeError, match="this item"):
        futs[1].result(10)
    b.close(10)


def test_queue_bound_and_shutdown_refuse_new_items():
    gate = threading.Event()
    b = MicroBatcher(lambda items: (gate.wait(5), items)[1], max_batch=1, max_wait_ms=0, max_queue=2)
    first = b.submit(0)
    time.sleep(0.2)  # the worker holds item 0
    b.submit(1), b.submit(2)
    with pytest.raises(QueueFull):
        b.submit(3)
    gate.set()
    assert first.result(10) == 0
    b.close(10)
    with pytest.raises(QueueFull):
        b.submit(4)
