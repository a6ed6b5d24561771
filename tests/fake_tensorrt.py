"""A fake ``tensorrt`` module and a numpy "device", as unkind as the real ones where it matters.

What it stands in for cannot run here (TensorRT needs libnvinfer and a GPU; CuPy needs CUDA). Its
"engine" is the ONNX graph itself: the serialized plan names the ONNX file and the profiles, and the
execution context runs the graph with ONNX Runtime CPU, so a TrtRunner over the fake gives real
numbers, checked against ONNX Runtime. Where the hardware is unkind, so is the fake:

- **Asynchronous.** ``execute_async_v3`` and the device's ``copy_to_device`` / ``copy_to_host``
  only queue work on the stream whose handle they get; a worker thread per stream does it after
  ``LATENCY_S`` seconds. Output buffers start as NaN, so reading them before that stream's
  ``synchronize()`` gives stale data. ``execute_async_v3`` takes the stream *handle* (an int), as
  pybind11 enforces: a stream object is a ``TypeError``.
- **Device memory.** Every device allocation is charged to a ledger of ``MEMORY_LIMIT`` bytes
  (freed when the array is collected); past it allocation raises :class:`OutOfMemoryError` (as
  CuPy does) and ``create_execution_context`` returns ``None`` (as TensorRT does) when a static
  context's reservation (its profile maxima) does not fit. A user-managed context runs only with
  memory given by ``set_device_memory`` at least as large as
  ``update_device_memory_size_for_shapes()`` says, else execution reports ``False``.
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
  ``update_device_memory_size_for_shapes`` (0); ``data_dependent`` makes output shapes -1. Context
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
import queue
import threading
import time
import types
import weakref

import numpy as np

#: ONNX ops the ONNX-TensorRT parser imports: the "Y" rows of onnx-tensorrt's docs/operators.md
#: at its 10.1 GA release (commit 96e7811, the newest release whose list could be read here; the
#: parser of TensorRT 11.4 supports at least these: releases add importers).
SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast CastLike
Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DeformConv DepthToSpace
DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor Gather GatherElements
GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample
GroupNormalization GRU HardSigmoid HardSwish Hardmax Identity If ImageScaler InstanceNormalization IsInf
IsNaN LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax Loop LRN LSTM LpNormalization LpPool
MatMul Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression NonZero Not OneHot
Or Pad ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal RandomNormalLike RandomUniform
RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean
ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RNN RoiAlign Round
ScaledTanh Scan Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice
Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK
Transpose Trilu Unsqueeze Upsample Where Xor
""".split())

#: Seconds a queued kernel or copy waits on its stream's worker before it runs.
LATENCY_S = 0.01
#: Bytes of fake device memory.
MEMORY_LIMIT = 1 << 40
FAIL: set = set()
BUILDS: list[dict] = []  # what each build was asked for (tests read it)
RUNS: list[dict] = []  # input shapes of each execution
#: Every call on an execution context and on the device, in order (tests read it).
CALLS: list[tuple] = []
LOGGERS: list = []  # every trt.Logger made


def reset(latency_s: float = 0.01, memory_limit: int = 1 << 40) -> None:
    """Back to a clean, generous fake (tests call it first)."""
    global LATENCY_S, MEMORY_LIMIT
    LATENCY_S, MEMORY_LIMIT = latency_s, memory_limit
    for registry in (FAIL, BUILDS, RUNS, CALLS, LOGGERS):
        registry.clear()


class OutOfMemoryError(MemoryError):
    """As ``cupy.cuda.memory.OutOfMemoryError``: an allocation past the device's memory."""


class _Ledger:
    def __init__(self):
        self.used = 0
        self._lock = threading.Lock()

    def charge(self, nbytes: int) -> None:
        with self._lock:
            if self.used + nbytes > MEMORY_LIMIT:
                raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes (allocated so far: {self.used:,} "
                                       f"bytes, limit {MEMORY_LIMIT:,})")
            self.used += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


LEDGER = _Ledger()
_MEMORY: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()  # address -> array


# ---------------------------------------------------------------- streams


