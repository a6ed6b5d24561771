"""CUDA graphs in the TensorRT runner, on the fake TensorRT and device (tests/doubles/fake_tensorrt.py),
whose capture records work instead of running it, refuses a sync or an allocation during capture,
and whose replay runs the recorded work on the captured addresses and shapes only.

Checked: a graph per distinct input-shape set, captured after that set's first enqueue and
replayed when it recurs, with outputs bit-identical to plain enqueues, for host, device-resident and
mixed inputs (device ones copied device to device into the graph's own buffers on the slot's
stream); captures counted (never timed); the LRU bound; the fallback to plain enqueues, logged
once, when capture fails; the fake's capture and copy rules themselves. Unverified on a GPU:
docs/gpu.md.
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
from masc_engine.engine.device import DeviceCopyError, HostDevice

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


# ------------------------------------------------------------------ device-resident and mixed inputs


def _on_device(runner, feeds, names=None):
    """``feeds`` with the inputs in ``names`` (all when None) as fake device arrays of the engine's dtypes."""
    dev = fake_tensorrt.NumpyDevice()
    names = runner.input_names if names is None else names
    return {k: dev.from_host(v.astype(runner._dtypes[k])) if k in names else v for k, v in feeds.items()}


@pytest.mark.parametrize("names", [None, ["hidden"], ["key_padding_mask"]], ids=["device", "mixed", "mixed-mask"])
def test_device_resident_inputs_replay_with_the_plain_enqueues_outputs(engines, names):
    graphs, plain = _runners(engines)
    batches = _pool_batches(SIZES, seed=6)  # every batch new values; shapes repeat
    want = [plain.run(b) for b in batches]
    got = [graphs.run_device(_on_device(graphs, b, names)) for b in batches]
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a["pooled"], np.array(b["pooled"]))
    distinct = len(set(SIZES))
    assert graphs.graph_captures == len(fake_tensorrt.CAPTURES) == distinct
    assert graphs.graph_replays == len(SIZES) - distinct
    copies = [c for c in fake_tensorrt.CALLS if c[0] == "copy_on_stream"]
    n_device = len(graphs.input_names) if names is None else len(names)
    assert len(copies) == len(SIZES) * n_device  # the warm-up's and every replay's device inputs
    assert {c[2] for c in copies} == {graphs._slots[0].stream.ptr}  # on the stream the graph runs on


def test_a_replay_copies_the_new_device_values_and_leaves_the_callers_arrays_alone(engines):
    graphs, plain = _runners(engines)
    a, b = _pool_batches([(4, 30), (4, 30)], seed=7)
    da, db = _on_device(graphs, a), _on_device(graphs, b)
    kept = {k: np.array(v) for k, v in da.items()}
    first = np.array(graphs.run_device(da)["pooled"])  # warm-up and capture
    second = np.array(graphs.run_device(db)["pooled"])  # replay: b's values copied into the graph's buffers
    assert graphs.graph_replays == 1
    np.testing.assert_array_equal(first, plain.run(a)["pooled"])
    np.testing.assert_array_equal(second, plain.run(b)["pooled"])
    assert not np.array_equal(first, second)
    for k, v in da.items():  # the caller's arrays are never a graph's buffers
        np.testing.assert_array_equal(v, kept[k])


def test_pipelined_device_inputs_copy_on_each_slots_own_stream(engines):
    graphs, plain = _runners(engines)
    batches = _pool_batches(SIZES, seed=8)
    want = [plain.run(b) for b in batches]
    got = graphs.run_pipelined(batches, prepare=lambda b: _on_device(graphs, b))
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a["pooled"], b["pooled"])
    assert graphs.graph_replays == len(SIZES) - len({(i % 2, s) for i, s in enumerate(SIZES)}) > 0
    streams = {c[2] for c in fake_tensorrt.CALLS if c[0] == "copy_on_stream"}
    assert streams == {s.stream.ptr for s in graphs._slots} and len(streams) == 2


