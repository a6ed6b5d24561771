"""TensorRT's lazy import, the process's one logger, the typed errors of its calls, and this
machine's GPU facts (the builder, engine/backends/trt_build.py, and the runner,
engine/backends/tensorrt.py, share them).

- :func:`import_tensorrt`: ``import tensorrt`` or :class:`BackendUnavailableError` naming what to
  install; importing masc_engine never needs TensorRT.
- :func:`trt_logger`: one ``trt.Logger`` per process, which TensorRT requires to outlive every
  builder, runtime and engine made through it.
- :class:`TensorRTCallError`: a TensorRT call that reports failure by its return value.
- :func:`current_device_info` (TensorRT version, GPU name, compute capability: what an engine set's
  ``engines.json`` records and a load compares), :func:`device_memory_info` (free and total device
  memory) and :func:`default_timing_cache` (the timing cache shared by every build on a machine).

UNVERIFIED ON A GPU: the functions that touch ``tensorrt``, CUDA, CuPy or a GPU have never run
with TensorRT or on a GPU (docs/verification.md); on CPU they run against tests/doubles/fake_tensorrt.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailableError, MascEngineError
from ..device import CupyDevice

if TYPE_CHECKING:  # the annotations name TensorRT's classes; the module itself imports it lazily
    import tensorrt as trt


class TensorRTCallError(MascEngineError):
    """A TensorRT call that reports failure by its return value returned ``False`` / ``None`` /
    ``-1`` (the message names the call, the engine, the tensor or profile and the shapes)."""


_LOGGER: tuple[Any, Any] | None = None  # (the tensorrt module, its Logger)
_LOGGER_LOCK = threading.Lock()


def trt_logger(trt: Any) -> "trt.Logger":
    """The process's one ``trt.Logger`` (severity WARNING), made on first use. TensorRT requires
    the logger passed to ``Builder``, ``Runtime`` and ``OnnxParser`` to outlive every object they
    make; one module-level logger does, and creating one per build or runner does not help
    (TensorRT registers the first logger per process). unverified on a GPU."""
    global _LOGGER
    with _LOGGER_LOCK:
        if _LOGGER is None or _LOGGER[0] is not trt:
            _LOGGER = (trt, trt.Logger(trt.Logger.WARNING))
        return _LOGGER[1]


INSTALL_HINT = (
    "the TensorRT backend needs NVIDIA TensorRT's Python package and a CUDA GPU: "
    "pip install tensorrt (or tensorrt-cu13 / tensorrt-cu12 matching your CUDA major), plus "
    "'cupy-cuda13x[ctk]' / 'cupy-cuda12x[ctk]' (the same CUDA major; docs/gpu.md) for device buffers; "
    "or use --backend onnxruntime"
)


def import_tensorrt() -> Any:
    """``import tensorrt`` or raise :class:`BackendUnavailableError` naming what to install."""
    try:
        import tensorrt as trt  # noqa: F401  (unverified: never run with TensorRT installed)
    except ImportError as e:
        raise BackendUnavailableError(f"{INSTALL_HINT} (import tensorrt failed: {e})") from e
    return trt


def tensorrt_available() -> bool:
    """Whether ``import tensorrt`` works here."""
    try:
        import_tensorrt()
        return True
    except BackendUnavailableError:
        return False


# --------------------------------------------------------------------------- device info


def current_device_info(device: int = 0) -> dict[str, str]:
    """TensorRT version, GPU name and compute capability of this machine.

    unverified on a GPU (never run with TensorRT). Tries cuda-python, CuPy, PyTorch,
    then ``nvidia-smi``.

    Raises:
        BackendUnavailableError: TensorRT missing, or no CUDA device could be queried.
    """
    trt = import_tensorrt()
    name, cc = _query_gpu(device)
    return {"tensorrt_version": str(trt.__version__), "gpu_name": name, "compute_capability": cc}


def _query_gpu(device: int) -> tuple[str, str]:
    # unverified on a GPU: never run with TensorRT.
    try:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart
        err, props = cudart.cudaGetDeviceProperties(device)
        if int(err) == 0:
            name = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
            return name.strip("\x00 "), f"{props.major}.{props.minor}"
    except Exception:  # noqa: BLE001 - try the next way
        pass
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return name, f"{props['major']}.{props['minor']}"
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return torch.cuda.get_device_name(device), f"{major}.{minor}"
    except Exception:  # noqa: BLE001
        pass
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={device}", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        name, cc = [s.strip() for s in out.stdout.strip().split(",")[:2]]
        return name, cc
    except Exception as e:  # noqa: BLE001
        raise BackendUnavailableError(
            f"no CUDA device {device} could be queried (cuda-python, cupy, torch, nvidia-smi all failed: {e})"
        ) from e


def device_memory_info(device: int = 0) -> tuple[int, int]:
    """``(free, total)`` bytes of device memory now (cuda-python, else CuPy). unverified on a GPU.

    Raises:
        BackendUnavailableError: neither could query the device.
    """
    try:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart
        err, free, total = cudart.cudaMemGetInfo()
        if int(err) == 0:
            return int(free), int(total)
    except Exception:  # noqa: BLE001 - try CuPy
        pass
    try:
        return CupyDevice(device).mem_get_info()
    except Exception as e:  # noqa: BLE001
        raise BackendUnavailableError(
            f"the free memory of CUDA device {device} could not be read (cuda-python, cupy): {e}"
        ) from e


def default_timing_cache(info: dict[str, str]) -> Path:
    """``$MASC_ENGINE_CACHE/tensorrt/timing-<trt>-sm<cc>.cache``: shared by every build on this
    machine (all bundles and precisions), since a timing cache is specific to the GPU and the
    TensorRT version."""
    from ..cache_root import cache_root  # the one root (engine/cache_root.py)

    root = cache_root()
    cc = str(info["compute_capability"]).replace(".", "")
    return root / "tensorrt" / f"timing-trt{info['tensorrt_version']}-sm{cc}.cache"