class FakeStream:
    """A CUDA stream: work queued on it runs in order on a worker thread, ``LATENCY_S`` after it
    reaches the front; ``synchronize()`` waits for all of it and raises an error a task hit (as
    CUDA reports an asynchronous error at the next synchronize)."""

    _handles = itertools.count(0x7F00_0000)
    _registry: "weakref.WeakValueDictionary[int, FakeStream]" = weakref.WeakValueDictionary()

    def __init__(self):
        self.ptr = next(self._handles)
        self._queue: queue.Queue = queue.Queue()
        self._worker = None
        self._lock = threading.Lock()
        self._error = None
        self._registry[self.ptr] = self

    @classmethod
    def from_handle(cls, handle: int) -> "FakeStream":
        stream = cls._registry.get(handle)
        if stream is None:  # the legacy default stream (0) or a stream made elsewhere
            stream = cls._default
        return stream

    def enqueue(self, fn) -> None:
        self._queue.put(fn)
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._work, daemon=True, name=f"fake-stream-{self.ptr:x}")
                self._worker.start()

    def _work(self) -> None:
        while True:
            try:
                fn = self._queue.get(timeout=0.5)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._worker = None
                        return
                continue
            try:
                time.sleep(LATENCY_S)
                fn()
            except Exception as e:  # noqa: BLE001 - reported at synchronize
                self._error = e
            finally:
                fn = None  # a finished task holds no buffer alive (the ledger sees frees at once)
                self._queue.task_done()

    def synchronize(self) -> None:
        CALLS.append(("stream.synchronize", self.ptr))
        self._queue.join()
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"an asynchronous task on stream {self.ptr:#x} failed: {e}") from e


FakeStream._default = FakeStream()


# ---------------------------------------------------------------- enums and module functions


class BuilderFlag(enum.IntEnum):
    TF32 = 5  # TensorRT 11 keeps TF32; FP16, BF16, INT8, FP8, INT4 and OBEY_PRECISION_CONSTRAINTS are gone


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1


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
    mapping = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "int32": np.int32,
               "int64": np.int64, "bool": np.bool_, "uint8": np.uint8}
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
                self._errors.append(_ParserError(i, n.op_type, f"No importer registered for op: {n.op_type} "
                                                 f"(domain {n.domain}); plugin not found"))
            elif n.op_type not in SUPPORTED_OPS:
                self._errors.append(_ParserError(i, n.op_type, f"No importer registered for op: {n.op_type}"))
        if self._errors:
            return False
        net = self._network
        net._onnx_path, net._num_layers = model, len(m.graph.node)
        init = {t.name for t in m.graph.initializer}
        net._inputs = {i.name: [d.dim_value if d.HasField("dim_value") else -1 for d in i.type.tensor_type.shape.dim]
                       for i in m.graph.input if i.name not in init}
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
        self._profiles, self._cache, self._pool = [], None, {}

    def set_memory_pool_limit(self, pool, pool_size):
        self._pool[pool] = pool_size

    def set_flag(self, flag):
        self._flags.add(flag)

    def clear_flag(self, flag):
        self._flags.discard(flag)

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
        covered = all(dynamic <= set(p._shapes) and all(_fits_rank(network._inputs[n], p._shapes[n]) for n in dynamic)
                      for p in config._profiles)
        if "build" in FAIL or (dynamic and not config._profiles) or not covered:
            return None  # the real builder logs why and returns no plan
        import onnx

        model = onnx.load(network._onnx_path, load_external_data=False)
        dtypes = {onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer}
        BUILDS.append({"onnx": network._onnx_path, "flags": set(config._flags),
                       "strongly_typed": network._flags == 1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED),
                       "initializer_dtypes": dtypes, "profiles": [p._shapes for p in config._profiles],
                       "cache_builds": config._cache.builds if config._cache else None})
        plan = {"onnx": network._onnx_path, "profiles": [{k: v for k, v in p._shapes.items()} for p in config._profiles]}
        return _HostMemory(json.dumps(plan).encode())


def _fits_rank(dims, shapes) -> bool:
    lo, _, hi = shapes
    return len(dims) == len(lo) and all(d == -1 or lo[i] == hi[i] == d for i, d in enumerate(dims))


# ---------------------------------------------------------------- runtime (ONNX Runtime inside)


class _Engine:
    def __init__(self, plan):
        import onnxruntime as ort

        self._session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
        self._profiles = plan["profiles"]
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
        return {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
                "tensor(bool)": "bool", "tensor(int32)": "int32", "tensor(int64)": "int64"}[t]

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
    return {n: tuple(int(d) if isinstance(d, int) else known.get(d, -1) for d in dims) for n, _, dims in engine._outputs}


