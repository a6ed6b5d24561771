"""A fake ``tensorrt`` module and a numpy "device", as unkind as the real ones where it matters.

What it stands in for cannot run here (TensorRT needs libnvinfer and a GPU; CuPy needs CUDA). Its
"engine" is the ONNX graph itself: the serialized plan names the ONNX file and the profiles, and the
execution context runs the graph with ONNX Runtime CPU, so a TrtRunner over the fake gives real
numbers, checked against ONNX Runtime. Where the hardware is unkind, so is the fake:

- **Asynchronous.** ``execute_async_v3`` and the device's ``copy_to_device`` / ``copy_to_host`` /
  ``copy_on_stream`` only queue work on the stream whose handle they get; it is done when that stream's
  ``synchronize()`` is called, never before. Output buffers start as NaN, so reading them before
  that gives stale data every time (not by a race). Each task is logged on a fake clock
  (``INTERVALS``), so overlap is counted from the log, not from wall time. ``execute_async_v3`` takes the stream *handle* (an int), as
  pybind11 enforces: a stream object is a ``TypeError``.
- **CUDA graphs, as CUDA captures them** (CuPy's ``Stream.begin_capture()`` / ``end_capture()``
  / ``Graph.launch(stream)``). Work queued on a capturing stream is recorded, not run. A
  synchronize (stream, event or device) or a device allocation during any capture raises
  :class:`CUDARuntimeError` ``cudaErrorStreamCaptureUnsupported`` and invalidates it; a context
  whose binding addresses, context memory or input shapes change during capture, or whose
  ``execute_async_v3`` is captured before one plain enqueue at its current shapes (TensorRT's
  shape-dependent setup), invalidates it: ``end_capture()`` then raises
  ``cudaErrorStreamCaptureInvalidated``. ``Graph.launch`` queues the recorded work again with the
  addresses, shapes and context memory captured, whatever the context holds now, so a runner that
  re-binds new buffers instead of copying into the captured ones reads stale outputs, and one that
  replays a graph for other shapes gets the old shapes' work.
- **Device memory.** Every device allocation is charged to a ledger of ``MEMORY_LIMIT`` bytes
  (freed when the array is collected); past it allocation raises :class:`OutOfMemoryError` (as
  CuPy does) and ``create_execution_context`` returns ``None`` (as TensorRT does) when a static
  context's reservation (its profile maxima) does not fit. A user-managed context runs only with
  memory given by ``set_device_memory`` at least as large as
  ``update_device_memory_size_for_shapes()`` says, else execution reports ``False``.
- **Memory that follows the shapes only when asked.** A user-managed context's
  ``update_device_memory_size_for_shapes()`` gives the figure for the shapes set only for an engine
  built with ``PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10``; otherwise the profile maximum.
- **Strong typing.** A build returns no plan (reasons in ``BUILD_ERRORS``) for a graph with a
  tensor of a type TensorRT has no DataType for (uint16, float8 E5M2, ...) or an op whose inputs
  differ in type (a strongly typed network inserts no casts).
- **Explicit quantization.** A build returns no plan for Q/DQ placement TensorRT 11 does not
  take (:func:`qdq_placement_errors`: constant positive scales, zero points of 0 in INT8 /
  FLOAT8E4M3FN, Q feeding only DQ, per-tensor activation scales, per-channel weight scales on the
  output channels).
- **Parser.** ``parse_from_file`` rejects ops the ONNX parser does not import: any op of another
  domain (``com.microsoft`` contrib ops of the fused ``ort-cpu`` graphs) and any ONNX op outside
  ``SUPPORTED_OPS``, listing the node and op per error, as ``ParserError``.
- **Profiles.** ``IOptimizationProfile.set_shape`` raises ``RuntimeError`` unless min <= opt <= max
  in every dimension (the real binding's "Shape provided for max is inconsistent with other
  shapes."); ``add_optimization_profile`` returns -1 for an empty profile; a build whose profiles
  miss a dynamic input of the network, or with no profile at all, returns ``None``; a context's
  ``set_input_shape`` returns ``False`` for a shape outside profile 0.
- **Failures on demand.** Names in ``FAIL`` make the call of that name report failure the way the
  real one does (``False``, ``None``, -1 or 0): ``set_input_shape``, ``set_tensor_address``,
  ``execute_async_v3``, ``build`` (no plan), ``add_optimization_profile``,
  ``create_execution_context``, ``create_network`` (None), ``deserialize_cuda_engine`` (None),
  ``update_device_memory_size_for_shapes`` (0), ``capture`` (``end_capture`` raises); ``data_dependent`` makes output shapes -1. Context
  growth out of memory comes from ``MEMORY_LIMIT``.

Every class, method, property and enum member it offers exists in the real TensorRT 11.4 bindings
with a compatible signature (tests/test_trt_conformance.py checks it against
tests/data/tensorrt_11_surface.json). It cannot tell whether real TensorRT computes what the graph
says: that is for a GPU run (bench/gpu_check.py).
"""

from __future__ import annotations

import enum
import itertools
import json
import threading
import time
import types
import weakref
from pathlib import Path

import numpy as np

from masc_engine.engine.device import check_copy

