"""A fake ``tensorrt`` module and numpy "device", to test the TensorRT backend's plumbing on CPU.

It implements only the TensorRT 10 calls that engine/backends/tensorrt.py makes, with the
signatures as documented; it cannot tell whether real TensorRT behaves as documented. Its
"engine" is the ONNX graph itself: the serialized plan holds the ONNX path, and the execution
context runs it with ONNX Runtime CPU, so a TrtRunner over the fake gives real numbers and its
batch splitting and output assembly are checked against ONNX Runtime.
"""

from __future__ import annotations

import enum
import json
import types

import numpy as np


class LayerType(enum.Enum):
    NORMALIZATION = 1
    SOFTMAX = 2
    REDUCE = 3
    ELEMENTWISE = 4
    ACTIVATION = 5
    MATRIX_MULTIPLY = 6
    SHAPE = 7
    CONSTANT = 8
    UNARY = 9
    OTHER = 10


_OP_TO_LAYER = {"LayerNormalization": LayerType.NORMALIZATION, "Softmax": LayerType.SOFTMAX,
                "ReduceSum": LayerType.REDUCE, "ReduceMax": LayerType.REDUCE, "ReduceL2": LayerType.REDUCE,
                "ReduceMean": LayerType.REDUCE, "Add": LayerType.ELEMENTWISE, "Mul": LayerType.ELEMENTWISE,
                "Pow": LayerType.ELEMENTWISE, "Div": LayerType.ELEMENTWISE, "Tanh": LayerType.ACTIVATION,
                "MatMul": LayerType.MATRIX_MULTIPLY, "Shape": LayerType.SHAPE, "Constant": LayerType.CONSTANT,
                "Sqrt": LayerType.UNARY}


class BuilderFlag(enum.Enum):
    FP16 = 1
    BF16 = 2
    TF32 = 3
    OBEY_PRECISION_CONSTRAINTS = 4


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


class _Tensor:
    def __init__(self):
        self.dtype = float32


class _Layer:
    def __init__(self, name, type_):
        self.name, self.type = name, type_
        self.precision = None
        self._outs = [_Tensor()]
        self.output_types = {}

    @property
    def num_outputs(self):
        return len(self._outs)

    def get_output(self, j):
        return self._outs[j]

    def set_output_type(self, j, dt):
        self.output_types[j] = dt


class _Network:
    def __init__(self):
        self.layers, self.onnx_path = [], None

    @property
    def num_layers(self):
        return len(self.layers)

    def get_layer(self, i):
        return self.layers[i]


class OnnxParser:
    def __init__(self, network, logger):
        self.network = network
        self.num_errors = 0

    def parse_from_file(self, path):
        import onnx

        model = onnx.load(path, load_external_data=False)
        self.network.onnx_path = path
        for n in model.graph.node:
            self.network.layers.append(_Layer(n.name, _OP_TO_LAYER.get(n.op_type, LayerType.OTHER)))
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
    platform_has_fast_fp16 = True

    def __init__(self, logger):
        pass

    def create_network(self, flags):
        assert flags == 0
        return _Network()

    def create_builder_config(self):
        return _Config()

    def create_optimization_profile(self):
        return _Profile()

    def build_serialized_network(self, network, config):
        if config.cache is not None:
            config.cache.builds += 1
        BUILDS.append({"onnx": network.onnx_path, "flags": set(config.flags),
                       "profiles": [p.shapes for p in config.profiles],
                       "fp32_layers": {l.name for l in network.layers if l.precision == float32},
                       "fp32_types": {l.type.name for l in network.layers if l.precision == float32},
                       "cache_builds": config.cache.builds if config.cache else None})
        return json.dumps({"onnx": network.onnx_path}).encode()


# ---------------------------------------------------------------- runtime (ONNX Runtime inside)

_MEMORY: dict[int, np.ndarray] = {}  # fake device address -> array


def nptype(dt):
    return {"float32": np.float32, "float16": np.float16, "bool": np.bool_, "int32": np.int32,
            "int64": np.int64}[dt]


class _Engine:
    def __init__(self, onnx_path):
        import onnxruntime as ort

        self.session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
        self.inputs = [(i.name, i.type) for i in self.session.get_inputs()]
        self.outputs = [(o.name, o.type) for o in self.session.get_outputs()]
        self.contexts = 0

    @property
    def num_io_tensors(self):
        return len(self.inputs) + len(self.outputs)

    def get_tensor_name(self, i):
        return (self.inputs + self.outputs)[i][0]

    def get_tensor_mode(self, name):
        return TensorIOMode.INPUT if name in dict(self.inputs) else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name):
        t = dict(self.inputs + self.outputs)[name]
        return {"tensor(float)": "float32", "tensor(bool)": "bool", "tensor(int32)": "int32",
                "tensor(int64)": "int64"}[t]

    def create_execution_context(self):
        self.contexts += 1
        return _Context(self)


RUNS: list[dict] = []  # input shapes of each execution (tests read it)


class _Context:
    def __init__(self, engine):
        self.engine, self.shapes, self.addresses, self._result = engine, {}, {}, None

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)
        self._result = None
        return True

    def set_tensor_address(self, name, ptr):
        self.addresses[name] = ptr
        self._result = None
        return True

    def _compute(self):
        if self._result is None:
            feeds = {n: _MEMORY[self.addresses[n]] for n, _ in self.engine.inputs}
            for n, a in feeds.items():
                assert a.shape == self.shapes[n], (n, a.shape, self.shapes[n])
            outs = self.engine.session.run(None, feeds)
            self._result = dict(zip([n for n, _ in self.engine.outputs], outs))
        return self._result

    def get_tensor_shape(self, name):
        return self._compute()[name].shape

    def execute_async_v3(self, stream):
        res = self._compute()
        RUNS.append({n: self.shapes[n] for n, _ in self.engine.inputs})
        for n, _ in self.engine.outputs:
            _MEMORY[self.addresses[n]][...] = res[n]
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
        return isinstance(x, np.ndarray) and id(x) in _MEMORY and _MEMORY[id(x)] is x

    def from_host(self, x):
        x = np.array(x, copy=True)
        _MEMORY[id(x)] = x
        return x

    def empty(self, shape, dtype):
        x = np.empty(shape, dtype)
        _MEMORY[id(x)] = x
        return x

    def ptr(self, x):
        assert id(x) in _MEMORY
        return id(x)

    def contiguous(self, x):
        return x

    def to_host(self, x):
        return np.asarray(x)

    def concat(self, xs):
        return self.from_host(np.concatenate(xs, axis=0))

    def synchronize(self):
        pass

    def new_stream(self):
        return types.SimpleNamespace(ptr=0, synchronize=lambda: None)


def make_module(version: str = "10.99.0") -> types.ModuleType:
    m = types.ModuleType("tensorrt")
    for name in ("LayerType", "BuilderFlag", "MemoryPoolType", "TensorIOMode", "Logger", "OnnxParser",
                 "Builder", "Runtime", "nptype", "float32", "float16", "bfloat16"):
        setattr(m, name, globals()[name])
    m.__version__ = version
    return m
