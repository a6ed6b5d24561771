"""CUDA graphs in the TensorRT runner, on the fake TensorRT and device (tests/doubles/fake_tensorrt.py),
whose capture records work instead of running it, refuses a sync or an allocation during capture,
and whose replay runs the recorded work on the captured addresses and shapes only.

Checked: a graph per distinct input-shape set, captured after that set's first enqueue and
replayed when it recurs, with outputs bit-identical to plain enqueues; captures counted (never
timed); the LRU bound; the fallback to plain enqueues, logged once, when capture fails; the fake's
capture rules themselves. Unverified on a GPU: docs/gpu.md.
"""

from __future__ import annotations

import logging
import shutil
import sys

import numpy as np
import pytest

from doubles import fake_tensorrt
from masc_engine.engine.backends import trt_graphs
from masc_engine.engine.bundle import Bundle

INFO = ("NVIDIA H200", "9.0")


@pytest.fixture
def engines(monkeypatch, tmp_path, naflex_bundle):
    """The tiny NaFlex bundle's engine set built on the fake TensorRT, and the runner's module."""
    from masc_engine.engine.backends import tensorrt as trt_backend
    from masc_engine.engine.backends import trt_device

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt.make_module("11.4.0.106"))
    monkeypatch.setattr(trt_backend, "CupyDevice", fake_tensorrt.NumpyDevice)
    monkeypatch.setattr(trt_device, "CupyDevice", fake_tensorrt.NumpyDevice)
    monkeypatch.setattr(trt_device, "_query_gpu", lambda device: INFO)
    monkeypatch.setenv("MASC_ENGINE_CACHE", str(tmp_path / "cache"))
    fake_tensorrt.reset()
    dst = tmp_path / "bundle"
    shutil.copytree(naflex_bundle, dst)
    trt_backend.build_engines(dst)
    fake_tensorrt.reset()
    yield trt_backend, Bundle(dst)
    fake_tensorrt.reset()


def _pool_batches(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {"hidden": rng.normal(size=(b, n, 64)).astype(np.float32), "key_padding_mask": rng.random((b, n)) < 0.3}
        for b, n in sizes
    ]


#: Repeated and new shape sets, as the NaFlex pipeline sends them (full and partial batches).
SIZES = [(4, 30), (4, 30), (2, 30), (4, 30), (4, 22), (2, 30), (4, 30), (4, 22)]


def _runners(engines):
    mod, bundle = engines
    return mod.load_runner(bundle, "pool", options={"cuda_graphs": "on"}), mod.load_runner(bundle, "pool")


def test_graph_replay_equals_plain_enqueue_and_captures_once_per_shape_set(engines):
    graphs, plain = _runners(engines)
    batches = _pool_batches(SIZES)
    want = [plain.run(b) for b in batches]
    assert plain.graph_captures == 0 and not fake_tensorrt.CAPTURES
    got = [graphs.run(b) for b in batches]
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a["pooled"], b["pooled"])
    distinct = len(set(SIZES))
    assert graphs.graph_captures == len(fake_tensorrt.CAPTURES) == distinct == 3
    assert graphs.graph_replays == len(SIZES) - distinct
    assert sum(1 for c in fake_tensorrt.CALLS if c[0] == "graph.launch") == len(SIZES) - distinct


def test_device_outputs_of_a_replay_survive_the_next_replay(engines):
    graphs, plain = _runners(engines)
    a, b = _pool_batches([(4, 30), (4, 30)], seed=1)
    first = graphs.run_device(a)
    graphs.run_device(b)
    graphs.run_device(a)
    third = graphs.run_device(b)  # a replay: would overwrite the graph's own output buffers
    assert graphs.graph_replays == 3
    np.testing.assert_array_equal(np.array(first["pooled"]), plain.run(a)["pooled"])
    np.testing.assert_array_equal(np.array(third["pooled"]), plain.run(b)["pooled"])


def test_pipelined_batches_replay_per_slot_with_serial_results(engines):
    graphs, plain = _runners(engines)
    batches = _pool_batches(SIZES, seed=2)
    want = [plain.run(b) for b in batches]
    got = graphs.run_pipelined(batches)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a["pooled"], b["pooled"])
    per_slot = {(i % 2, s) for i, s in enumerate(SIZES)}  # each slot's context captures its own graphs
    assert graphs.graph_captures == len(per_slot)


def test_graphs_kept_are_bounded_least_recently_used_first(engines, monkeypatch):
    monkeypatch.setattr(trt_graphs, "MAX_GRAPHS", 2)
    graphs, plain = _runners(engines)
    sizes = [(4, 30), (2, 30), (4, 30), (4, 22), (2, 30), (4, 30)]
    batches = _pool_batches(sizes, seed=3)
    for b in batches:
        np.testing.assert_array_equal(graphs.run(b)["pooled"], plain.run(b)["pooled"])
    # (4,30) new, (2,30) new, (4,30) replay, (4,22) new (drops (2,30)), (2,30) new (drops (4,30)), (4,30) new
    assert graphs.graph_captures == 5 and graphs.graph_replays == 1
    assert len(graphs._slots[0].graphs) == 2


def test_a_failed_capture_falls_back_to_plain_enqueues_logged_once(engines, caplog):
    graphs, plain = _runners(engines)
    fake_tensorrt.FAIL.add("capture")
    batches = _pool_batches(SIZES, seed=4)
    with caplog.at_level(logging.WARNING, logger=trt_graphs.__name__):
        got = [graphs.run(b) for b in batches]
    fake_tensorrt.FAIL.clear()
    for a, b in zip([plain.run(b) for b in batches], got, strict=True):
        np.testing.assert_array_equal(a["pooled"], b["pooled"])
    assert graphs.graph_captures == graphs.graph_replays == 0 and graphs.cuda_graphs is False
    warnings = [r for r in caplog.records if "CUDA graph capture failed" in r.getMessage()]
    assert len(warnings) == 1 and "cudaErrorStreamCaptureInvalidated" in warnings[0].getMessage()