#: ONNX ops the ONNX-TensorRT parser imports: its ``DEFINE_BUILTIN_OP_IMPORTER`` registrations, read
#: from onnxOpImporters.cpp by scripts/extract_onnx_trt_ops.py into tests/data/onnx_tensorrt_ops.json.
#: The sources read are onnx-tensorrt's 10.1-GA release (commit 96e7811): the newest ref of
#: github.com/onnx/onnx-tensorrt that could be fetched here (its main branch stops at 10.0-GA); the
#: parser pinned with TensorRT 11.4 could not be read, and releases add importers, so the 11.4
#: parser imports at least these. Rerun the script against the 11.4 release when it can be fetched.
OPS_FILE = Path(__file__).resolve().parents[1] / "data" / "onnx_tensorrt_ops.json"
SUPPORTED_OPS = frozenset(json.loads(OPS_FILE.read_text())["ops"])

#: Seconds of wall time a queued kernel or copy takes when its stream is synchronized.
LATENCY_S = 0.01
#: Fake-clock seconds per queued task, by kind (``execute``, ``h2d``, ``d2h``; ``task`` otherwise).
DURATION_S = {"execute": 0.030, "h2d": 0.003, "d2h": 0.001, "d2d": 0.001, "task": 0.001}
#: The host's fake clock (one cell, so that it can be advanced in place) and the interval log:
#: ``(stream handle or "host", label, start, end)`` in fake seconds.
HOST_CLOCK = [0.0]
INTERVALS: list[tuple] = []
_CLOCK_LOCK = threading.Lock()
#: Bytes of fake device memory.
MEMORY_LIMIT = 1 << 40
FAIL: set = set()
BUILDS: list[dict] = []  # what each build was asked for (tests read it)
RUNS: list[dict] = []  # input shapes of each execution
BUILD_ERRORS: list[str] = []  # why builds returned no plan (the real builder logs it)
#: Every call on an execution context and on the device, in order (tests read it).
CALLS: list[tuple] = []
#: The stream of every capture that ended with a graph (tests count them).
CAPTURES: list[int] = []
LOGGERS: list = []  # every trt.Logger made


def reset(latency_s: float = 0.01, memory_limit: int = 1 << 40) -> None:
    """Back to a clean, generous fake (tests call it first)."""
    global LATENCY_S, MEMORY_LIMIT
    LATENCY_S, MEMORY_LIMIT = latency_s, memory_limit
    for registry in (FAIL, BUILDS, RUNS, CALLS, CAPTURES, LOGGERS, INTERVALS, BUILD_ERRORS):
        registry.clear()
    HOST_CLOCK[0] = 0.0
    for stream in list(FakeStream._registry.values()):  # the clock starts again for every stream
        stream._ready_at = 0.0
        stream._captured = stream._capture_invalid = None  # no capture survives a reset
    _CAPTURING.clear()


class CUDARuntimeError(RuntimeError):
    """As ``cupy.cuda.runtime.CUDARuntimeError``: a CUDA runtime call failed (the message starts
    with the error's name)."""


#: Streams in capture now (a sync or allocation anywhere during a capture is refused, as in CUDA's
#: global capture mode, CuPy's default).
_CAPTURING: "weakref.WeakSet[FakeStream]" = weakref.WeakSet()


def _refuse_during_capture(what: str) -> None:
    """A synchronising or allocating call: refused, and every capture invalidated, while one runs."""
    if len(_CAPTURING):
        for stream in list(_CAPTURING):
            stream._capture_invalid = f"{what} during capture"
        raise CUDARuntimeError(
            f"cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing ({what})"
        )


def _invalidate_captures(what: str) -> None:
    """A change the captured work depends on: every capture running now is invalidated."""
    for stream in list(_CAPTURING):
        stream._capture_invalid = f"{what} during capture"


class OutOfMemoryError(MemoryError):
    """As ``cupy.cuda.memory.OutOfMemoryError``: an allocation past the device's memory."""


class _Ledger:
    def __init__(self):
        self.used = 0
        self._lock = threading.Lock()

    def charge(self, nbytes: int) -> None:
        with self._lock:
            if self.used + nbytes > MEMORY_LIMIT:
                raise OutOfMemoryError(
                    f"Out of memory allocating {nbytes:,} bytes (allocated so far: {self.used:,} "
                    f"bytes, limit {MEMORY_LIMIT:,})"
                )
            self.used += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


LEDGER = _Ledger()
_MEMORY: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()  # address -> array


# ---------------------------------------------------------------- streams


