"""Where patch tokens live between graphs: an array module plus the few operations the
device-resident pipeline needs (allocate, pack, hand a pointer to a backend, copy back).

The runtime keeps tokens as arrays of one :class:`ArrayDevice`:

- :class:`HostDevice` (numpy): ONNX Runtime's CPU execution provider bound through IO binding.
  Scores equal the ordinary path; it exists so the device-resident code runs, and is tested, on
  every machine.
- :class:`CupyDevice` (CuPy, a CUDA GPU): ORT's CUDA execution provider and TensorRT read and
  write CuPy memory by pointer, so patch tokens stay on the GPU from the vision graph to the
  pooling head and the CP head; only scores, pooled embeddings and attention rows come back.
  unverified on a GPU: never run with onnxruntime-gpu or TensorRT (tested against a fake device).

Every device-to-host copy goes through :meth:`ArrayDevice.to_host`, the one place a test can
watch (tests/test_device_resident.py). CuPy refuses implicit conversion to numpy, so a stray
host conversion in the pipeline is an error on the GPU, and the tests reproduce that strictness
on CPU with a fake device.

Streams, pinned host memory and asynchronous copies (what the TensorRT runner needs to overlap
copies with compute): :meth:`ArrayDevice.new_stream`, :meth:`~ArrayDevice.pinned_empty` (page-
locked host memory, which a DMA engine can read while the GPU computes; a copy from pageable
memory is staged by the driver and does not overlap), :meth:`~ArrayDevice.copy_to_device`,
:meth:`~ArrayDevice.copy_to_host` and :meth:`~ArrayDevice.copy_on_stream` (device to device; all
queued on a stream: the data is there only after that stream's ``synchronize()``, or for work
queued after it on the same stream), :meth:`~ArrayDevice.mem_get_info` (free and total device memory, for the
TensorRT memory plan). :func:`overlapped` is the double-buffered loop: preparing batch n+1 (decode,
preprocess) on a worker thread while batch n runs. tests/doubles/fake_tensorrt.py ``NumpyDevice`` stands in
for CuPy with copies and kernels that complete on a background thread, so a missing
``synchronize()`` reads stale data there as it would on a GPU.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import Any, Callable, Iterable, Protocol, TypeVar

import numpy as np
from numpy.typing import DTypeLike

from ..errors import BackendUnavailableError

T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P")
#: A device array: ``numpy.ndarray`` on the host, ``cupy.ndarray`` on a GPU (CuPy ships no types).
DeviceArray = Any
#: An array shape: an int (1-D) or a sequence of ints.
ShapeLike = int | Sequence[int]


class DeviceCopyError(ValueError):
    """A device-to-device copy between arrays whose shapes, dtypes or byte counts differ (refused
    before anything is queued: a raw ``cudaMemcpyAsync`` would copy bytes, never broadcast)."""


def check_copy(src: DeviceArray, dst: DeviceArray) -> int:
    """Check that ``src`` can be copied byte for byte into ``dst``.

    Args:
        src: the source array, C-contiguous, any shape and dtype.
        dst: the destination array, C-contiguous, of ``src``'s shape and dtype.

    Returns:
        the bytes to copy (``src.nbytes``).

    Raises:
        DeviceCopyError: shapes, dtypes or byte counts differ, or either array is not C-contiguous
            (one line naming both sides).
    """
    same = tuple(src.shape) == tuple(dst.shape) and np.dtype(src.dtype) == np.dtype(dst.dtype)
    contiguous = bool(src.flags.c_contiguous) and bool(dst.flags.c_contiguous)
    if not same or int(src.nbytes) != int(dst.nbytes) or not contiguous:
        raise DeviceCopyError(
            f"device copy refused: source {tuple(src.shape)} {np.dtype(src.dtype)} ({int(src.nbytes)} bytes) into "
            f"destination {tuple(dst.shape)} {np.dtype(dst.dtype)} ({int(dst.nbytes)} bytes); both must be "
            "C-contiguous with the same shape and dtype"
        )
    return int(src.nbytes)


class Event(Protocol):
    """Something to wait on: a stream or an event recorded on one."""

    def synchronize(self) -> None:
        """Wait until the work queued on it has finished."""


class Stream(Event, Protocol):
    """A device stream: ``ptr`` (the ``cudaStream_t`` as an int; 0 on the host) and ``synchronize()``."""

    @property
    def ptr(self) -> int:
        """The stream's handle as an int."""


