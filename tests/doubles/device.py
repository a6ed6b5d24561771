"""A stand-in for CuPy device memory: one device-array design for every test of a device path.

CuPy cannot run here (no GPU). :class:`DeviceArray` keeps numpy inside but follows CuPy's rules
outside: ``np.asarray`` raises ``TypeError`` (no implicit device-to-host copy), iterating raises,
a host array is not assigned into it implicitly, and arithmetic, indexing and methods return
device arrays (CuPy returns 0-d device arrays where numpy returns scalars). So a numpy call slipped
into a device path fails here as it would on the GPU.

:class:`StrictDeviceArray` also refuses ``float()``/``int()``/``bool()``: CuPy allows them (a
synchronising one-element copy), so the strict kind is for pipelines that must never read a
scalar back implicitly. :data:`fake_xp` is the array module of device arrays (the functions
runtime/heads.py calls on ``xp``); :class:`StrictFakeDevice` a device (engine/device.py
``ArrayDevice``) that hands out strict arrays and logs every copy.
"""

from __future__ import annotations

import operator
import types

import numpy as np

from masc_engine.engine.device import ArrayDevice


def _unwrap(x):
    if isinstance(x, DeviceArray):
        return x.a
    if isinstance(x, (tuple, list)):
        return type(x)(_unwrap(v) for v in x)
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x, cls=None):
    return (cls or DeviceArray)(x) if isinstance(x, (np.ndarray, np.generic)) else x


class DeviceArray:
    """A device array: numpy inside, no implicit conversion out (as ``cupy.ndarray``)."""

    __array_priority__ = 1000  # numpy scalars defer to our operators
    #: float()/int()/bool() of a device array: allowed, as CuPy does (a synchronising copy).
    scalar_conversion = True

    def __init__(self, a):
        self.a = np.asarray(a)

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed (as in CuPy)")

    def __getattr__(self, name):
        if name.startswith("__"):  # no __array_interface__ & co.: numpy must not see inside
            raise AttributeError(name)
        v = getattr(self.a, name)
        if callable(v):
            return lambda *args, **kw: _wrap(v(*_unwrap(args), **_unwrap(kw)), type(self))
        return _wrap(v, type(self)) if name == "T" else v

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray):
            raise TypeError("host array assigned into device memory without from_host")
        self.a[key] = _unwrap(value)

    def __iter__(self):
        raise TypeError("iterating a device array element by element")

    def _scalar(self, kind):
        if not self.scalar_conversion:
            raise TypeError("implicit device-to-host scalar conversion")
        return kind(self.a)

    def __float__(self):
        return self._scalar(float)

    def __int__(self):
        return self._scalar(int)

    def __bool__(self):
        return self._scalar(bool)

    def __len__(self):
        return len(self.a)


class StrictDeviceArray(DeviceArray):
    """A device array that also refuses ``float()``, ``int()`` and ``bool()``."""

    scalar_conversion = False


def _binary(op, reflected=False):
    def f(self, other):
        a, b = self.a, _unwrap(other)
        return _wrap(op(b, a) if reflected else op(a, b), type(self))

    return f


for _name, _op in {
    "mul": operator.mul,
    "truediv": operator.truediv,
    "add": operator.add,
    "sub": operator.sub,
    "matmul": operator.matmul,
}.items():
    setattr(DeviceArray, f"__{_name}__", _binary(_op))
    setattr(DeviceArray, f"__r{_name}__", _binary(_op, reflected=True))
for _name in ("gt", "ge", "lt", "le", "getitem", "and", "or"):
    setattr(
        DeviceArray, f"__{_name}__", _binary(getattr(operator, _name if _name not in ("and", "or") else _name + "_"))
    )
DeviceArray.__invert__ = lambda self: _wrap(~self.a, type(self))


def _module_function(name):
    f = getattr(np, name)
    return lambda *args, **kw: _wrap(f(*_unwrap(args), **_unwrap(kw)))


#: The array module of :class:`DeviceArray` (the functions runtime/heads.py calls on ``xp``).
fake_xp = types.SimpleNamespace(
    __name__="fake_xp",
    float32=np.float32,
    float16=np.float16,
    asnumpy=lambda x: np.array(_unwrap(x)),
    **{
        n: _module_function(n)
        for n in ("asarray", "sqrt", "sum", "maximum", "matmul", "where", "mean", "ascontiguousarray")
    },
)


class StrictFakeDevice(ArrayDevice):
    """A token device with CuPy's conversion rules on host memory (:class:`StrictDeviceArray`);
    logs each copy to and from the host."""

    name = "fake-device"
    ort_device_type = "cpu"

    def __init__(self):
        self.to_host_log: list[tuple] = []
        self.from_host_log: list[tuple] = []

    def is_device_array(self, x) -> bool:
        return isinstance(x, DeviceArray)

    def zeros(self, shape, dtype=np.float32):
        return StrictDeviceArray(np.zeros(shape, dtype))

    def empty(self, shape, dtype=np.float32):
        return StrictDeviceArray(np.empty(shape, dtype))

    def from_host(self, x):
        self.from_host_log.append(tuple(np.shape(x)))
        return StrictDeviceArray(np.array(x))

    def to_host(self, x):
        assert isinstance(x, DeviceArray), type(x)
        self.to_host_log.append(tuple(x.shape))
        return x.a.copy()

    def ptr(self, x) -> int:
        assert x.a.flags.c_contiguous
        return int(x.a.ctypes.data)

    def contiguous(self, x):
        return x if x.a.flags.c_contiguous else StrictDeviceArray(np.ascontiguousarray(x.a))

    def copy(self, x):
        return StrictDeviceArray(np.array(x.a, order="C"))