def test_graphs_are_off_by_default_until_a_gpu_has_run_them(engines):
    from masc_engine.engine.backends.registry import get_backend

    assert get_backend("tensorrt").resolve_options(None)["cuda_graphs"] == "off"
    _, plain = _runners(engines)
    plain.run(_pool_batches([(2, 30)])[0])
    plain.run(_pool_batches([(2, 30)])[0])
    assert plain.cuda_graphs is False and not fake_tensorrt.CAPTURES


# ------------------------------------------------------------------ the fake's capture rules


def test_the_fake_records_work_during_capture_and_replays_it():
    dev = fake_tensorrt.NumpyDevice()
    stream = dev.new_stream()
    dst = dev.empty((3,), np.float32)
    host = np.arange(3, dtype=np.float32)
    stream.begin_capture()
    dev.copy_to_device(host, dst, stream)
    graph = stream.end_capture()
    stream.synchronize()
    assert np.isnan(dst).all()  # recorded, not run
    host += 10  # the graph reads the captured (pinned) source when it runs
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(dst, [10, 11, 12])


@pytest.mark.parametrize(
    "during",
    [
        lambda dev, s: s.synchronize(),
        lambda dev, s: dev.synchronize(),
        lambda dev, s: dev.record_event(s).synchronize(),
        lambda dev, s: dev.empty((4,)),
    ],
    ids=["stream sync", "device sync", "event sync", "allocation"],
)
def test_a_sync_or_allocation_during_capture_fails_as_cuda_does(during):
    dev = fake_tensorrt.NumpyDevice()
    stream = dev.new_stream()
    stream.begin_capture()
    with pytest.raises(fake_tensorrt.CUDARuntimeError, match="cudaErrorStreamCaptureUnsupported"):
        during(dev, stream)
    with pytest.raises(fake_tensorrt.CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
        stream.end_capture()
    assert not stream.is_capturing()


def _context(engines, shapes):
    """A user-managed pool context with shapes, buffers and memory set, and its buffers."""
    mod, bundle = engines
    runner = mod.load_runner(bundle, "pool", options={"cuda_graphs": "off"})
    dev = fake_tensorrt.NumpyDevice()
    ctx = runner.engine.create_execution_context(fake_tensorrt.ExecutionContextAllocationStrategy.USER_MANAGED)
    feeds = _pool_batches([shapes], seed=5)[0]
    bufs = {k: dev.from_host(feeds[k].astype(runner._dtypes[k])) for k in runner.input_names}
    for k, v in bufs.items():
        assert ctx.set_input_shape(k, v.shape)
    for k in runner.output_names:
        bufs[k] = dev.empty(tuple(ctx.get_tensor_shape(k)), runner._dtypes[k])
    mem = dev.empty((ctx.update_device_memory_size_for_shapes(),), np.uint8)
    ctx.set_device_memory(dev.ptr(mem), mem.nbytes)
    for k, v in bufs.items():
        assert ctx.set_tensor_address(k, dev.ptr(v))
    return runner, dev, ctx, bufs, mem


def test_capturing_execute_before_a_warm_up_enqueue_invalidates_the_capture(engines):
    runner, dev, ctx, bufs, mem = _context(engines, (2, 30))
    stream = dev.new_stream()
    stream.begin_capture()
    assert ctx.execute_async_v3(stream.ptr)
    with pytest.raises(fake_tensorrt.CUDARuntimeError, match="before an enqueue at these shapes"):
        stream.end_capture()


def test_a_binding_change_during_capture_invalidates_it(engines):
    runner, dev, ctx, bufs, mem = _context(engines, (2, 30))
    stream = dev.new_stream()
    ctx.execute_async_v3(stream.ptr)
    other = dev.zeros((2, 30, 64))
    stream.begin_capture()
    ctx.set_tensor_address("hidden", dev.ptr(other))
    ctx.execute_async_v3(stream.ptr)
    with pytest.raises(fake_tensorrt.CUDARuntimeError, match="set_tensor_address"):
        stream.end_capture()


def test_a_replay_uses_the_captured_addresses_not_the_bound_ones(engines):
    runner, dev, ctx, bufs, mem = _context(engines, (2, 30))
    stream = dev.new_stream()
    ctx.execute_async_v3(stream.ptr)
    stream.begin_capture()
    ctx.execute_async_v3(stream.ptr)
    graph = stream.end_capture()
    stream.synchronize()
    captured = np.array(bufs["pooled"])
    fresh = dev.empty(bufs["pooled"].shape)
    ctx.set_tensor_address("pooled", dev.ptr(fresh))  # a re-bind after capture: the graph ignores it
    graph.launch(stream)
    stream.synchronize()
    assert np.isnan(fresh).all()
    np.testing.assert_array_equal(bufs["pooled"], captured)


def test_a_replay_after_a_shape_change_runs_the_captured_shapes(engines):
    runner, dev, ctx, bufs, mem = _context(engines, (2, 30))
    stream = dev.new_stream()
    ctx.execute_async_v3(stream.ptr)
    stream.begin_capture()
    ctx.execute_async_v3(stream.ptr)
    graph = stream.end_capture()
    stream.synchronize()
    for k in runner.input_names:  # new shapes set on the context, no new capture
        ctx.set_input_shape(k, (2, 22, *bufs[k].shape[2:]))
    graph.launch(stream)
    stream.synchronize()
    assert fake_tensorrt.RUNS[-1] == {k: tuple(bufs[k].shape) for k in runner.input_names}  # (2, 30): the old ones
