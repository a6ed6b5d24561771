"""TensorRT backend: engines built from the bundle's ONNX graphs, and a runner for them.

UNVERIFIED: no TensorRT and no GPU were available to the session that wrote this module. Every
function below that touches ``tensorrt``, CUDA, CuPy or a GPU is marked "unverified" and has never
been run; it follows the TensorRT 10/11 Python API as documented (``build_serialized_network``,
``execute_async_v3``, named I/O tensors) and uses only names the real TensorRT 11.4 bindings have
(tests/test_trt_conformance.py reads them from the ``tensorrt-cu13-bindings`` wheel). The shape planning, engine-compatibility checks and
precision policy it relies on are pure functions in :mod:`.trt_profiles`, tested on CPU.

``tensorrt`` is imported lazily: importing masc_engine never needs it, and asking for the
``tensorrt`` backend without it raises :class:`BackendUnavailableError` naming what to install.

Engine set layout (beside the ONNX bundle, which stays unchanged)::

    <bundle>/tensorrt-<precision>/engines.json   TensorRT version, GPU, compute capability,
                                                 precision, profiles, sha256 of engines and ONNX
    <bundle>/tensorrt-<precision>/<graph>.engine serialized engines (vision, pool, text, cp)

Precision: strongly typed networks (TensorRT 11 has no other kind): an engine's precision is its
ONNX graph's. ``fp16``/``bf16`` engines are built from an fp16/bf16 bundle (``masc-export
--precision``), whose graphs keep LayerNorm, softmax, reductions (incl. the CP head's L2 norms and
masked mean) and the tanh-GELU decomposition in fp32 (export/precision.py); TF32 is cleared, so
float32 tensors compute in fp32. Graph inputs and outputs stay float32.
The attention masks are finite (``graphs.MASK_VALUE`` = -30000, representable in fp16; the CP head
uses ``Where`` with -4), so a fully masked row cannot become NaN.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ...errors import BackendUnavailableError, EngineCompatibilityError, MascEngineError
from ..device import CupyDevice
from . import trt_profiles as tp

class TensorRTCallError(MascEngineError):
    """A TensorRT call that reports failure by its return value returned False (the message names
    the call, the tensor and the shape)."""


INSTALL_HINT = ("the TensorRT backend needs NVIDIA TensorRT's Python package and a CUDA GPU: "
                "pip install tensorrt (or tensorrt-cu13 / tensorrt-cu12 matching your CUDA major), plus "
                "cupy-cuda13x / cupy-cuda12x (the same CUDA major) for device buffers; or use --backend onnxruntime")


def import_tensorrt():
    """``import tensorrt`` or raise :class:`BackendUnavailableError` naming what to install."""
    try:
        import tensorrt as trt  # noqa: F401  (unverified: not installed where this was written)
    except ImportError as e:
        raise BackendUnavailableError(f"{INSTALL_HINT} (import tensorrt failed: {e})") from e
    return trt


def tensorrt_available() -> bool:
    try:
        import_tensorrt()
        return True
    except BackendUnavailableError:
        return False


# --------------------------------------------------------------------------- device info


def current_device_info(device: int = 0) -> dict:
    """TensorRT version, GPU name and compute capability of this machine.

    unverified: no TensorRT/GPU was available to this session. Tries cuda-python, CuPy, PyTorch,
    then ``nvidia-smi``.

    Raises:
        BackendUnavailableError: TensorRT missing, or no CUDA device could be queried.
    """
    trt = import_tensorrt()
    name, cc = _query_gpu(device)
    return {"tensorrt_version": str(trt.__version__), "gpu_name": name, "compute_capability": cc}


def _query_gpu(device: int) -> tuple[str, str]:
    # unverified: no TensorRT/GPU was available to this session.
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
        out = subprocess.run(["nvidia-smi", f"--id={device}", "--query-gpu=name,compute_cap",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        name, cc = [s.strip() for s in out.stdout.strip().split(",")[:2]]
        return name, cc
    except Exception as e:  # noqa: BLE001
        raise BackendUnavailableError(f"no CUDA device {device} could be queried (cuda-python, cupy, torch, "
                                      f"nvidia-smi all failed: {e})") from e


def default_timing_cache(info: dict) -> Path:
    """``$MASC_ENGINE_CACHE/tensorrt/timing-<trt>-sm<cc>.cache``: shared by every build on this
    machine (all bundles and precisions), since a timing cache is specific to the GPU and the
    TensorRT version."""
    root = Path(os.environ.get("MASC_ENGINE_CACHE", Path.home() / ".cache" / "masc-engine"))
    cc = str(info["compute_capability"]).replace(".", "")
    return root / "tensorrt" / f"timing-trt{info['tensorrt_version']}-sm{cc}.cache"


# --------------------------------------------------------------------------- builder


def network_flags(trt) -> int:
    """Creation flags for a strongly typed network: ``1 << STRONGLY_TYPED`` where the flag exists
    (TensorRT 10.x and the 11.4 bindings both bind ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``;
    on 11.x strong typing is the only mode), else 0."""
    flag = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def build_engine(onnx_path: str | Path, engine_path: str | Path, precision: str,
                 profiles: list[dict[str, dict[str, list[int]]]], timing_cache: str | Path | None = None,
                 workspace_gib: float = 8.0, log: Callable[[str], None] = print) -> dict:
    """Build one serialized engine from an ONNX graph, as a strongly typed network.

    unverified: no TensorRT/GPU was available to this session; never run.

    Every tensor's type comes from the graph (TensorRT 11 removed the weak-typing builder flags and
    per-layer precision and output-type settings): an fp16 / bf16 engine is built from the
    mixed-precision graph of an fp16 / bf16 bundle (export/precision.py), whose fp32 islands
    (LayerNorm, softmax, GELU, reductions) are already in the graph. TF32 is cleared, so float32
    tensors (fp32 engines, and the islands) compute in fp32.

    Args:
        onnx_path: the graph (external weights beside it are found by the parser).
        engine_path: where to write the serialized engine.
        precision: ``fp32``, ``fp16`` or ``bf16``: the graph's precision (checked by the caller).
        profiles: one or more ``{input: {"min", "opt", "max"}}`` (:func:`trt_profiles.profile_shapes`).
        timing_cache: file read before and written after the build (created when missing).

    Returns:
        build facts for the sidecar: ``layers``, ``seconds``, ``sha256``, ``strongly_typed``.

    Raises:
        BackendUnavailableError: the graph does not parse or the build fails.
        TensorRTCallError: TensorRT refused the timing cache.
    """
    trt = import_tensorrt()
    if precision not in tp.PRECISIONS:
        raise ValueError(f"precision must be one of {tp.PRECISIONS}, got {precision!r}")
    t0 = time.time()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendUnavailableError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    # float32 tensors compute in fp32: fp32 engines are the fidelity reference, and the islands of
    # reduced-precision graphs exist for accuracy.
    config.clear_flag(trt.BuilderFlag.TF32)
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, s in shapes.items():
            profile.set_shape(name, s["min"], s["opt"], s["max"])
        config.add_optimization_profile(profile)
    cache = None
    if timing_cache is not None:
        timing_cache = Path(timing_cache)
        blob = timing_cache.read_bytes() if timing_cache.is_file() else b""
        cache = config.create_timing_cache(blob)
        if not config.set_timing_cache(cache, ignore_mismatch=False):
            raise TensorRTCallError(f"TensorRT refused the timing cache {timing_cache} (another TensorRT version "
                                    "or GPU?); delete it or pass --timing-cache with a new path")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BackendUnavailableError(f"TensorRT failed to build an engine from {onnx_path} (see its log above)")
    engine_path = Path(engine_path)
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    data = bytes(plan)
    engine_path.write_bytes(data)
    if cache is not None:
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = timing_cache.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
        tmp.replace(timing_cache)
    secs = time.time() - t0
    log(f"built {engine_path.name} ({precision} graph, strongly typed, {network.num_layers} layers) in {secs:.1f}s")
    return {"layers": int(network.num_layers), "seconds": round(secs, 1), "strongly_typed": True,
            "sha256": hashlib.sha256(data).hexdigest()}


def build_engines(bundle_dir: str | Path, precision: str | None = None, max_batch: int = 16,
                  max_outs_per_ref: int = 16, graphs: list[str] | None = None,
                  timing_cache: str | Path | None = None, workspace_gib: float = 8.0,
                  log: Callable[[str], None] = print) -> Path:
    """Build the engine set ``<bundle>/tensorrt-<precision>/`` for every graph of a bundle.

    Strongly typed: the engines' precision is the bundle's (``manifest["precision"]["mode"]``, set
    by ``masc-export --precision``); ``precision``, when given, must equal it.

    unverified: no TensorRT/GPU was available to this session; never run.

    Raises:
        BackendUnavailableError: TensorRT or a GPU is missing, bf16 on a GPU before sm80, or a
            build fails.
        BundleError: the bundle is missing or modified, or holds graphs of another precision.
    """
    from ...errors import BundleError
    from ..manifest import read_manifest, sha256_file, verify_files

    import_tensorrt()  # fail before any work
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    verify_files(bundle_dir, manifest)
    graph_precision = str(manifest.get("precision", {}).get("mode", "fp32"))
    if graph_precision not in tp.PRECISIONS:
        raise BundleError(f"bundle {bundle_dir} holds {graph_precision} graphs, which TensorRT engines are not built "
                          "from; export an fp32, fp16 or bf16 bundle")
    precision = precision or graph_precision
    if precision != graph_precision:
        raise BundleError(
            f"bundle {bundle_dir} holds {graph_precision} graphs; TensorRT builds strongly typed networks, so "
            f"{precision} engines need {precision} graphs: masc-export --model M --out B --precision {precision} "
            f"--backend tensorrt")
    info = current_device_info()
    major = int(str(info["compute_capability"]).split(".")[0])
    if precision == "bf16" and major < 8:
        raise BackendUnavailableError(f"bf16 needs compute capability >= 8.0; {info['gpu_name']} is "
                                      f"{info['compute_capability']}. Use --precision fp16.")
    ranges = tp.default_axis_ranges(manifest, max_batch=max_batch, max_outs_per_ref=max_outs_per_ref)
    out = bundle_dir / tp.engine_dir_name(precision)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(timing_cache) if timing_cache else default_timing_cache(info)
    engines = {}
    for graph in graphs or list(manifest["graphs"]):
        entry = manifest["graphs"][graph]
        shapes = tp.profile_shapes(entry, ranges)
        facts = build_engine(bundle_dir / entry["file"], out / f"{graph}.engine", precision, [shapes],
                             timing_cache=cache, workspace_gib=workspace_gib, log=log)
        engines[graph] = {"file": f"{graph}.engine", "onnx_sha256": sha256_file(bundle_dir / entry["file"]),
                          "profiles": [shapes], **facts}
    tp.write_sidecar(out, {
        **info, "precision": precision, "engines": engines, "timing_cache": str(cache),
        "network": "strongly typed (precision from the ONNX graphs)",
        "precision_policy": manifest.get("precision", {}).get("policy"),
        "axis_ranges": {k: v.to_list() for k, v in ranges.items()},
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    log(f"TensorRT {precision} engines written: {out}")
    return out


# --------------------------------------------------------------------------- runner


class TrtRunner:
    """Runs one engine: the :class:`~.base.Runner` protocol, plus :meth:`run_device` for
    device-resident inputs and outputs (patch tokens stay on the GPU between the vision, pooling
    and CP engines; cached reference tokens can be passed as device arrays).

    Calls larger than the profile's batch are split into runs that fit; a patch count outside the
    profile is refused before inference (:class:`ProfileError` with the allowed range).

    unverified: no TensorRT/GPU was available to this session; never run.
    """

    backend = "tensorrt"

    def __init__(self, engine_path: str | Path, name: str, graph_entry: dict, profile: dict, device: int = 0):
        trt = import_tensorrt()
        self._trt = trt
        self.name = name
        self.graph_entry = graph_entry
        self.profile = profile
        # Device memory through the runtime's token device (engine/device.py); the engine runs
        # on its own non-blocking stream.
        self._dev = CupyDevice(device)
        self._stream = self._dev.new_stream()
        logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(logger)
        self.engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise EngineCompatibilityError(f"TensorRT {trt.__version__} could not deserialize {engine_path} "
                                           "(built with another TensorRT version or for another GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self.output_names = [n for n in names if not is_input[n]]
        self._dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self._lock = threading.Lock()  # one execution context: calls are serialised

    def axis_limit(self, axis: str) -> int | None:
        """The engine profile's largest size for a named axis (``outs_per_ref`` for the CP head:
        runtime/cp_device.py ``GraphCP`` packs within it); None when the graph has no such axis."""
        return tp.axis_max(self.graph_entry, self.profile, axis)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.run_device(feeds)
        return {k: self._dev.to_host(v) for k, v in out.items()}

    def run_device(self, feeds: dict, device=None) -> dict:
        """Inputs as numpy or device arrays; outputs as device arrays (CuPy or torch).

        ``device``: the runtime's token device; it must be CUDA memory (engine/device.py
        ``CupyDevice``)."""
        if device is not None and device.ort_device_type != "cuda":
            raise BackendUnavailableError(f"TensorRT engines cannot use {device.name} memory")
        shapes = {k: tuple(v.shape) for k, v in feeds.items()}
        runs = tp.plan_batches(self.name, self.graph_entry, shapes, self.profile)  # refuses before inference
        if not runs:
            raise ValueError(f"graph {self.name!r}: empty batch")
        parts = [self._run_once({k: feeds[k][s] for k in self.input_names}) for s in runs]
        if len(parts) == 1:
            return parts[0]
        return {k: self._dev.concat([p[k] for p in parts]) for k in self.output_names}

    def _run_once(self, feeds: dict) -> dict:
        """One execution. Order (issue 13): input shapes set and checked, output shapes read and
        checked, outputs allocated, *then* the device synchronised (so no block CuPy's pool hands
        out is still read by another thread's kernel on another stream), then addresses bound and
        the engine run on its stream."""
        dev = self._dev
        bufs = {}
        for k in self.input_names:
            x = feeds[k]
            if dev.is_device_array(x):
                if np.dtype(x.dtype) != self._dtypes[k]:  # as OrtRunner.run_device: no silent cast
                    raise TypeError(f"TensorRT engine {self.name!r}: input {k} must be {self._dtypes[k]}, got {x.dtype}")
            else:
                x = dev.from_host(np.ascontiguousarray(x, dtype=self._dtypes[k]))
            bufs[k] = dev.contiguous(x)
        with self._lock:
            ctx = self.context
            for k in self.input_names:
                shape = tuple(int(n) for n in bufs[k].shape)
                if not ctx.set_input_shape(k, shape):
                    raise TensorRTCallError(f"TensorRT engine {self.name!r}: set_input_shape({k!r}, {shape}) failed "
                                            "(shape outside the engine's optimization profile?)")
            outs = {}
            for k in self.output_names:
                shape = tuple(int(n) for n in ctx.get_tensor_shape(k))
                if any(n < 0 for n in shape):
                    raise TensorRTCallError(f"TensorRT engine {self.name!r}: output {k!r} has shape {shape} after the "
                                            "input shapes were set (-1: a data-dependent dimension), so it cannot be "
                                            "allocated; the bundle's graphs have none")
                outs[k] = dev.empty(shape, self._dtypes[k])
            # Packing, copies, host uploads and the allocations above were queued on CuPy's current
            # stream; the engine's stream does not wait for it.
            dev.synchronize()
            for k, x in [*bufs.items(), *outs.items()]:
                if not ctx.set_tensor_address(k, dev.ptr(x)):
                    raise TensorRTCallError(f"TensorRT engine {self.name!r}: set_tensor_address({k!r}) failed for "
                                            f"shape {tuple(x.shape)}")
            if not ctx.execute_async_v3(self._stream.ptr):
                raise TensorRTCallError(f"TensorRT execution of {self.name!r} failed (input shapes "
                                        f"{ {k: tuple(v.shape) for k, v in bufs.items()} })")
            self._stream.synchronize()
        return outs


def load_runner(bundle, graph: str, precision: str | None = None, provider: str = "cuda") -> TrtRunner:
    """A :class:`TrtRunner` for one graph of a bundle's engine set, after every check.

    Order: TensorRT importable (else :class:`BackendUnavailableError` naming what to install);
    provider is CUDA; an engine set exists for the precision; it was built for this TensorRT
    version, GPU and compute capability and from this bundle's ONNX graphs
    (:class:`EngineCompatibilityError` naming both sides and the rebuild command); the engine
    file's sha256.

    unverified: no TensorRT/GPU was available to this session (the checks are tested with fakes).
    """
    from ...errors import BundleError
    from ..manifest import sha256_file

    import_tensorrt()
    if provider not in ("cuda", "cuda:0", "CUDAExecutionProvider"):
        raise BackendUnavailableError(f"the TensorRT backend runs on CUDA GPUs only; provider {provider!r} "
                                      "is not possible (use provider='cuda', or backend='onnxruntime')")
    if precision is None:
        have = tp.available_precisions(bundle.path)
        if len(have) != 1:
            raise BundleError(f"bundle {bundle.path}: choose the TensorRT precision explicitly "
                              f"(engine sets present: {have or 'none'}; build one with "
                              f"{tp.rebuild_command(bundle.path, 'fp16')})")
        precision = have[0]
    sidecar = tp.read_sidecar(bundle.path, precision)
    tp.check_compatible(sidecar, current_device_info(), bundle.path, precision)
    tp.check_onnx_unchanged(sidecar, bundle.manifest, bundle.path, precision)
    entry = sidecar["engines"].get(graph)
    if entry is None:
        raise BundleError(f"bundle {bundle.path}: the TensorRT {precision} engine set has no {graph!r} engine; "
                          f"rebuild: {tp.rebuild_command(bundle.path, precision)}")
    path = bundle.path / tp.engine_dir_name(precision) / entry["file"]
    if not path.is_file() or sha256_file(path) != entry["sha256"]:
        raise BundleError(f"{path} is missing or modified; rebuild: {tp.rebuild_command(bundle.path, precision)}")
    runner = TrtRunner(path, graph, bundle.graph(graph), entry["profiles"][0])
    runner.precision = precision  # the engine set actually loaded (masc-run records it)
    return runner
