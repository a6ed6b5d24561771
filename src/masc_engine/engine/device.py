"""Where patch tokens live between graphs: an array module plus the few operations the
device-resident pipeline needs (allocate, pack, hand a pointer to a backend, copy back).

The runtime keeps tokens as arrays of one :class:`ArrayDevice`:

- :class:`HostDevice` (numpy): ONNX Runtime's CPU execution provider bound through IO binding.
  Scores equal the ordinary path; it exists so the device-resident code runs, and is tested, on
  every machine.
- :class:`CupyDevice` (CuPy, a CUDA GPU): ORT's CUDA execution provider and TensorRT read and
  write CuPy memory by pointer, so patch tokens stay on the GPU from the vision graph to the
  pooling head and the CP head; only scores, pooled embeddings and attention rows come back.
  unverified: no GPU with onnxruntime-gpu or TensorRT was available to the sessions that wrote it.

Every device-to-host copy goes through :meth:`ArrayDevice.to_host`, the one place a test can
watch (tests/test_device_resident.py). CuPy refuses implicit conversion to numpy, so a stray
host conversion in the pipeline is an error on the GPU, and the tests reproduce that strictness
on CPU with a fake device.
"""

from __future__ import annotations

import numpy as np

from ..errors import BackendUnavailableError


class ArrayDevice:
    """Interface of a token device. Subclasses set ``name``, ``ort_device_type`` (``"cpu"`` or
    ``"cuda"``), ``device_id`` and ``xp`` (the array module)."""

    name: str
    ort_device_type: str
    device_id: int = 0

    def is_device_array(self, x) -> bool:
        raise NotImplementedError

    def zeros(self, shape, dtype=np.float32):
        """A zero-filled device array of ``shape`` and ``dtype``."""
        raise NotImplementedError

    def empty(self, shape, dtype=np.float32):
        """An uninitialised device array (for a backend to write into)."""
        raise NotImplementedError

    def from_host(self, x: np.ndarray):
        """Copy a host array to the device (no copy on :class:`HostDevice`)."""
        raise NotImplementedError

    def to_host(self, x) -> np.ndarray:
        """Copy a device array to a host numpy array (the pipeline's only way back)."""
        raise NotImplementedError

    def ptr(self, x) -> int:
        """Address of a C-contiguous device array's first element."""
        raise NotImplementedError

    def contiguous(self, x):
        raise NotImplementedError

    def copy(self, x):
        """A C-contiguous copy of ``x`` in new device memory (owning its buffer)."""
        raise NotImplementedError

    def concat(self, xs):
        """Device arrays joined along axis 0 (a run split into profile-sized batches)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until work queued on the device's current stream has finished."""


class HostDevice(ArrayDevice):
    """numpy arrays in host memory (ONNX Runtime CPU execution provider)."""

    name = "cpu"
    ort_device_type = "cpu"
    xp = np

    def is_device_array(self, x) -> bool:
        return isinstance(x, np.ndarray)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def empty(self, shape, dtype=np.float32):
        return np.empty(shape, dtype)

    def from_host(self, x):
        return np.asarray(x)

    def to_host(self, x) -> np.ndarray:
        return np.array(x)

    def ptr(self, x) -> int:
        return int(x.ctypes.data)

    def contiguous(self, x):
        return np.ascontiguousarray(x)

    def copy(self, x):
        return np.array(x, order="C")

    def concat(self, xs):
        return np.concatenate(xs, axis=0)


class CupyDevice(ArrayDevice):
    """CuPy arrays on one CUDA GPU. unverified: never run on a GPU with onnxruntime-gpu or
    TensorRT (the lent GPU had neither); the CuPy calls are CuPy's documented API.

    Raises:
        BackendUnavailableError: CuPy is not installed or sees no GPU.
    """

    ort_device_type = "cuda"

    def __init__(self, device_id: int = 0):
        try:
            import cupy
        except ImportError as e:
            raise BackendUnavailableError(
                "GPU memory here means CuPy (pip install cupy-cuda13x, or cupy-cuda12x: the CUDA major of your onnxruntime-gpu / TensorRT): the TensorRT backend and "
                "device-resident tokens need it; for ONNX Runtime CUDA without it, run with "
                "device_resident=False / masc-run --no-device-resident") from e
        try:
            cupy.cuda.Device(device_id).use()
        except Exception as e:  # cupy raises CUDARuntimeError without a GPU
            raise BackendUnavailableError(f"CuPy cannot use CUDA device {device_id}: {e}") from e
        self.xp = cupy
        self.device_id = int(device_id)
        self.name = f"cuda:{device_id}"

    def is_device_array(self, x) -> bool:
        return isinstance(x, self.xp.ndarray)

    def zeros(self, shape, dtype=np.float32):
        return self.xp.zeros(shape, dtype)

    def empty(self, shape, dtype=np.float32):
        return self.xp.empty(shape, dtype)

    def from_host(self, x):
        return self.xp.asarray(x)

    def to_host(self, x) -> np.ndarray:
        return self.xp.asnumpy(x)

    def ptr(self, x) -> int:
        return int(x.data.ptr)

    def contiguous(self, x):
        return self.xp.ascontiguousarray(x)

    def copy(self, x):
        return self.xp.array(x, order="C")

    def concat(self, xs):
        return self.xp.concatenate(xs, axis=0)

    def new_stream(self):
        """A non-blocking CUDA stream (``.ptr``, ``.synchronize()``) for a TensorRT context."""
        return self.xp.cuda.Stream(non_blocking=True)

    def synchronize(self) -> None:
        # ORT and TensorRT run on their own streams; CuPy's work (packing) must be finished
        # before they read it, and theirs before CuPy reads their outputs.
        self.xp.cuda.get_current_stream().synchronize()


def is_gpu(backend: str, provider: str) -> bool:
    """Whether a backend/provider pair computes on a CUDA GPU (TensorRT always does)."""
    return backend == "tensorrt" or provider in ("cuda", "CUDAExecutionProvider")


def device_for(backend: str, provider: str) -> ArrayDevice:
    """The token device that goes with a backend and provider.

    ``onnxruntime`` + ``cpu`` -> :class:`HostDevice`; ``onnxruntime`` + ``cuda`` and
    ``tensorrt`` -> :class:`CupyDevice`.

    Raises:
        BackendUnavailableError: a GPU device without CuPy (never a quiet switch to host memory).
    """
    if is_gpu(backend, provider):
        return CupyDevice(0)
    if backend == "onnxruntime" and provider in ("cpu", "CPUExecutionProvider"):
        return HostDevice()
    raise BackendUnavailableError(f"no token device for backend {backend!r} with provider {provider!r}")