class _Context:
    """Like TensorRT 11's IExecutionContext: input shapes and tensor addresses are set by name and
    report failure by returning False; ``execute_async_v3`` queues the run on the stream."""

    def __init__(self, engine, strategy):
        self._engine, self._strategy, self._shapes, self._addresses, self._memory = engine, strategy, {}, {}, None

    def set_input_shape(self, name, shape):
        CALLS.append(("set_input_shape", name))
        lo, _, hi = self._engine._profiles[0][name]
        shape = tuple(int(n) for n in shape)
        if "set_input_shape" in FAIL or len(shape) != len(lo) or any(not a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
        self._shapes[name] = shape
        return True

    def set_tensor_address(self, name, memory):
        CALLS.append(("set_tensor_address", name))
        if "set_tensor_address" in FAIL:
            return False
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
        return self._engine._activation(self._shapes)

    def set_device_memory(self, memory, size):
        CALLS.append(("set_device_memory", size))
        self._memory = (memory, size)

    def execute_async_v3(self, stream_handle):
        if isinstance(stream_handle, bool) or not isinstance(stream_handle, int):
            raise TypeError("execute_async_v3(): incompatible function arguments. The following argument types are "
                            "supported:\n    1. (self: tensorrt.IExecutionContext, stream_handle: int) -> bool\n\n"
                            f"Invoked with: {type(stream_handle).__name__}")
        CALLS.append(("execute_async_v3", stream_handle))
        if "execute_async_v3" in FAIL or not self._ready():
            return False  # the real one logs the reason (shapes, addresses or memory missing)
        inputs = {n: self._addresses[n] for n, _, _ in self._engine._inputs}
        outputs = {n: self._addresses[n] for n, _, _ in self._engine._outputs}
        shapes = dict(self._shapes)
        FakeStream.from_handle(stream_handle).enqueue(lambda: self._execute(inputs, outputs, shapes))
        return True

    def _ready(self) -> bool:
        names = [n for n, _, _ in self._engine._inputs + self._engine._outputs]
        if set(self._shapes) != {n for n, _, _ in self._engine._inputs} or any(n not in self._addresses for n in names):
            return False
        if self._strategy == ExecutionContextAllocationStrategy.USER_MANAGED:
            need = self._engine._activation(self._shapes)
            if self._memory is None or self._memory[1] < need or _MEMORY.get(self._memory[0]) is None or \
                    _MEMORY[self._memory[0]].nbytes < self._memory[1]:
                return False
        return True

    def _execute(self, inputs, outputs, shapes):
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
        """Register ``x`` as fake device memory: charged to the ledger until collected."""
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
        if _MEMORY.get(id(x)) is x and x.flags.c_contiguous:
            return x
        return self._track(np.ascontiguousarray(x).copy())  # a new device buffer, as cupy.ascontiguousarray

    def copy(self, x):
        return self._track(np.array(x, copy=True))

    def concat(self, xs):
        return self.from_host(np.concatenate(xs, axis=0))

    def synchronize(self):
        CALLS.append(("synchronize", None))

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
        stream.enqueue(lambda: np.copyto(dst, host))

    def copy_to_host(self, src, out, stream):
        CALLS.append(("copy_to_host", tuple(src.shape)))
        stream.enqueue(lambda: np.copyto(out, src))

    def mem_get_info(self):
        return MEMORY_LIMIT - LEDGER.used, MEMORY_LIMIT

    def release_cached(self):
        pass


#: What the fake ``tensorrt`` module offers (checked against the real 11.4 surface by
#: tests/test_trt_conformance.py, together with the classes below and their public members).
MODULE_ATTRS = ("BuilderFlag", "NetworkDefinitionCreationFlag", "MemoryPoolType", "TensorIOMode",
                "ExecutionContextAllocationStrategy", "Logger", "OnnxParser", "Builder", "Runtime", "nptype",
                "float32", "float16", "bfloat16")
#: Classes standing for TensorRT objects the project receives -> the real class each stands for.
OBJECT_CLASSES = {"_Network": "INetworkDefinition", "_Profile": "IOptimizationProfile", "_TimingCache": "ITimingCache",
                  "_Config": "IBuilderConfig", "_Engine": "ICudaEngine", "_Context": "IExecutionContext",
                  "_ParserError": "ParserError", "_HostMemory": "IHostMemory"}


def make_module(version: str = "11.4.0.106") -> types.ModuleType:
    m = types.ModuleType("tensorrt")
    for name in MODULE_ATTRS:
        setattr(m, name, globals()[name])
    m.__version__ = version
    return m