def test_graph_cp_on_device_tokens_scores_equal_with_graphs_on_and_off(engines):
    """The device-resident CP path (runtime/cp_device.py GraphCP: device tokens, host masks, so
    mixed calls) repeats its shapes from one reference to the next: replays score as plain enqueues."""
    from masc_engine.runtime.cp_device import GraphCP

    mod, bundle = engines
    on = mod.load_runner(bundle, "cp", options={"cuda_graphs": "on"})
    off = mod.load_runner(bundle, "cp")
    dev = fake_tensorrt.NumpyDevice()
    rng = np.random.default_rng(9)
    for _ in range(3):  # same shapes, new values
        ref = rng.normal(size=(20, 64)).astype(np.float32)
        w = rng.random(20).astype(np.float32)
        outs = [rng.normal(size=(m, 64)).astype(np.float32) for m in (5, 9, 12)]
        got = GraphCP(on, device=dev).score(ref, w, outs)
        want = GraphCP(off, device=dev).score(ref, w, outs)
        assert [c for c, _ in got] == [c for c, _ in want] and not np.isnan([c for c, _ in got]).any()
    assert on.graph_captures >= 1 and on.graph_replays >= 2 and off.graph_replays == 0


def test_the_device_resident_scorer_scores_equal_with_graphs_on_and_off(engines):
    """The scorer's device path (vision tokens stay on the device and feed pool and CP) with graphs
    on replays on repeated shapes, device to device, and scores as with graphs off, bit for bit."""
    from support import blob_mask
    from masc_engine.export.validate import synthetic_image
    from masc_engine.runtime.scorer import Pair, Scorer

    _, bundle = engines
    sizes = [(224, 288), (160, 480), (224, 288), (160, 480)]  # the second half repeats the shapes
    pairs = [
        Pair(
            synthetic_image(h, w, i),
            blob_mask(h, w, i),
            synthetic_image(w, h, i + 50),
            blob_mask(w, h, i + 50, frac=0.2),
            "a dog on the beach",
            "dog",
        )
        for i, (h, w) in enumerate(sizes)
    ]

    def scores(graphs):
        scorer = Scorer(
            bundle,
            backend="tensorrt",
            provider="cuda",
            device_resident=True,
            array_device=fake_tensorrt.NumpyDevice(),
            batch_size=2,
            backend_options={"cuda_graphs": graphs},
        )
        return [(r.cp, r.pf) for r in scorer.score_batch(pairs[:2]) + scorer.score_batch(pairs[2:])]

    want = scores("off")
    assert not any(c[0] in ("graph.launch", "copy_on_stream") for c in fake_tensorrt.CALLS)
    fake_tensorrt.CALLS.clear()
    got = scores("on")
    assert got == want and not np.isnan(got).any()
    assert any(c[0] == "graph.launch" for c in fake_tensorrt.CALLS)
    assert any(c[0] == "copy_on_stream" for c in fake_tensorrt.CALLS)


class _CupyMemory:
    """``cupy.cuda.MemoryPointer``'s copy, recorded."""

    def __init__(self):
        self.copies = []

    def copy_from_device_async(self, src, size, stream=None):
        self.copies.append((src, size, stream))


class _CupyLike:
    """What ``CupyDevice.copy_on_stream`` reads of a ``cupy.ndarray``: shape, dtype, nbytes, flags, data."""

    def __init__(self, a):
        self.shape, self.dtype, self.nbytes, self.flags, self.data = a.shape, a.dtype, a.nbytes, a.flags, _CupyMemory()


def test_cupy_device_checks_then_queues_one_async_device_copy_on_the_stream():
    """CupyDevice.copy_on_stream (no GPU here: its CuPy call recorded) checks the pair, then calls
    ``dst.data.copy_from_device_async(src.data, nbytes, stream)`` once (CuPy's signature)."""
    from masc_engine.engine.device import CupyDevice

    dev = object.__new__(CupyDevice)  # without CuPy: only copy_on_stream is called
    src, dst, stream = _CupyLike(np.zeros((2, 3), np.float32)), _CupyLike(np.zeros((2, 3), np.float32)), object()
    dev.copy_on_stream(src, dst, stream)
    assert dst.data.copies == [(src.data, 24, stream)] and not src.data.copies
    other = _CupyLike(np.zeros((3, 2), np.float32))
    with pytest.raises(DeviceCopyError, match=r"\(2, 3\) float32 \(24 bytes\) into destination \(3, 2\)"):
        dev.copy_on_stream(src, other, stream)
    assert not other.data.copies