class FakeStream:
    """A CUDA stream (``cupy.cuda.Stream``): work queued on it is *not done* until the stream is
    synchronized. ``synchronize()`` runs the queued work in order (``LATENCY_S`` of wall time per
    task, and ``DURATION_S`` of the fake clock, recorded in ``INTERVALS``) and raises an error a task
    hit (as CUDA reports an asynchronous error at the next synchronize); before it, buffers the
    work writes hold their previous contents (NaN for a fresh output), whatever the wall time.

    The fake clock: a task starts at the later of the host's clock when it was queued
    (:data:`HOST_CLOCK`, advanced by :func:`host_work` and by each synchronize's wait) and the end
    of the stream's previous task; :data:`INTERVALS` logs ``(stream, label, start, end)``."""

    _handles = itertools.count(0x7F00_0000)
    _registry: "weakref.WeakValueDictionary[int, FakeStream]" = weakref.WeakValueDictionary()

    def __init__(self):
        self.ptr = next(self._handles)
        self._pending: list = []
        self._lock = threading.Lock()
        self._ready_at = 0.0
        self.queued = 0  # tasks ever queued (an event records the count)
        self.done = 0
        self._registry[self.ptr] = self
        self._captured: list | None = None  # the recorded work while capturing
        self._capture_invalid: str | None = None

    @classmethod
    def from_handle(cls, handle: int) -> "FakeStream":
        stream = cls._registry.get(handle)
        if stream is None:  # the legacy default stream (0) or a stream made elsewhere
            stream = cls._default
        return stream

    def enqueue(self, fn, label: str = "task") -> None:
        if self._captured is not None:  # capturing: recorded, not run
            self._captured.append((fn, label))
            return
        with self._lock:
            start = max(self._ready_at, _host_now())
            self._ready_at = start + DURATION_S.get(label.split(":")[0], DURATION_S["task"])
            self._pending.append((fn, label, start, self._ready_at))
            self.queued += 1

    def synchronize(self) -> None:
        CALLS.append(("stream.synchronize", self.ptr))
        _refuse_during_capture("cudaStreamSynchronize")
        self.run_until(None)

    def begin_capture(self, mode=None) -> None:
        """As ``cupy.cuda.Stream.begin_capture``: work queued from now on is recorded."""
        CALLS.append(("begin_capture", self.ptr))
        if self._captured is not None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is already capturing")
        self._captured, self._capture_invalid = [], None
        _CAPTURING.add(self)

    def end_capture(self) -> "FakeGraph":
        """As ``cupy.cuda.Stream.end_capture``: the recorded work as a graph; raises when the capture
        was invalidated (the stream leaves capture mode either way)."""
        CALLS.append(("end_capture", self.ptr))
        if self._captured is None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        work, invalid = self._captured, self._capture_invalid
        if "capture" in FAIL:
            invalid = "capture refused (FAIL)"
        self._captured, self._capture_invalid = None, None
        _CAPTURING.discard(self)
        if invalid is not None:
            raise CUDARuntimeError(f"cudaErrorStreamCaptureInvalidated: {invalid}")
        CAPTURES.append(self.ptr)
        return FakeGraph(work)

    def is_capturing(self) -> bool:
        """As ``cupy.cuda.Stream.is_capturing``."""
        return self._captured is not None

    def run_until(self, count) -> None:
        """Do the queued tasks up to task number ``count`` (all when None), in order."""
        with self._lock:
            n = len(self._pending) if count is None else max(0, count - self.done)
            pending, self._pending = self._pending[:n], self._pending[n:]
            self.done += len(pending)
            ready_at = pending[-1][3] if pending else 0.0
        error = None
        for fn, label, start, end in pending:
            time.sleep(LATENCY_S)
            INTERVALS.append((self.ptr, label, start, end))
            if error is None:
                try:
                    fn()
                except Exception as e:  # noqa: BLE001 - reported at synchronize
                    error = e
        _host_advance_to(ready_at)
        if error is not None:
            raise RuntimeError(f"an asynchronous task on stream {self.ptr:#x} failed: {error}") from error


class FakeGraph:
    """``cupy.cuda.Graph``: the work recorded by one capture, with what it captured (addresses,
    shapes, context memory); ``launch`` queues it again on a stream."""

    def __init__(self, work: list):
        self._work = list(work)

    def launch(self, stream=None) -> None:
        """Queue the recorded work on ``stream`` (CuPy's current stream, here the default, when None)."""
        stream = FakeStream._default if stream is None else stream
        CALLS.append(("graph.launch", stream.ptr))
        for fn, label in self._work:
            stream.enqueue(fn, label)


class FakeEvent:
    """``cupy.cuda.Event`` recorded on a stream: ``synchronize()`` does that stream's tasks queued
    before the record (not later ones) and waits for them on the fake clock."""

    def __init__(self, stream: FakeStream):
        self._stream, self._count = stream, stream.queued

    def synchronize(self) -> None:
        CALLS.append(("event.synchronize", self._stream.ptr))
        _refuse_during_capture("cudaEventSynchronize")
        self._stream.run_until(self._count)


def _host_now() -> float:
    with _CLOCK_LOCK:
        return HOST_CLOCK[0]


def _host_advance_to(t: float) -> None:
    with _CLOCK_LOCK:
        HOST_CLOCK[0] = max(HOST_CLOCK[0], t)


def host_work(label: str, seconds: float) -> None:
    """Record ``seconds`` of host work on the fake clock (preprocessing, stacking, staging): it
    runs from the host clock's now, which it advances."""
    with _CLOCK_LOCK:
        start = HOST_CLOCK[0]
        HOST_CLOCK[0] = start + seconds
    INTERVALS.append(("host", label, start, start + seconds))


FakeStream._default = FakeStream()


# ---------------------------------------------------------------- enums and module functions


class BuilderFlag(enum.IntEnum):
    TF32 = 5  # TensorRT 11 keeps TF32; FP16, BF16, INT8, FP8, INT4 and OBEY_PRECISION_CONSTRAINTS are gone


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1


