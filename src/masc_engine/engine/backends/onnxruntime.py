"""ONNX Runtime backend (CPU execution provider here; CUDA EP when installed).

The provider is chosen explicitly: a requested provider that this onnxruntime build lacks is a
:class:`BackendUnavailableError`, never a quiet switch to CPU (ONNX Runtime itself would fall back
and only log a warning, so we check before creating the session and after).

:meth:`OrtRunner.run_device` runs through IO binding on a token device (engine/device.py): inputs
and outputs are bound by pointer, so on the CUDA execution provider patch tokens never leave the
GPU between graphs (unverified on a GPU: never run with onnxruntime-gpu; on CPU it is tested to
equal :meth:`OrtRunner.run` exactly).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import BackendUnavailableError
from ..stage_clock import stage
from .registry import BACKENDS

if TYPE_CHECKING:
    from .base import BundleView
    from ..device import ArrayDevice, DeviceArray

#: ONNX tensor type strings (``NodeArg.type``) -> numpy dtypes, for the graphs' inputs and outputs.
ORT_DTYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(bool)": np.dtype(np.bool_),
}

#: Short names accepted on the command line -> ONNX Runtime provider names.
PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def resolve_provider(provider: str) -> str:
    """``"cpu"`` / ``"cuda"`` / a full provider name -> the provider name, checked available.

    Raises:
        BackendUnavailableError: unknown name, or not in ``onnxruntime.get_available_providers()``.
    """
    import onnxruntime as ort

    name = PROVIDERS.get(provider, provider)
    if name == "CUDAExecutionProvider" and hasattr(ort, "preload_dlls"):
        # CUDA and cuDNN from the NVIDIA wheels (onnxruntime-gpu[cuda,cudnn], docs/install.md "GPU install"),
        # else the system's; missing libraries surface below as the provider not being created.
        ort.preload_dlls()
    available = ort.get_available_providers()
    if name not in available:
        raise BackendUnavailableError(
            f"execution provider {provider!r} ({name}) is not available in this onnxruntime "
            f"{ort.__version__} build; available: {', '.join(available)}. Install the matching "
            "onnxruntime package (e.g. onnxruntime-gpu for CUDA) or choose --provider cpu."
        )
    return name


def provider_options(provider_name: str) -> dict[str, str]:
    """Options passed with the provider.

    CUDA: ``use_tf32`` off. ONNX Runtime's CUDA provider runs
    float32 GEMMs in TF32 by default (``use_tf32`` = 1, onnxruntime's CUDA provider options), which
    would make "fp32" on a GPU TF32 and the fp32 fidelity reference not fp32; an fp16/bf16 bundle's
    float32 islands stay fp32 too. (unverified on a GPU: no onnxruntime-gpu run in this project.)"""
    if provider_name == "CUDAExecutionProvider":
        return {"use_tf32": "0"}
    return {}


#: ``ort_memory`` settings for CPU sessions (figures in bench/results/memory_*.json, docs/memory.md).
#: ``"lean"`` (default): ONNX Runtime's CPU arena off and memory patterns off. The arena keeps the
#: high-water mark of every batch it has served, and NaFlex batches change shape (patch count,
#: batch size); memory patterns pre-plan one block per input shape. Off, a batch's buffers go back
#: to the C allocator when it is done, so the host memory is weights + the batch in flight.
#: ``"arena"``: ONNX Runtime's defaults. CUDA sessions are not affected (device memory has its own
#: arena; these two options only concern CPU allocations).
ORT_MEMORY = BACKENDS["onnxruntime"].option("ort_memory").choices  # defined with the registry entry


def session_options(
    ort: Any, intra_op_threads: int | None = None, inter_op_threads: int | None = None, memory: str = "lean"
) -> Any:
    """``onnxruntime.SessionOptions`` for one of our graphs (see :data:`ORT_MEMORY`).

    Raises:
        ValueError: ``memory`` is not one of :data:`ORT_MEMORY`.
    """
    if memory not in ORT_MEMORY:
        raise ValueError(f"ort_memory must be one of {ORT_MEMORY}, got {memory!r}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if intra_op_threads:
        opts.intra_op_num_threads = int(intra_op_threads)
    if inter_op_threads:
        opts.inter_op_num_threads = int(inter_op_threads)
    if memory == "lean":
        opts.enable_cpu_mem_arena = False
        opts.enable_mem_pattern = False
    return opts


def graph_label(path: str | Path, name: str) -> str:
    """``<bundle folder>/<graph>``: how a graph's stages are named in the stage split
    (engine/stage_clock.py)."""
    return f"{Path(path).parent.name}/{name}"


def check_available(provider: str = "cpu", precision: str | None = None) -> None:
    """The backend registry's availability check: ``provider`` is in this onnxruntime build
    (``precision`` is the bundle's business, :func:`check_graph_precision`).

    Raises:
        BackendUnavailableError: the provider is missing.
    """
    resolve_provider(provider)


def check_graph_precision(bundle: BundleView, provider: str, precision: str | None = None) -> None:
    """Refuse, before any session is made, a precision ONNX Runtime cannot give from ``bundle``'s
    graphs (the precision is in the graphs: ``masc-export --precision``) or bf16 graphs on its CPU
    provider.

    Raises:
        BackendUnavailableError: naming what to export or where to run instead.
    """
    own = bundle.graph_precision
    if precision not in (None, own):
        raise BackendUnavailableError(
            f"bundle {bundle.path} holds {own} graphs; for precision {precision!r} export a bundle with "
            f"masc-export --precision {precision} (the precision is in the graphs)"
        )
    if own == "bf16" and provider in ("cpu", "CPUExecutionProvider"):
        # ONNX Runtime's CPU provider has no bf16 MatMul/Add/Mul/Tanh kernels (onnxruntime 1.32).
        raise BackendUnavailableError(
            f"bundle {bundle.path} holds bf16 graphs, which ONNX Runtime's CPU provider cannot run (no bf16 "
            "kernels); use --provider cuda or --backend tensorrt on a GPU, or an fp16/fp32 bundle on CPU"
        )


def load_runner(
    bundle: BundleView,
    graph: str,
    *,
    provider: str = "cpu",
    precision: str | None = None,
    intra_op_threads: int | None = None,
    variant: str = "portable",
    options: Mapping[str, Any] | None = None,
) -> OrtRunner:
    """An :class:`OrtRunner` for ``graph`` of ``bundle`` in graph ``variant`` (the registry's loader).

    Args:
        bundle: the bundle holding the graph.
        graph: the graph's name (``vision``, ``pool``, ``text``, ``cp``).
        provider: ``cpu``, ``cuda`` or a full ONNX Runtime provider name.
        precision: None or the bundle's own graph precision (checked: the graphs carry it).
        intra_op_threads: ONNX Runtime's intra-op threads (None: its default).
        variant: ``portable`` or a variant the bundle holds (``ort-cpu``).
        options: this backend's options (engine/backends/registry.py): ``ort_memory``.

    Raises:
        BackendUnavailableError: the provider is missing, or a precision the graphs do not hold.
        BundleError: the graph file is missing or modified, or its inputs and outputs are not those
            its manifest entry declares.
    """
    from ..manifest import check_graph_io

    check_graph_precision(bundle, provider, precision)
    runner = OrtRunner(
        bundle.graph_file(graph, variant),
        graph,
        provider=provider,
        intra_op_threads=intra_op_threads,
        ort_memory=(options or {}).get("ort_memory", "lean"),
        precision=bundle.graph_precision,
    )
    # The graph itself against its manifest entry, before any batch runs on it.
    sess = runner.session
    check_graph_io(
        bundle.graph(graph),
        [(a.name, a.shape) for a in sess.get_inputs()],
        [(a.name, a.shape) for a in sess.get_outputs()],
        graph,
        str(bundle.path),
    )
    return runner


class OrtRunner:
    """One ``onnxruntime.InferenceSession``. ``run`` is thread-safe (ORT sessions are).

    Attributes:
        precision: what the graph computes in (``fp32``, ``fp16``, ``bf16``, ``int8-dynamic``: the
            bundle's graphs carry it); keys masc-run's caches.
    """

    backend = "onnxruntime"

    def __init__(
        self,
        path: str | Path,
        name: str,
        provider: str = "cpu",
        intra_op_threads: int | None = None,
        inter_op_threads: int | None = None,
        ort_memory: str = "lean",
        precision: str = "fp32",
    ) -> None:
        import onnxruntime as ort

        self.precision = precision

        provider_name = resolve_provider(provider)
        opts = session_options(ort, intra_op_threads, inter_op_threads, ort_memory)
        self.ort_memory = ort_memory
        self.provider_options = provider_options(provider_name)
        self.stage = graph_label(path, name)
        with stage(f"session:{self.stage}"):
            self.session = ort.InferenceSession(
                str(path), sess_options=opts, providers=[(provider_name, self.provider_options)]
            )
        got = self.session.get_providers()[0]
        if got != provider_name:
            hint = (
                " (its CUDA/cuDNN libraries were not found or no GPU is visible: install onnxruntime-gpu[cuda,cudnn], "
                "which brings the matching NVIDIA CUDA and cuDNN wheels, or a system CUDA/cuDNN of the major "
                'versions onnxruntime-gpu names in its log above; docs/install.md, "GPU install")'
                if provider_name == "CUDAExecutionProvider"
                else ""
            )
            raise BackendUnavailableError(
                f"onnxruntime created {name} on {got}, not the requested {provider_name}{hint}"
            )
        self.name = name
        self.path = str(path)
        self.provider = provider_name
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._in_args = {a.name: a for a in self.session.get_inputs()}
        self._out_args = {a.name: a for a in self.session.get_outputs()}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph on host arrays: every input name -> an array of the graph's dtype."""
        with stage(f"run:{self.stage}"):
            outs = self.session.run(self.output_names, {k: feeds[k] for k in self.input_names})
        return dict(zip(self.output_names, outs))

    def output_shapes(self, input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Concrete output shapes from the inputs' shapes, by the graph's symbolic dimension names
        (``batch``, ``num_patches``, ... : the exporter names every dynamic axis, export/graphs.py).

        Raises:
            ValueError: an output dimension no input determines, or inputs that disagree on one.
        """
        dims: dict[str, int] = {}
        for name, arg in self._in_args.items():
            shape = input_shapes[name]
            if len(shape) != len(arg.shape):
                raise ValueError(
                    f"graph {self.name!r}: input {name} must have rank {len(arg.shape)} "
                    f"({arg.shape}), got shape {tuple(shape)}"
                )
            for sym, n in zip(arg.shape, shape):
                if isinstance(sym, str):
                    if dims.setdefault(sym, int(n)) != int(n):
                        raise ValueError(
                            f"graph {self.name!r}: dimension {sym!r} is {dims[sym]} in one input and {n} in {name}"
                        )
                elif sym is not None and int(sym) != int(n):
                    raise ValueError(f"graph {self.name!r}: input {name} needs size {sym}, got shape {tuple(shape)}")
        out: dict[str, tuple[int, ...]] = {}
        for name, arg in self._out_args.items():
            missing = [d for d in arg.shape if isinstance(d, str) and d not in dims]
            if missing or any(d is None for d in arg.shape):
                raise ValueError(
                    f"graph {self.name!r}: output {name} has dimensions {arg.shape} that its inputs "
                    "do not determine; run_device needs named dynamic axes"
                )
            out[name] = tuple(dims[d] if isinstance(d, str) else int(d) for d in arg.shape)
        return out

    def run_device(self, feeds: dict[str, DeviceArray], device: ArrayDevice) -> dict[str, DeviceArray]:
        """Run with inputs and outputs in ``device`` memory (an engine/device.py ``ArrayDevice``).

        Args:
            feeds: every input name -> a device array of the graph's dtype (bound by pointer, no
                copy) or a host numpy array (copied to the device by ONNX Runtime: masks, ids).
            device: where the outputs are allocated; must match the provider (host memory for
                the CPU provider, CUDA memory for the CUDA provider).

        Returns:
            output name -> device array (``device.empty`` filled by the graph).

        Raises:
            BackendUnavailableError: device and provider do not match.
            TypeError: a device array whose dtype is not the graph's.
        """
        want = "cuda" if self.provider == "CUDAExecutionProvider" else "cpu"
        if device.ort_device_type != want:
            raise BackendUnavailableError(
                f"graph {self.name!r} runs on {self.provider}; it cannot use {device.name} memory"
            )
        io = self.session.io_binding()
        bound: dict[str, DeviceArray] = {}
        for name in self.input_names:
            x = feeds[name]
            dtype = ORT_DTYPES[self._in_args[name].type]
            if device.is_device_array(x):
                if np.dtype(x.dtype) != dtype:
                    raise TypeError(f"graph {self.name!r}: input {name} must be {dtype}, got {x.dtype}")
                x = device.contiguous(x)
                io.bind_input(name, device.ort_device_type, device.device_id, dtype, list(x.shape), device.ptr(x))
            else:
                x = np.ascontiguousarray(x, dtype=dtype)
                io.bind_cpu_input(name, x)
            bound[name] = x  # keep every bound buffer alive until the run returns
        outs: dict[str, DeviceArray] = {}
        for name, shape in self.output_shapes({k: tuple(v.shape) for k, v in bound.items()}).items():
            outs[name] = device.empty(shape, ORT_DTYPES[self._out_args[name].type])
            io.bind_output(
                name,
                device.ort_device_type,
                device.device_id,
                ORT_DTYPES[self._out_args[name].type],
                list(shape),
                device.ptr(outs[name]),
            )
        # ORT runs on its own CUDA stream and does not wait for others before Run
        # (onnxruntime issues #26609, #15438): finish our packing and its queued host copies first.
        device.synchronize()
        io.synchronize_inputs()
        with stage(f"run:{self.stage}"):
            self.session.run_with_iobinding(io)
        io.synchronize_outputs()
        return outs