def test_a_device_input_of_another_dtype_is_refused_on_replay_too(engines):
    graphs, _ = _runners(engines)
    (a,) = _pool_batches([(2, 30)], seed=10)
    graphs.run_device(_on_device(graphs, a))
    bad = {**_on_device(graphs, a), "hidden": fake_tensorrt.NumpyDevice().from_host(a["hidden"].astype(np.float64))}
    with pytest.raises(TypeError, match="hidden must be float32"):
        graphs.run_device(bad)


# ------------------------------------------------------------------ the fake's device-to-device copy


def test_a_device_copy_is_ordered_on_its_stream_only():
    dev = fake_tensorrt.NumpyDevice()
    a, b = dev.new_stream(), dev.new_stream()
    src, dst = dev.from_host(np.arange(6, dtype=np.float32)), dev.empty((6,), np.float32)
    out = np.full(6, -1, np.float32)
    dev.copy_on_stream(src, dst, b)  # the wrong stream for the read queued on a
    dev.copy_to_host(dst, out, a)
    a.synchronize()
    assert np.isnan(out).all()  # not ordered before a's work
    assert np.isnan(dst).all()  # and not done before b runs it
    b.synchronize()
    np.testing.assert_array_equal(dst, np.arange(6))
    dst2 = dev.empty((6,), np.float32)
    dev.copy_on_stream(src, dst2, a)  # in stream order: the read after it sees it
    dev.copy_to_host(dst2, out, a)
    a.synchronize()
    np.testing.assert_array_equal(out, np.arange(6))


def test_a_device_copy_during_capture_is_recorded_and_replayed():
    dev = fake_tensorrt.NumpyDevice()
    stream = dev.new_stream()
    src, dst = dev.from_host(np.zeros(3, np.float32)), dev.empty((3,), np.float32)
    stream.begin_capture()
    dev.copy_on_stream(src, dst, stream)  # allocates nothing: allowed during capture
    graph = stream.end_capture()
    assert np.isnan(dst).all()
    src[...] = [1, 2, 3]
    graph.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(dst, [1, 2, 3])


@pytest.mark.parametrize(
    "src,dst",
    [
        (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32)),  # same bytes, other shape
        (np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int32)),  # same bytes, other dtype
        (np.zeros((1, 3), np.float32), np.zeros((2, 3), np.float32)),  # numpy would broadcast
        (np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64)),  # numpy would cast
        (np.zeros((4, 3), np.float32)[::2], np.zeros((2, 3), np.float32)),  # not contiguous
    ],
    ids=["shape", "dtype", "broadcast", "cast", "strided"],
)
@pytest.mark.parametrize("device", ["fake", "host"])
def test_a_mismatched_device_copy_is_refused_before_it_is_queued(src, dst, device):
    if device == "fake":
        dev = fake_tensorrt.NumpyDevice()
        base = dev.from_host(src.base if src.base is not None else src)
        src = base[::2] if src.base is not None else base
        dst = dev.from_host(dst)
    else:
        dev = HostDevice()
    stream = dev.new_stream()
    before = np.array(dst)
    with pytest.raises(DeviceCopyError, match="device copy refused"):
        dev.copy_on_stream(src, dst, stream)
    if device == "fake":
        assert not stream._pending
    np.testing.assert_array_equal(dst, before)


def test_a_device_copy_from_host_memory_is_invalid_on_the_fake():
    dev = fake_tensorrt.NumpyDevice()
    with pytest.raises(fake_tensorrt.CUDARuntimeError, match="cudaErrorInvalidValue"):
        dev.copy_on_stream(np.zeros(3, np.float32), dev.empty((3,), np.float32), dev.new_stream())


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