class ArrayDevice:
    """Interface of a token device. Subclasses set ``name``, ``ort_device_type`` (``"cpu"`` or
    ``"cuda"``), ``device_id`` and ``xp`` (the array module)."""

    name: str
    ort_device_type: str
    device_id: int = 0
    #: The array module: numpy, or cupy.
    xp: Any

    def is_device_array(self, x: object) -> bool:
        raise NotImplementedError

    def zeros(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> DeviceArray:
        """A zero-filled device array of ``shape`` and ``dtype``."""
        raise NotImplementedError

    def empty(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> DeviceArray:
        """An uninitialised device array (for a backend to write into)."""
        raise NotImplementedError

    def from_host(self, x: np.ndarray) -> DeviceArray:
        """Copy a host array to the device (no copy on :class:`HostDevice`)."""
        raise NotImplementedError

    def to_host(self, x: DeviceArray) -> np.ndarray:
        """Copy a device array to a host numpy array (the pipeline's only way back)."""
        raise NotImplementedError

    def ptr(self, x: DeviceArray) -> int:
        """Address of a C-contiguous device array's first element."""
        raise NotImplementedError

    def contiguous(self, x: DeviceArray) -> DeviceArray:
        raise NotImplementedError

    def copy(self, x: DeviceArray) -> DeviceArray:
        """A C-contiguous copy of ``x`` in new device memory (owning its buffer)."""
        raise NotImplementedError

    def concat(self, xs: Sequence[DeviceArray]) -> DeviceArray:
        """Device arrays joined along axis 0 (a run split into profile-sized batches)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until work queued on the device's current stream has finished."""

    def new_stream(self) -> Stream:
        """A stream for one engine: ``.ptr`` (the ``cudaStream_t`` as an int) and ``.synchronize()``."""
        raise NotImplementedError

    def pinned_empty(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> np.ndarray:
        """An uninitialised host array in page-locked memory (asynchronous copies read it directly)."""
        raise NotImplementedError

    def copy_to_device(self, host: np.ndarray, dst: DeviceArray, stream: Stream) -> None:
        """Queue a host-to-device copy of ``host`` into the device array ``dst`` on ``stream``."""
        raise NotImplementedError

    def copy_to_host(self, src: DeviceArray, out: np.ndarray, stream: Stream) -> None:
        """Queue a device-to-host copy of ``src`` into the host array ``out`` on ``stream``;
        ``out`` holds the data once ``stream.synchronize()`` returns."""
        raise NotImplementedError

    def copy_on_stream(self, src: DeviceArray, dst: DeviceArray, stream: Stream) -> None:
        """Queue a device-to-device copy of ``src`` into ``dst`` on ``stream`` (asynchronous: work
        queued after it on the same stream sees the data; work on another stream is not ordered
        after it, and the host sees it after ``stream.synchronize()``). Nothing is allocated, so it
        may precede a CUDA graph's launch on that stream (engine/backends/trt_graphs.py).

        Args:
            src: C-contiguous device array, any shape and dtype; must stay alive until the copy ran.
            dst: C-contiguous device array of ``src``'s shape and dtype.
            stream: the stream the copy is ordered on (the one whose work reads ``dst``).

        Raises:
            DeviceCopyError: shapes, dtypes or byte counts differ (:func:`check_copy`).
        """
        raise NotImplementedError

    def record_event(self, stream: Stream) -> Event:
        """An event recorded on ``stream`` after the work queued so far: ``.synchronize()`` waits for
        that work only (not for what is queued after it)."""
        raise NotImplementedError

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the device's memory."""
        raise NotImplementedError

    def release_cached(self) -> None:
        """Hand memory the array module keeps cached (freed blocks) back to the driver."""


class _HostStream:
    """Host memory has no streams: work is done when the call returns."""

    ptr = 0

    def synchronize(self) -> None:
        pass


class HostDevice(ArrayDevice):
    """numpy arrays in host memory (ONNX Runtime CPU execution provider)."""

    name = "cpu"
    ort_device_type = "cpu"
    xp = np

    def is_device_array(self, x: object) -> bool:
        return isinstance(x, np.ndarray)

    def zeros(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> DeviceArray:
        return np.zeros(shape, dtype)

    def empty(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> DeviceArray:
        return np.empty(shape, dtype)

    def from_host(self, x: np.ndarray) -> DeviceArray:
        return np.asarray(x)

    def to_host(self, x: DeviceArray) -> np.ndarray:
        return np.array(x)

    def ptr(self, x: DeviceArray) -> int:
        return int(x.ctypes.data)

    def contiguous(self, x: DeviceArray) -> DeviceArray:
        return np.ascontiguousarray(x)

    def copy(self, x: DeviceArray) -> DeviceArray:
        return np.array(x, order="C")

    def concat(self, xs: Sequence[DeviceArray]) -> DeviceArray:
        return np.concatenate(xs, axis=0)

    def new_stream(self) -> Stream:
        return _HostStream()

    def pinned_empty(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> np.ndarray:
        return np.empty(shape, dtype)

    def copy_to_device(self, host: np.ndarray, dst: DeviceArray, stream: Stream) -> None:
        np.copyto(dst, host)

    def copy_to_host(self, src: DeviceArray, out: np.ndarray, stream: Stream) -> None:
        np.copyto(out, src)

    def copy_on_stream(self, src: DeviceArray, dst: DeviceArray, stream: Stream) -> None:
        """Copy ``src`` into ``dst`` now (host work is done when its call returns).

        Raises:
            DeviceCopyError: shapes, dtypes or byte counts differ (no broadcast, no cast).
        """
        check_copy(src, dst)
        np.copyto(dst, src, casting="no")

    def record_event(self, stream: Stream) -> Event:
        return _HostStream()  # host work is done when its call returns

    def mem_get_info(self) -> tuple[int, int]:
        """Available and total host memory (``/proc/meminfo``; ``(0, 0)`` where it cannot be read)."""
        try:
            info = dict(line.split(":", 1) for line in open("/proc/meminfo").read().splitlines() if ":" in line)
            return int(info["MemAvailable"].split()[0]) * 1024, int(info["MemTotal"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return 0, 0


class CupyDevice(ArrayDevice):
    """CuPy arrays on one CUDA GPU. unverified: never run on a GPU with onnxruntime-gpu or
    TensorRT; the CuPy calls are CuPy's documented API.

    Raises:
        BackendUnavailableError: CuPy is not installed or sees no GPU.
    """

    ort_device_type = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        try:
            import cupy
        except ImportError as e:
            raise BackendUnavailableError(
                "GPU memory here means CuPy (pip install 'cupy-cuda13x[ctk]', or 'cupy-cuda12x[ctk]': the CUDA major of your "
                "onnxruntime-gpu / TensorRT; docs/gpu.md): the TensorRT backend and "
                "device-resident tokens need it; for ONNX Runtime CUDA without it, run with "
                "device_resident=False / masc-run --no-device-resident"
            ) from e
        try:
            cupy.cuda.Device(device_id).use()
        except Exception as e:  # cupy raises CUDARuntimeError without a GPU
            raise BackendUnavailableError(f"CuPy cannot use CUDA device {device_id}: {e}") from e
        self.xp = cupy
        self.device_id = int(device_id)
        self.name = f"cuda:{device_id}"

    def is_device_array(self, x: object) -> bool:
        return isinstance(x, self.xp.ndarray)

    def zeros(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> DeviceArray:
        return self.xp.zeros(shape, dtype)

    def empty(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> DeviceArray:
        return self.xp.empty(shape, dtype)

    def from_host(self, x: np.ndarray) -> DeviceArray:
        return self.xp.asarray(x)

    def to_host(self, x: DeviceArray) -> np.ndarray:
        host: np.ndarray = self.xp.asnumpy(x)
        return host

    def ptr(self, x: DeviceArray) -> int:
        return int(x.data.ptr)

    def contiguous(self, x: DeviceArray) -> DeviceArray:
        return self.xp.ascontiguousarray(x)

    def copy(self, x: DeviceArray) -> DeviceArray:
        return self.xp.array(x, order="C")

    def concat(self, xs: Sequence[DeviceArray]) -> DeviceArray:
        return self.xp.concatenate(xs, axis=0)

    def new_stream(self) -> Stream:
        """A non-blocking CUDA stream (``.ptr``, ``.synchronize()``) for a TensorRT context."""
        stream: Stream = self.xp.cuda.Stream(non_blocking=True)
        return stream

    def synchronize(self) -> None:
        # ORT and TensorRT run on their own streams; CuPy's work (packing) must be finished
        # before they read it, and theirs before CuPy reads their outputs.
        self.xp.cuda.get_current_stream().synchronize()

    def pinned_empty(self, shape: ShapeLike, dtype: DTypeLike = np.float32) -> np.ndarray:
        """Page-locked host memory from CuPy's pinned pool (``cupy.cuda.alloc_pinned_memory``); the
        numpy array keeps the allocation alive. unverified on a GPU."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        mem = self.xp.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
        return np.frombuffer(mem, dtype, count).reshape(shape)

    def copy_to_device(self, host: np.ndarray, dst: DeviceArray, stream: Stream) -> None:
        # ndarray.set(arr, stream): cudaMemcpyAsync on that stream; asynchronous with respect to
        # the host only from pinned memory. unverified on a GPU.
        dst.set(host, stream=stream)

    def copy_to_host(self, src: DeviceArray, out: np.ndarray, stream: Stream) -> None:
        # into pinned memory: cudaMemcpyAsync, returns at once; wait on an event (record_event)
        src.get(stream=stream, out=out, blocking=False)  # unverified on a GPU

    def copy_on_stream(self, src: DeviceArray, dst: DeviceArray, stream: Stream) -> None:
        """``cudaMemcpyAsync`` device to device on ``stream``: CuPy's
        ``MemoryPointer.copy_from_device_async(src, size, stream)`` (cupy/cupy cupy/cuda/memory.pyx:
        ``runtime.memcpyAsync(self.ptr, src.ptr, size, memcpyDefault, stream.ptr)``; it allocates
        nothing and does not synchronise). unverified on a GPU.

        Raises:
            DeviceCopyError: shapes, dtypes or byte counts differ (checked first: the raw copy
                would copy bytes whatever the shapes).
        """
        nbytes = check_copy(src, dst)
        dst.data.copy_from_device_async(src.data, nbytes, stream)

    def record_event(self, stream: Stream) -> Event:
        """``cupy.cuda.Event`` recorded on ``stream`` (``.synchronize()`` waits for it). unverified on a GPU."""
        event = self.xp.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        recorded: Event = event
        return recorded

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.xp.cuda.runtime.memGetInfo()  # unverified on a GPU
        return int(free), int(total)

    def release_cached(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()
        self.xp.get_default_pinned_memory_pool().free_all_blocks()


def is_gpu(backend: str, provider: str) -> bool:
    """Whether a backend/provider pair computes on a CUDA GPU (the backend registry says)."""
    from .backends.registry import get_backend

    return get_backend(backend).is_gpu(provider)


def device_for(backend: str, provider: str) -> ArrayDevice:
    """The token device that goes with a backend and provider: :class:`CupyDevice` where the
    backend computes on a GPU (ONNX Runtime's CUDA provider, TensorRT), else :class:`HostDevice`
    (every CPU backend runs its graphs on host numpy arrays through ``run_device``).

    Raises:
        BackendUnavailableError: an unknown backend, or a GPU device without CuPy (never a quiet
            switch to host memory).
    """
    return CupyDevice(0) if is_gpu(backend, provider) else HostDevice()


def overlapped(batches: Iterable[T], prepare: Callable[[T], P], run: Callable[[P], R]) -> list[R]:
    """``[run(prepare(b)) for b in batches]`` with ``prepare`` of batch n+1 on a worker thread
    while ``run`` of batch n goes on in the caller's thread (double buffering: at most one
    prepared batch waits, so host memory holds two batches).

    ``prepare`` is the host work (decode, preprocess, stacking into pinned buffers) and ``run``
    the device work (copies and engine on its stream, then its synchronize); the GIL is released
    while a kernel, an ONNX Runtime run or a stream synchronize waits, so the two overlap. Results
    are those of the serial loop, in order; an exception from either is raised here (the batch
    being prepared is finished first).
    """
    batches = list(batches)
    if not batches:
        return []
    results: list[R] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prepare") as pool:
        pending = pool.submit(prepare, batches[0])
        for i in range(len(batches)):
            ready = pending.result()
            if i + 1 < len(batches):
                pending = pool.submit(prepare, batches[i + 1])
            results.append(run(ready))
    return results


class PinnedStaging:
    """Page-locked host buffers, two per input name: the copy of call n reads one while call n+1
    fills the other (``slot`` alternates per call). Each is a byte buffer grown to the largest
    input seen and viewed at each call's shape, so NaFlex batches of varying patch counts do not
    pin a buffer per shape. A buffer is refilled only after the stream that read it was
    synchronized, which the runner does before returning."""

    def __init__(self, device: ArrayDevice) -> None:
        self.device = device
        self._buffers: dict[tuple[str, int], np.ndarray] = {}
        self._lock = threading.Lock()
        self.slot = 0

    def buffer(self, name: str, shape: ShapeLike, dtype: DTypeLike) -> np.ndarray:
        """This call's pinned buffer for ``name`` viewed as ``shape`` / ``dtype`` (contents undefined)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        key = (name, self.slot)
        with self._lock:
            buf = self._buffers.get(key)
            if buf is None or buf.nbytes < nbytes:
                buf = self._buffers[key] = self.device.pinned_empty((max(1, nbytes),), np.uint8)
        return buf[:nbytes].view(dtype).reshape(shape)

    def stage(self, name: str, x: np.ndarray) -> np.ndarray:
        """``x`` copied into this call's pinned buffer for ``name``."""
        view = self.buffer(name, x.shape, x.dtype)
        np.copyto(view, x)
        return view

    def next_call(self) -> None:
        self.slot ^= 1

    def clear(self) -> None:
        with self._lock:
            self._buffers.clear()
