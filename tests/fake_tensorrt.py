"""A fake ``tensorrt`` module and numpy "device", to test the TensorRT backend's plumbing on CPU.

It implements only the TensorRT calls that engine/backends/tensorrt.py makes, with the signatures
as documented, and offers no name the real TensorRT 11.4 Python bindings lack
(tests/test_trt_conformance.py checks it against the ``tensorrt-cu13-bindings`` wheel); it cannot
tell whether real TensorRT behaves as documented. Its
"engine" is the ONNX graph itself: the serialized plan holds the ONNX path, and the execution
context runs it with ONNX Runtime CPU, so a TrtRunner over the fake gives real numbers and its
batch splitting and output assembly are checked against ONNX Runtime.
"""

from __future__ import annotations

import enum
import json
import types

import numpy as np


class BuilderFlag(enum.IntEnum):
    TF32 = 3  # TensorRT 11 keeps TF32; FP16, BF16 and OBEY_PRECISION_CONSTRAINTS are gone


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1  # its value in TensorRT 10; 11.x binds the name (value not needed here)


class MemoryPoolType(enum.Enum):
    WORKSPACE = 1


class TensorIOMode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


float32, float16, bfloat16 = "float32", "float16", "bfloat16"


class Logger:
    WARNING = 2

    def __init__(self, level):
        self.level = level


class _Network:
    """Holds what the parser read: the ONNX path and its node count (``num_layers``). No layer
    access: strongly typed networks take every type from the graph, so the builder touches none."""

    def __init__(self, flags):
        self._flags, self._onnx_path, self._num_layers = flags, None, 0

    @property
    def num_layers(self):
        return self._num_layers


class OnnxParser:
    def __init__(self, network, logger):
        self.network = network
        self.num_errors = 0

    def parse_from_file(self, path):
        import onnx

        model = onnx.load(path, load_external_data=False)
        self.network._onnx_path = path
        self.network._num_layers = len(model.graph.node)
        return True

    def get_error(self, i):
        return ""


class _Profile:
    def __init__(self):
        self.shapes = {}

    def set_shape(self, name, lo, opt, hi):
        self.shapes[name] = (list(lo), list(opt), list(hi))


class _TimingCache:
    def __init__(self, blob):
        self.builds = int(blob.decode().split(":")[1]) if blob else 0

    def serialize(self):
        return f"fake-timing-cache:{self.builds}".encode()


class _Config:
    def __init__(self):
        self.flags = {BuilderFlag.TF32}  # TensorRT's default
        self.profiles, self.cache, self.pool = [], None, {}

    def set_memory_pool_limit(self, pool, size):
        self.pool[pool] = size

    def set_flag(self, f):
        self.flags.add(f)

    def clear_flag(self, f):
        self.flags.discard(f)

    def add_optimization_profile(self, p):
        self.profiles.append(p)
        return len(self.profiles) - 1

    def create_timing_cache(self, blob):
        return _TimingCache(bytes(blob))

    def set_timing_cache(self, cache, ignore_mismatch):
        self.cache = cache
        return True

    def get_timing_cache(self):
        return self.cache


BUILDS: list[dict] = []  # what each build was asked for (tests read it)


class Builder:
    def __init__(self, logger):
        pass

    def create_network(self, flags):
        return _Network(flags)

    def create_builder_config(self):
        return _Config()

    def create_optimization_profile(self):
        return _Profile()

    def build_serialized_network(self, network, config):
        if config.cache is not None:
            config.cache.builds += 1
        import onnx

        model = onnx.load(network._onnx_path, load_external_data=False)
        dtypes = {onnx.TensorProto.DataType.Name(t.data_type) for t in model.graph.initializer}
        BUILDS.append({"onnx": network._onnx_path, "flags": set(config.flags),
                       "strongly_typed": network._flags == 1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED),
                       "initializer_dtypes": dtypes, "profiles": [p.shapes for p in config.profiles],
                       "cache_builds": config.cache.builds if config.cache else None})
        return json.dumps({"onnx": network._onnx_path}).encode()


# ---------------------------------------------------------------- runtime (ONNX Runtime inside)

_MEMORY: dict[int, np.ndarray] = {}  # fake device address -> array


def nptype(dt):
    """As the real ``tensorrt.nptype`` (11.4 ``__init__.py``): no numpy type for bfloat16."""
    mapping = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "int32": np.int32,
               "int64": np.int64, "bool": np.bool_, "uint8": np.uint8}
    if dt in mapping:
        return mapping[dt]
    raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")


class _Engine:
    def __init__(self, onnx_path):
        import onnxruntime as ort

        self._session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        self._inputs = [(i.name, i.type, i.shape) for i in self._session.get_inputs()]
        self._outputs = [(o.name, o.type, o.shape) for o in self._session.get_outputs()]

    @property
    def num_io_tensors(self):
        return len(self._inputs) + len(self._outputs)

    def get_tensor_name(self, i):
        return (self._inputs + self._outputs)[i][0]

    def get_tensor_mode(self, name):
        return TensorIOMode.INPUT if name in {n for n, _, _ in self._inputs} else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        t = {n: t for n, t, _ in self._inputs + self._outputs}[name]
        return {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
                "tensor(bool)": "bool", "tensor(int32)": "int32", "tensor(int64)": "int64"}[t]

    def create_execution_context(self):
        return _Context(self)