class PreviewFeature(enum.IntEnum):
    ALIASED_PLUGIN_IO_10_03 = 0
    RUNTIME_ACTIVATION_RESIZE_10_10 = 1


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class ExecutionContextAllocationStrategy(enum.IntEnum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


float32, float16, bfloat16 = "float32", "float16", "bfloat16"


def nptype(trt_type):
    """As the real ``tensorrt.nptype`` (11.4 ``__init__.py``): no numpy type for bfloat16."""
    mapping = {
        "float32": np.float32,
        "float16": np.float16,
        "int8": np.int8,
        "int32": np.int32,
        "int64": np.int64,
        "bool": np.bool_,
        "uint8": np.uint8,
    }
    if trt_type in mapping:
        return mapping[trt_type]
    raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")


class Logger:
    WARNING = 2

    def __init__(self, min_severity=WARNING):
        self.min_severity = min_severity
        LOGGERS.append(self)


# ---------------------------------------------------------------- builder side


class _ParserError:
    def __init__(self, node: int, op: str, desc: str):
        self._node, self._op, self._desc = node, op, desc

    def node(self):
        return self._node

    def node_operator(self):
        return self._op

    def desc(self):
        return self._desc


class _Network:
    """What the parser read: the ONNX path, its node count (``num_layers``) and its inputs."""

    def __init__(self, flags):
        self._flags, self._onnx_path, self._num_layers, self._inputs = flags, None, 0, {}

    @property
    def num_layers(self):
        return self._num_layers


class OnnxParser:
    def __init__(self, network, logger):
        self._network = network
        self._errors: list[_ParserError] = []

    @property
    def num_errors(self):
        return len(self._errors)

    def get_error(self, index):
        return self._errors[index]

    def parse_from_file(self, model):
        import onnx

        m = onnx.load(model, load_external_data=False)
        self._errors = []
        for i, n in enumerate(m.graph.node):
            if n.domain not in ("", "ai.onnx"):
                self._errors.append(
                    _ParserError(
                        i,
                        n.op_type,
                        f"No importer registered for op: {n.op_type} (domain {n.domain}); plugin not found",
                    )
                )
            elif n.op_type not in SUPPORTED_OPS:
                self._errors.append(_ParserError(i, n.op_type, f"No importer registered for op: {n.op_type}"))
        if self._errors:
            return False
        net = self._network
        net._onnx_path, net._num_layers = model, len(m.graph.node)
        init = {t.name for t in m.graph.initializer}
        net._inputs = {
            i.name: [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim]
            for i in m.graph.input
            if i.name not in init
        }
        return True


class _Profile:
    def __init__(self):
        self._shapes = {}

    def set_shape(self, input, min, opt, max):  # noqa: A002 - the binding's parameter names
        lo, mid, hi = list(min), list(opt), list(max)
        if not len(lo) == len(mid) == len(hi):
            raise RuntimeError("Shape provided for opt is inconsistent with other shapes.")
        if any(a < 0 for a in lo) or any(a > b for a, b in zip(lo, mid)):
            raise RuntimeError("Shape provided for min is inconsistent with other shapes.")
        if any(b > c for b, c in zip(mid, hi)):
            raise RuntimeError("Shape provided for max is inconsistent with other shapes.")
        self._shapes[input] = (lo, mid, hi)

    def __bool__(self):
        return bool(self._shapes)


class _TimingCache:
    def __init__(self, blob):
        self.builds = int(blob.decode().split(":")[1]) if blob else 0

    def serialize(self):
        return _HostMemory(f"fake-timing-cache:{self.builds}".encode())


class _HostMemory:
    """``IHostMemory``: a buffer (``bytes(plan)`` reads it)."""

    def __init__(self, data: bytes):
        self._data = data

    def __bytes__(self):
        return self._data

    @property
    def nbytes(self):
        return len(self._data)


class _Config:
    def __init__(self):
        self._flags = {BuilderFlag.TF32}  # TensorRT's default
        self._profiles, self._cache, self._pool, self._preview = [], None, {}, set()

    def set_memory_pool_limit(self, pool, pool_size):
        self._pool[pool] = pool_size

    def set_flag(self, flag):
        self._flags.add(flag)

    def clear_flag(self, flag):
        self._flags.discard(flag)

    def set_preview_feature(self, feature, enable):
        (self._preview.add if enable else self._preview.discard)(PreviewFeature(feature))

    def get_preview_feature(self, feature):
        return PreviewFeature(feature) in self._preview

    def add_optimization_profile(self, profile):
        if "add_optimization_profile" in FAIL or not profile:
            return -1
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache):
        return _TimingCache(bytes(serialized_timing_cache))

    def set_timing_cache(self, cache, ignore_mismatch):
        self._cache = cache
        return True

    def get_timing_cache(self):
        return self._cache


class Builder:
    def __init__(self, logger):
        self._logger = logger

    def create_network(self, flags=0):
        if "create_network" in FAIL:
            return None  # the real one logs the reason and returns None
        return _Network(flags)

    def create_builder_config(self):
        return _Config()

    def create_optimization_profile(self):
        return _Profile()

    def build_serialized_network(self, network, config):
        if config._cache is not None:
            config._cache.builds += 1
        dynamic = {n for n, dims in network._inputs.items() if -1 in dims}
        covered = all(
            dynamic <= set(p._shapes) and all(_fits_rank(network._inputs[n], p._shapes[n]) for n in dynamic)
            for p in config._profiles
        )
        if "build" in FAIL or (dynamic and not config._profiles) or not covered:
            return None  # the real builder logs why and returns no plan
        import onnx

        model = onnx.load(network._onnx_path, load_external_data=False)
        qdq = qdq_placement_errors(model)
        BUILD_ERRORS.extend(qdq)
        if strong_typing_errors(model) or qdq:
            return None  # the real builder logs the layer whose input types it cannot take
        dtypes = {onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer}
        BUILDS.append(
            {
                "onnx": network._onnx_path,
                "flags": set(config._flags),
                "strongly_typed": network._flags == 1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED),
                "preview": {f.name for f in config._preview},
                "initializer_dtypes": dtypes,
                "profiles": [p._shapes for p in config._profiles],
                "cache_builds": config._cache.builds if config._cache else None,
            }
        )
        resize = PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10 in config._preview
        plan = {
            "onnx": network._onnx_path,
            "profiles": [{k: v for k, v in p._shapes.items()} for p in config._profiles],
            "activation_resize": resize,
        }
        return _HostMemory(json.dumps(plan).encode())


#: ONNX element types TensorRT 11 takes: those it has a DataType for (FLOAT, UINT8, INT8, INT32, BOOL,
#: FLOAT16, INT64, BFLOAT16, FLOAT8E4M3FN, INT4, FLOAT4E2M1) and DOUBLE, which the parser casts to FLOAT
#: (onnx-tensorrt docs/operators.md); anything else (FLOAT8E5M2, UINT16, INT16, ...) it cannot import.
TRT_ONNX_TYPES = frozenset({1, 2, 3, 6, 7, 9, 10, 11, 16, 17, 22, 23})
#: Ops whose listed inputs must share one type in a strongly typed network (no implicit casts).
SAME_TYPE_INPUTS = {
    "Add": (0, 1),
    "Sub": (0, 1),
    "Mul": (0, 1),
    "Div": (0, 1),
    "MatMul": (0, 1),
    "Gemm": (0, 1),
    "Where": (1, 2),
    "Max": (0, 1),
    "Min": (0, 1),
}


def strong_typing_errors(model) -> list[str]:
    """Why a strongly typed network cannot take this graph: a tensor of a type TensorRT has no
    DataType for, or an op whose inputs differ in type (strong typing inserts no casts). Types come
    from ONNX shape inference; an empty list when the graph is fine."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types_ = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]}
    types_.update({t.name: t.data_type for t in g.initializer})
    errors = [
        f"tensor {n!r} has ONNX type {onnx.TensorProto.DataType.Name(t)}, which TensorRT has no DataType for"
        for n, t in types_.items()
        if t and t not in TRT_ONNX_TYPES
    ]
    for node in g.node:
        idx = SAME_TYPE_INPUTS.get(node.op_type, ())
        got = {types_.get(node.input[i], 0) for i in idx if i < len(node.input)} - {0}
        if len(got) > 1:
            errors.append(
                f"{node.op_type} node {node.name!r}: input types "
                f"{sorted(onnx.TensorProto.DataType.Name(t) for t in got)} differ (strongly typed)"
            )
    BUILD_ERRORS.extend(errors)
    return errors


def qdq_placement_errors(model) -> list[str]:
    """Where a graph's Q/DQ nodes break what TensorRT 11's explicit quantization takes: a
    QuantizeLinear / DequantizeLinear scale that is not a positive float32 initializer, a zero point
    that is not an all-zero initializer of the quantized type, a quantized type other than
    FLOAT8E4M3FN / INT8 (FLOAT8E5M2 has no DataType), a Q whose output feeds anything but a DQ, a DQ
    whose input is neither a Q's output nor a quantized initializer, a per-channel (non-scalar)
    activation scale, and a per-channel weight whose axis is not a MatMul weight's output channels
    (the last axis). Empty when the placement is valid."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    producers = {o: n for n in g.node for o in n.output}
    errors = []
    for n in g.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        where = f"{n.op_type} {n.name!r}"
        scale = inits.get(n.input[1]) if len(n.input) > 1 else None
        if scale is None or scale.data_type != 1 or not (numpy_helper.to_array(scale) > 0).all():
            errors.append(f"{where}: the scale must be a positive float32 constant")
            continue
        zp = inits.get(n.input[2]) if len(n.input) > 2 else None
        if zp is None or zp.data_type not in (3, 17):
            errors.append(
                f"{where}: the zero point must be an INT8 or FLOAT8E4M3FN constant (FLOAT8E5M2 and "
                "missing zero points are not taken)"
            )
        elif numpy_helper.to_array(zp).astype(np.float32).any():
            errors.append(f"{where}: the zero point must be 0")
        axis = {a.name: a.i for a in n.attribute}.get("axis", 1)
        if n.op_type == "QuantizeLinear":
            if any(c.op_type != "DequantizeLinear" for c in consumers.get(n.output[0], [])):
                errors.append(f"{where}: its output feeds an op other than DequantizeLinear")
            if len(scale.dims) != 0 and inits.get(n.input[0]) is None:
                errors.append(f"{where}: an activation takes one scale per tensor, not {list(scale.dims)}")
            continue
        src = inits.get(n.input[0])
        if src is None and getattr(producers.get(n.input[0]), "op_type", None) != "QuantizeLinear":
            errors.append(f"{where}: its input is neither a QuantizeLinear output nor a quantized constant")
        if src is not None and len(scale.dims) != 0:
            users = [c for c in consumers.get(n.output[0], []) if c.op_type == "MatMul" and c.input[1] == n.output[0]]
            if any(axis % len(src.dims) != len(src.dims) - 1 for _ in users):
                errors.append(
                    f"{where}: per-channel weight scales must run along the MatMul's output channels "
                    f"(axis {len(src.dims) - 1}), not axis {axis}"
                )
    return errors