RUNS: list[dict] = []  # input shapes of each execution (tests read it)
#: Tests put call names here ("set_input_shape", "set_tensor_address", "execute_async_v3") to
#: make the fake return False as real TensorRT does on failure; "data_dependent" makes
#: get_tensor_shape report -1 for output dimensions, as the real one does for a dimension that
#: depends on input values.
FAIL: set = set()
#: Every call on an execution context, in order, with the thread that made it (tests read it).
CALLS: list[tuple] = []


class _Context:
    """Like TensorRT 11's IExecutionContext: input shapes and tensor addresses are set by name and
    report failure by returning False; ``get_tensor_shape`` of an output is derived from the input
    shapes set so far (ONNX Runtime's symbolic dimensions), with -1 for a dimension not known yet."""

    def __init__(self, engine):
        self._engine, self._shapes, self._addresses = engine, {}, {}

    def set_input_shape(self, name, shape):
        CALLS.append(("set_input_shape", name))
        if "set_input_shape" in FAIL:
            return False
        self._shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, ptr):
        CALLS.append(("set_tensor_address", name))
        if "set_tensor_address" in FAIL:
            return False
        self._addresses[name] = ptr
        return True

    def get_tensor_shape(self, name):
        CALLS.append(("get_tensor_shape", name))
        known = {}
        for n, _, dims in self._engine._inputs:
            if n in self._shapes:
                for d, v in zip(dims, self._shapes[n]):
                    if isinstance(d, str):
                        known[d] = v
        if name in self._shapes:
            return self._shapes[name]
        dims = {n: d for n, _, d in self._engine._inputs + self._engine._outputs}[name]
        if "data_dependent" in FAIL:
            return tuple(-1 for _ in dims)
        return tuple(int(d) if isinstance(d, int) else known.get(d, -1) for d in dims)

    def execute_async_v3(self, stream):
        CALLS.append(("execute_async_v3", None))
        if "execute_async_v3" in FAIL:
            return False
        feeds = {n: _MEMORY[self._addresses[n]] for n, _, _ in self._engine._inputs}
        for n, a in feeds.items():
            assert a.shape == self._shapes[n], (n, a.shape, self._shapes[n])
        outs = self._engine._session.run(None, feeds)
        RUNS.append({n: self._shapes[n] for n, _, _ in self._engine._inputs})
        for (n, _, _), res in zip(self._engine._outputs, outs):
            assert _MEMORY[self._addresses[n]].shape == res.shape, (n, res.shape)
            _MEMORY[self._addresses[n]][...] = res
        return True


class Runtime:
    def __init__(self, logger):
        pass

    def deserialize_cuda_engine(self, data):
        try:
            return _Engine(json.loads(bytes(data).decode())["onnx"])
        except Exception:  # noqa: BLE001 - real TensorRT returns None on a bad plan
            return None


class NumpyDevice:
    """Stands in for engine/device.py ``CupyDevice`` inside the TensorRT runner: host numpy arrays
    whose "address" is a key into the fake device memory."""

    name = "fake-cuda"
    ort_device_type = "cuda"

    def __init__(self, device=0):
        pass

    def is_device_array(self, x):
        """True for a registered array and for views of one (a CuPy slice is a CuPy array too)."""
        while isinstance(x, np.ndarray):
            if id(x) in _MEMORY and _MEMORY[id(x)] is x:
                return True
            x = x.base
        return False

    @staticmethod
    def _track(x):
        """Register ``x`` as fake device memory (what is_device_array recognises)."""
        _MEMORY[id(x)] = x
        return x

    def from_host(self, x):
        return self._track(np.array(x, copy=True))

    def zeros(self, shape, dtype=np.float32):
        return self._track(np.zeros(shape, dtype))

    def copy(self, x):
        return self._track(np.array(x, copy=True))

    def empty(self, shape, dtype=np.float32):
        CALLS.append(("empty", tuple(shape)))
        return self._track(np.empty(shape, dtype))

    def ptr(self, x):
        assert id(x) in _MEMORY
        return id(x)

    def contiguous(self, x):
        if id(x) in _MEMORY and _MEMORY[id(x)] is x and x.flags.c_contiguous:
            return x
        y = np.ascontiguousarray(x).copy()  # a new device buffer, as cupy.ascontiguousarray of a view
        _MEMORY[id(y)] = y
        return y

    def to_host(self, x):
        return np.asarray(x)

    def concat(self, xs):
        return self.from_host(np.concatenate(xs, axis=0))

    def synchronize(self):
        CALLS.append(("synchronize", None))

    def new_stream(self):
        return types.SimpleNamespace(ptr=0, synchronize=lambda: None)


#: What the fake ``tensorrt`` module offers (each checked against the real 11.4 bindings by
#: tests/test_trt_conformance.py, together with the classes below and their public members).
MODULE_ATTRS = ("BuilderFlag", "NetworkDefinitionCreationFlag", "MemoryPoolType", "TensorIOMode", "Logger",
                "OnnxParser", "Builder", "Runtime", "nptype", "float32", "float16", "bfloat16")
#: Classes standing for TensorRT objects the project receives (builder config, network, engine,
#: execution context, ...), whose public members must exist in the real bindings too.
OBJECT_CLASSES = ("_Network", "_Profile", "_TimingCache", "_Config", "_Engine", "_Context")


def make_module(version: str = "11.4.0.106") -> types.ModuleType:
    m = types.ModuleType("tensorrt")
    for name in MODULE_ATTRS:
        setattr(m, name, globals()[name])
    m.__version__ = version
    return m