def _fits_rank(dims, shapes) -> bool:
    lo, _, hi = shapes
    return len(dims) == len(lo) and all(d == -1 or lo[i] == hi[i] == d for i, d in enumerate(dims))


# ---------------------------------------------------------------- runtime (ONNX Runtime inside)


class _Engine:
    def __init__(self, plan):
        import onnxruntime as ort

        self._session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
        self._profiles = plan["profiles"]
        self._resize = bool(plan.get("activation_resize"))
        self._inputs = [(i.name, i.type, i.shape) for i in self._session.get_inputs()]
        self._outputs = [(o.name, o.type, o.shape) for o in self._session.get_outputs()]

    @property
    def num_io_tensors(self):
        return len(self._inputs) + len(self._outputs)

    @property
    def num_optimization_profiles(self):
        return len(self._profiles)

    def get_tensor_name(self, index):
        return (self._inputs + self._outputs)[index][0]

    def get_tensor_mode(self, name):
        return TensorIOMode.INPUT if name in {n for n, _, _ in self._inputs} else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        t = {n: t for n, t, _ in self._inputs + self._outputs}[name]
        return {
            "tensor(float)": "float32",
            "tensor(float16)": "float16",
            "tensor(bfloat16)": "bfloat16",
            "tensor(bool)": "bool",
            "tensor(int32)": "int32",
            "tensor(int64)": "int64",
        }[t]

    def get_device_memory_size_for_profile_v2(self, profile_index):
        return self._activation({n: s[2] for n, s in self._profiles[profile_index].items()})

    @property
    def device_memory_size_v2(self):
        return max(self.get_device_memory_size_for_profile_v2(i) for i in range(len(self._profiles)))

    def _activation(self, shapes: dict) -> int:
        """The fake's activation memory at these input shapes: twice the bytes of the graph's inputs
        and outputs (a stand-in that grows with every dynamic axis, as the real figure does)."""
        out = _output_shapes(self, shapes)
        sizes = {n: 1 if "bool" in t else 8 if "int64" in t else 4 for n, t, _ in self._inputs + self._outputs}
        return int(2 * sum(sizes[n] * int(np.prod(s)) for n, s in {**shapes, **out}.items()))

    def _context_need(self, shapes: dict) -> int:
        """What a user-managed context needs at these shapes: the figure for the shapes only in an
        engine built with ``PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10``; without it, the
        profile maximum whatever the shapes (what the hardware is expected to do)."""
        return self._activation(shapes) if self._resize else self.get_device_memory_size_for_profile_v2(0)

    def create_execution_context(self, strategy=ExecutionContextAllocationStrategy.STATIC):
        if "create_execution_context" in FAIL:
            return None
        ctx = _Context(self, strategy)
        if strategy != ExecutionContextAllocationStrategy.USER_MANAGED:
            try:  # a static context holds memory for its profile maxima from creation on
                LEDGER.charge(self.device_memory_size_v2)
            except OutOfMemoryError:
                return None  # the real one logs "Requested amount of GPU memory ... could not be allocated"
            weakref.finalize(ctx, LEDGER.release, self.device_memory_size_v2)
        return ctx


def _output_shapes(engine, shapes: dict) -> dict:
    known = {}
    for n, _, dims in engine._inputs:
        for d, v in zip(dims, shapes.get(n, ())):
            if isinstance(d, str):
                known[d] = v
    return {
        n: tuple(int(d) if isinstance(d, int) else known.get(d, -1) for d in dims) for n, _, dims in engine._outputs
    }


class _Context:
    """Like TensorRT 11's IExecutionContext: input shapes and tensor addresses are set by name and
    report failure by returning False; ``execute_async_v3`` queues the run on the stream."""

    def __init__(self, engine, strategy):
        self._engine, self._strategy, self._shapes, self._addresses, self._memory = engine, strategy, {}, {}, None
        self._warm_shapes: dict | None = None  # the shapes of the last enqueue outside capture

    def set_input_shape(self, name, shape):
        CALLS.append(("set_input_shape", name))
        lo, _, hi = self._engine._profiles[0][name]
        shape = tuple(int(n) for n in shape)
        if "set_input_shape" in FAIL or len(shape) != len(lo) or any(not a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
        if self._shapes.get(name) != shape:
            _invalidate_captures(f"set_input_shape({name!r})")
        self._shapes[name] = shape
        return True

    def set_tensor_address(self, name, memory):
        CALLS.append(("set_tensor_address", name))
        if "set_tensor_address" in FAIL:
            return False
        if self._addresses.get(name) != memory:
            _invalidate_captures(f"set_tensor_address({name!r}) to a new address")
        self._addresses[name] = memory
        return True

    def get_tensor_shape(self, name):
        CALLS.append(("get_tensor_shape", name))
        if name in self._shapes:
            return self._shapes[name]
        if "data_dependent" in FAIL:
            return tuple(-1 for _ in {n: d for n, _, d in self._engine._outputs}[name])
        return _output_shapes(self._engine, self._shapes)[name]

    def update_device_memory_size_for_shapes(self):
        CALLS.append(("update_device_memory_size_for_shapes", None))
        if "update_device_memory_size_for_shapes" in FAIL:
            return 0  # the binding reports failure with 0
        if set(self._shapes) != {n for n, _, _ in self._engine._inputs}:
            return 0  # shapes not all set: the partition is invalid
        return self._engine._context_need(self._shapes)

    def set_device_memory(self, memory, size):
        CALLS.append(("set_device_memory", size))
        if self._memory != (memory, size):
            _invalidate_captures("set_device_memory to a new address")
        self._memory = (memory, size)

    def execute_async_v3(self, stream_handle):
        if isinstance(stream_handle, bool) or not isinstance(stream_handle, int):
            raise TypeError(
                "execute_async_v3(): incompatible function arguments. The following argument types are "
                "supported:\n    1. (self: tensorrt.IExecutionContext, stream_handle: int) -> bool\n\n"
                f"Invoked with: {type(stream_handle).__name__}"
            )
        CALLS.append(("execute_async_v3", stream_handle))
        if "execute_async_v3" in FAIL or not self._ready():
            return False  # the real one logs the reason (shapes, addresses or memory missing)
        inputs = {n: self._addresses[n] for n, _, _ in self._engine._inputs}
        outputs = {n: self._addresses[n] for n, _, _ in self._engine._outputs}
        shapes, memory = dict(self._shapes), self._memory
        stream = FakeStream.from_handle(stream_handle)
        if stream.is_capturing():
            if self._warm_shapes != shapes:  # shape-dependent setup would run (allocate, sync) inside capture
                stream._capture_invalid = "execute_async_v3 captured before an enqueue at these shapes"
        else:
            self._warm_shapes = shapes
        stream.enqueue(lambda: self._execute(inputs, outputs, shapes, memory), "execute")
        return True

    def _ready(self) -> bool:
        names = [n for n, _, _ in self._engine._inputs + self._engine._outputs]
        if set(self._shapes) != {n for n, _, _ in self._engine._inputs} or any(n not in self._addresses for n in names):
            return False
        if self._strategy == ExecutionContextAllocationStrategy.USER_MANAGED:
            need = self._engine._context_need(self._shapes)
            if (
                self._memory is None
                or self._memory[1] < need
                or _MEMORY.get(self._memory[0]) is None
                or _MEMORY[self._memory[0]].nbytes < self._memory[1]
            ):
                return False
        return True

    def _execute(self, inputs, outputs, shapes, memory=None):
        if memory is not None and _MEMORY.get(memory[0]) is None:
            raise RuntimeError("cudaErrorIllegalAddress: the context memory was freed")
        feeds = {n: _MEMORY[a] for n, a in inputs.items()}
        for n, a in feeds.items():
            assert a.shape == shapes[n], (n, a.shape, shapes[n])
        outs = self._engine._session.run(None, feeds)
        RUNS.append(dict(shapes))
        for (n, _, _), res in zip(self._engine._outputs, outs):
            assert _MEMORY[outputs[n]].shape == res.shape, (n, res.shape)
            _MEMORY[outputs[n]][...] = res


class Runtime:
    def __init__(self, logger):
        self._logger = logger

    def deserialize_cuda_engine(self, serialized_engine):
        if "deserialize_cuda_engine" in FAIL:
            return None  # a plan of another TensorRT version or GPU
        try:
            return _Engine(json.loads(bytes(serialized_engine).decode()))
        except Exception:  # noqa: BLE001 - real TensorRT returns None on a bad plan
            return None


# ---------------------------------------------------------------- the device (CuPy's stand-in)


class NumpyDevice:
    """Stands in for engine/device.py ``CupyDevice`` inside the TensorRT runner: host numpy arrays
    whose "address" is a key into the fake device memory, charged to the memory ledger; copies on a
    stream are queued on it (tests/test_trt_conformance.py checks it offers every
    ``ArrayDevice`` method with the same parameters)."""

    name = "fake-cuda"
    ort_device_type = "cuda"
    device_id = 0

    def __init__(self, device_id=0):
        pass

    @staticmethod
    def _track(x):
        """Register ``x`` as fake device memory: charged to the ledger until collected (refused
        during a capture, as ``cudaMalloc`` is)."""
        _refuse_during_capture("cudaMalloc")
        LEDGER.charge(int(x.nbytes))
        weakref.finalize(x, LEDGER.release, int(x.nbytes))
        _MEMORY[id(x)] = x
        return x

    def is_device_array(self, x):
        """True for a registered array and for views of one (a CuPy slice is a CuPy array too)."""
        while isinstance(x, np.ndarray):
            if _MEMORY.get(id(x)) is x:
                return True
            x = x.base
        return False

    def zeros(self, shape, dtype=np.float32):
        return self._track(np.zeros(shape, dtype))

    def empty(self, shape, dtype=np.float32):
        """Uninitialised: NaN for floats (so a read before the kernel ran is visible), else 0x5A."""
        CALLS.append(("empty", tuple(shape)))
        _refuse_during_capture("cudaMalloc")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        LEDGER.charge(nbytes)  # fail before allocating host memory for it
        LEDGER.release(nbytes)
        x = np.empty(shape, dtype)
        if x.dtype.kind == "f":
            x.fill(np.nan)
        else:
            x.view(np.uint8).fill(0x5A)
        return self._track(x)

    def from_host(self, x):
        return self._track(np.array(x, copy=True))

    def to_host(self, x):
        return np.array(x)

    def ptr(self, x):
        assert _MEMORY.get(id(x)) is x, "not a device buffer of its own (a view has no address to bind)"
        return id(x)

    def contiguous(self, x):
        """``x`` itself when C-contiguous, a view of device memory included (as
        ``cupy.ascontiguousarray``: bound in place, so a write through its address lands in the
        caller's array); else a new device buffer."""
        if _MEMORY.get(id(x)) is x and x.flags.c_contiguous:
            return x
        if x.flags.c_contiguous and self.is_device_array(x):
            _MEMORY[id(x)] = x  # an address into its base's memory (not charged again)
            return x
        return self._track(np.ascontiguousarray(x).copy())  # a new device buffer, as cupy.ascontiguousarray

    def copy(self, x):
        return self._track(np.array(x, copy=True))

    def concat(self, xs):
        return self.from_host(np.concatenate(xs, axis=0))

    def synchronize(self):
        CALLS.append(("synchronize", None))
        _refuse_during_capture("cudaStreamSynchronize (the current stream)")

    def new_stream(self):
        return FakeStream()

    def pinned_empty(self, shape, dtype=np.float32):
        """Host memory, uninitialised as page-locked memory is: NaN for floats, else 0x5A bytes."""
        x = np.empty(shape, dtype)
        if x.dtype.kind == "f":
            x.fill(np.nan)
        else:
            x.view(np.uint8).fill(0x5A)
        return x

    def copy_to_device(self, host, dst, stream):
        CALLS.append(("copy_to_device", tuple(dst.shape)))
        stream.enqueue(lambda: np.copyto(dst, host), "h2d")

    def copy_to_host(self, src, out, stream):
        CALLS.append(("copy_to_host", tuple(src.shape)))
        stream.enqueue(lambda: np.copyto(out, src), "d2h")

    def copy_on_stream(self, src, dst, stream):
        """Device to device, queued on ``stream`` as ``cudaMemcpyAsync``: done when that stream runs
        it (its ``synchronize()``, or an event recorded after it), so work on another stream does
        not see it. Checked as ``CupyDevice.copy_on_stream`` checks (``DeviceCopyError`` for
        shapes, dtypes or bytes that differ); a source or destination that is not device memory is
        ``cudaErrorInvalidValue``. Nothing is allocated (allowed during a capture, recorded)."""
        CALLS.append(("copy_on_stream", tuple(dst.shape), stream.ptr))
        if not self.is_device_array(src) or _MEMORY.get(id(dst)) is not dst:
            raise CUDARuntimeError("cudaErrorInvalidValue: a device-to-device copy between non-device memory")
        check_copy(src, dst)
        stream.enqueue(lambda: np.copyto(dst, src, casting="no"), "d2d")

    def record_event(self, stream):
        CALLS.append(("record_event", stream.ptr))
        return FakeEvent(stream)

    def mem_get_info(self):
        return MEMORY_LIMIT - LEDGER.used, MEMORY_LIMIT

    def release_cached(self):
        pass


#: What the fake ``tensorrt`` module offers (checked against the real 11.4 surface by
#: tests/test_trt_conformance.py, together with the classes below and their public members).
MODULE_ATTRS = (
    "BuilderFlag",
    "NetworkDefinitionCreationFlag",
    "PreviewFeature",
    "MemoryPoolType",
    "TensorIOMode",
    "ExecutionContextAllocationStrategy",
    "Logger",
    "OnnxParser",
    "Builder",
    "Runtime",
    "nptype",
    "float32",
    "float16",
    "bfloat16",
)
#: Classes standing for TensorRT objects the project receives -> the real class each stands for.
OBJECT_CLASSES = {
    "_Network": "INetworkDefinition",
    "_Profile": "IOptimizationProfile",
    "_TimingCache": "ITimingCache",
    "_Config": "IBuilderConfig",
    "_Engine": "ICudaEngine",
    "_Context": "IExecutionContext",
    "_ParserError": "ParserError",
    "_HostMemory": "IHostMemory",
}


def make_module(version: str = "11.4.0.106") -> types.ModuleType:
    m = types.ModuleType("tensorrt")
    for name in MODULE_ATTRS:
        setattr(m, name, globals()[name])
    m.__version__ = version
    return m
