"""TensorRT backend: engines built from the bundle's ONNX graphs, and a runner for them.

UNVERIFIED ON A GPU: this module has never run with TensorRT or on a GPU (docs/verification.md). Every
function below that touches ``tensorrt``, CUDA, CuPy or a GPU is marked "unverified" and has never
been run; it follows the TensorRT 11 Python API as documented (``build_serialized_network``,
``execute_async_v3``, named I/O tensors, user-managed context memory), and every TensorRT call is
checked by class, arity and argument kind against the real TensorRT 11.4 bindings' surface
(tests/test_trt_conformance.py against tests/data/tensorrt_11_surface.json, extracted from the
``tensorrt-cu13-bindings`` wheel by scripts/extract_trt_surface.py). It runs on CPU against
tests/doubles/fake_tensorrt.py, which is asynchronous, fails and refuses where the real one does. The
shape planning, memory plan, engine-compatibility checks and precision policy it relies on are
pure functions in :mod:`.trt_profiles`, tested on CPU.

This module is the runner (:class:`TrtRunner`, :func:`load_runner`, :func:`check_bundle_fits`);
the builder (:func:`build_engines`, :func:`build_engine`, :class:`EngineBuildError`) is
:mod:`.trt_build`, the lazy import, the process's logger, :class:`TensorRTCallError` and the GPU
facts (:func:`import_tensorrt`, :func:`trt_logger`, :func:`current_device_info`,
:func:`device_memory_info`) are :mod:`.trt_device`; their public names are importable from here.

Failures TensorRT reports by a return value (``None``, ``False``, ``-1``) are checked at every
call and raised as :class:`TensorRTCallError` (:class:`EngineBuildError` while building,
:class:`~masc_engine.errors.DeviceMemoryError` for memory) naming the engine, the profile and the
shapes. One ``trt.Logger`` serves the whole process (:func:`trt_logger`): TensorRT expects the
logger to outlive every builder, runtime and engine made through it.

Device memory: execution contexts are created with
``ExecutionContextAllocationStrategy.USER_MANAGED`` and given, per call, memory sized by
``update_device_memory_size_for_shapes()`` for the shapes actually run (a static context would
hold its profile maximum for its whole life: 1 GiB of cosines for the CP engine at 16 refs x 16
outputs x 1024 x 1024 whatever the call); engines are built with
``PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10`` where the bindings have it, without which a
user-managed context is still sized for its profile maximum. Profile maxima are chosen at build from a device-memory
budget (``--gpu-memory-budget`` or the free memory then, :func:`.trt_profiles.choose_ranges`); the
plan and TensorRT's own figure per profile go into ``engines.json``; a load whose plan exceeds the
free memory is refused before anything is allocated, and the first load of an engine set when the
whole set (text engine included) would not fit (:func:`check_bundle_fits`). :meth:`TrtRunner.close` frees the context,
engine, scratch and staging buffers.

Copies: host inputs are staged in pinned host memory and copied on the engine's stream, host
outputs copied back on it, so copies queue behind and ahead of the engine without host waits; an
event recorded after the copies back is what the runner waits on. :meth:`TrtRunner.run_pipelined`
keeps two batches in flight (an execution context, stream, context memory and pinned buffers each)
while the next batch's host work runs; :func:`~masc_engine.engine.device.overlapped` is the
thread-based loop the scorer uses.

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

import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

import numpy as np

from ...errors import BackendUnavailableError, DeviceMemoryError, EngineCompatibilityError
from ..device import ArrayDevice, CupyDevice, DeviceArray, Event, PinnedStaging, Stream
from . import trt_graphs as tg
from . import trt_profiles as tp

# trt_build's and trt_device's public names, re-exported (importable from the backend's module).
from .trt_build import EngineBuildError as EngineBuildError
from .trt_build import build_engine as build_engine
from .trt_build import build_engines as build_engines
from .trt_build import enable_activation_resize as enable_activation_resize
from .trt_build import graph_weight_bytes as graph_weight_bytes
from .trt_build import network_flags as network_flags
from .trt_device import INSTALL_HINT as INSTALL_HINT
from .trt_device import TensorRTCallError as TensorRTCallError
from .trt_device import current_device_info as current_device_info
from .trt_device import default_timing_cache as default_timing_cache
from .trt_device import device_memory_info as device_memory_info
from .trt_device import import_tensorrt as import_tensorrt
from .trt_device import tensorrt_available as tensorrt_available
from .trt_device import trt_logger as trt_logger

if TYPE_CHECKING:  # the annotations name TensorRT's classes; the module itself imports it lazily
    import tensorrt as trt

    from .base import BundleView


# --------------------------------------------------------------------------- runner


#: Arrays by tensor name (device arrays, or host numpy arrays where the docstring says so).
Arrays = dict[str, DeviceArray]
HostArrays = dict[str, np.ndarray]


class _Slot:
    """One execution in flight: its execution context, stream, context memory and pinned buffers."""

    def __init__(self, context: Any, stream: Stream, staging: PinnedStaging) -> None:
        self.context, self.stream, self.staging = context, stream, staging
        self.scratch: DeviceArray | None = None
        self.graphs = tg.GraphCache()  # CUDA graphs of this slot's context, by input-shape set


class _InFlight:
    """A queued execution: its slot, device outputs, pinned host outputs (or None), the event
    recorded after its last copy, its inputs (kept alive until it is done), and whether its device
    outputs are a CUDA graph's buffers (which its next replay overwrites: handed over as copies)."""

    def __init__(
        self, slot: _Slot, outs: Arrays, pinned: HostArrays | None, event: Event, inputs: object, owned: bool
    ) -> None:
        self.slot, self.outs, self.pinned, self.event, self.inputs = slot, outs, pinned, event, inputs
        self.graph_owned = owned


class TrtRunner:
    """Runs one engine: the :class:`~.base.Runner` protocol, plus :meth:`run_device` for
    device-resident inputs and outputs (patch tokens stay on the GPU between the vision, pooling
    and CP engines; cached reference tokens can be passed as device arrays).

    Calls larger than the profile's batch are split into runs that fit; a patch count outside the
    profile is refused before inference (:class:`ProfileError` with the allowed range). The
    context's memory is user-managed: sized per call for the shapes run, grown when a call needs
    more, freed by :meth:`close`.

    CUDA graphs (``cuda_graphs``, the backend option of that name): a call (host, device or mixed
    inputs) is captured into a CUDA graph after its shape set's first enqueue and replayed when
    the shapes recur (:mod:`.trt_graphs`; ``graph_captures`` and ``graph_replays`` count them).

    unverified on a GPU: never run with TensorRT.
    """

    backend = "tensorrt"

    def __init__(
        self,
        engine_path: str | Path,
        name: str,
        graph_entry: dict[str, Any],
        profile: tp.Profile,
        device: int = 0,
        need_bytes: int | None = None,
        bundle_dir: str | Path | None = None,
        precision: str | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        trt = import_tensorrt()
        self._trt = trt
        self.name = name
        self.graph_entry = graph_entry
        self.profile = profile
        self.precision = precision
        # Device memory through the runtime's token device (engine/device.py); the engine runs
        # on its own non-blocking stream, where its copies go too.
        self._dev = CupyDevice(device)
        if need_bytes is not None:  # refuse before the engine's weights are allocated
            tp.check_fits(
                name,
                precision or "?",
                need_bytes,
                self._dev.mem_get_info()[0],
                getattr(self._dev, "name", "the GPU"),
                bundle_dir or Path(engine_path).parent.parent,
            )
        self._stream = self._dev.new_stream()
        self._runtime = trt.Runtime(trt_logger(trt))
        self.engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise EngineCompatibilityError(
                f"TensorRT {trt.__version__} could not deserialize {engine_path} "
                "(built with another TensorRT version or for another GPU?)"
            )
        self.context = self.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if self.context is None:
            raise DeviceMemoryError(
                f"TensorRT could not create an execution context for engine {name!r} "
                f"(optimization profile 0, max shapes { {k: v['max'] for k, v in profile.items()} }, "
                "user-managed memory)"
            )
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = [n for n in names if is_input[n]]
        self.output_names = [n for n in names if not is_input[n]]
        self._dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self._lock = threading.Lock()  # calls are serialised; run_pipelined keeps two in flight within one
        self._slots = [_Slot(self.context, self._stream, PinnedStaging(self._dev))]
        self.bundle_key: tuple[str, str] | None = None  # (bundle path, precision), set by load_runner
        self.cuda_graphs = cuda_graphs  # turned off after a failed capture (logged once)
        self.graph_captures = self.graph_replays = 0

    def axis_limit(self, axis: str) -> int | None:
        """The engine profile's largest size for a named axis (``outs_per_ref`` for the CP head:
        runtime/cp_device.py ``GraphCP`` packs within it); None when the graph has no such axis."""
        return tp.axis_max(self.graph_entry, self.profile, axis)

    @property
    def device_memory_bytes(self) -> int:
        """Bytes of context memory held now, all execution slots together (each grown to the
        largest call it ran; 0 after close)."""
        return sum(0 if s.scratch is None else int(s.scratch.nbytes) for s in self._slots)

    def close(self) -> None:
        """Free the execution contexts, the engine, the context memory and the pinned staging
        buffers now (TensorRT objects in dependency order: contexts, engine, runtime). Further
        calls raise :class:`TensorRTCallError`."""
        with self._lock:
            for slot in self._slots:
                if slot.stream is not None:
                    slot.stream.synchronize()
                slot.context = slot.scratch = None
                slot.graphs.clear()
                slot.staging.clear()
            self.context = None
            self.engine = None
            self._runtime = None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Host inputs in, host outputs out: copies on the engine's stream through pinned buffers."""
        return self._split(feeds, to_host=True)

    def run_device(self, feeds: Arrays, device: ArrayDevice | None = None) -> Arrays:
        """Inputs as numpy or device arrays; outputs as device arrays (CuPy).

        ``device``: the runtime's token device; it must be CUDA memory (engine/device.py
        ``CupyDevice``)."""
        if device is not None and device.ort_device_type != "cuda":
            raise BackendUnavailableError(f"TensorRT engines cannot use {device.name} memory")
        return self._split(feeds, to_host=False)

    def run_pipelined(
        self, batches: Iterable[Any], prepare: Callable[[Any], Mapping[str, Any]] | None = None, in_flight: int = 2
    ) -> list[Arrays]:
        """``[run(prepare(b)) for b in batches]`` with up to ``in_flight`` batches on the device at
        once, each on its own execution context, stream, context memory and pinned buffers.

        Order per batch n: ``prepare`` (the host work: decode, preprocess, stacking) runs while
        batches n-1 and n-2 are on the device; then batch n-``in_flight`` is collected (its event
        waited: its copies back, and so its engine, done) and its slot takes batch n: inputs staged
        into that slot's pinned buffers, copies, engine and copies back queued on its stream, an
        event recorded after them. Outputs are the serial path's, bit for bit (same engine, same
        shapes, one context per batch). A batch larger than the profile is refused
        (:class:`ProfileError` from the plan) before anything is queued: split it first.

        Returns:
            host outputs per batch, in order.
        """
        if self.context is None:
            raise TensorRTCallError(f"TensorRT engine {self.name!r} was closed")
        results: list[Arrays] = []
        pending: list[_InFlight] = []
        with self._lock:
            for i, item in enumerate(batches):
                feeds = prepare(item) if prepare is not None else item
                runs = tp.plan_batches(
                    self.name, self.graph_entry, {k: tuple(v.shape) for k, v in feeds.items()}, self.profile
                )
                if len(runs) != 1:
                    raise ValueError(
                        f"graph {self.name!r}: batch {i} needs {len(runs)} runs of the profile; "
                        "run_pipelined takes batches that fit one run"
                    )
                if len(pending) >= in_flight:
                    results.append(self._finish(pending.pop(0)))
                slot = self._slot(i % in_flight)
                pending.append(self._submit(slot, {k: feeds[k] for k in self.input_names}, True))
            while pending:
                results.append(self._finish(pending.pop(0)))
        return results

    def _slot(self, i: int) -> _Slot:
        """Execution slot ``i``, made on first use: a user-managed context of its own (TensorRT runs
        one execution per context at a time) and a stream of its own."""
        while len(self._slots) <= i:
            ctx = self.engine.create_execution_context(self._trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            if ctx is None:
                raise DeviceMemoryError(
                    f"TensorRT could not create execution context {len(self._slots)} for engine "
                    f"{self.name!r} (a second batch in flight)"
                )
            self._slots.append(_Slot(ctx, self._dev.new_stream(), PinnedStaging(self._dev)))
        return self._slots[i]

    def _split(self, feeds: Mapping[str, DeviceArray], to_host: bool) -> Arrays:
        shapes = {k: tuple(v.shape) for k, v in feeds.items()}
        runs = tp.plan_batches(self.name, self.graph_entry, shapes, self.profile)  # refuses before inference
        if not runs:
            raise ValueError(f"graph {self.name!r}: empty batch")
        parts = [self._run_once({k: feeds[k][s] for k in self.input_names}, to_host) for s in runs]
        if len(parts) == 1:
            return parts[0]
        join = (lambda xs: np.concatenate(xs, axis=0)) if to_host else self._dev.concat
        return {k: join([p[k] for p in parts]) for k in self.output_names}

    def _inputs(self, slot: _Slot, feeds: Mapping[str, DeviceArray]) -> tuple[HostArrays, Arrays]:
        """Host inputs staged in the slot's pinned memory; device inputs as given (dtype checked,
        contiguous). Raises TypeError for a device input of another dtype (no silent cast)."""
        dev = self._dev
        host: HostArrays = {}
        moved: Arrays = {}
        for k in self.input_names:
            x = feeds[k]
            if dev.is_device_array(x):
                if np.dtype(x.dtype) != self._dtypes[k]:  # as OrtRunner.run_device: no silent cast
                    raise TypeError(
                        f"TensorRT engine {self.name!r}: input {k} must be {self._dtypes[k]}, got {x.dtype}"
                    )
                moved[k] = dev.contiguous(x)
            else:
                host[k] = slot.staging.stage(k, np.ascontiguousarray(x, dtype=self._dtypes[k]))
        return host, moved

    def _run_once(self, feeds: Mapping[str, DeviceArray], to_host: bool) -> Arrays:
        """One execution on slot 0, waited for before it returns (:meth:`_submit`, :meth:`_finish`)."""
        if self.context is None:
            raise TensorRTCallError(f"TensorRT engine {self.name!r} was closed")
        with self._lock:
            return self._finish(self._submit(self._slots[0], feeds, to_host))

    def _submit(self, slot: _Slot, feeds: Mapping[str, DeviceArray], to_host: bool) -> _InFlight:
        """Queue one execution on a slot. Order: inputs staged; input shapes set and checked;
        output shapes read and checked; context memory sized for these shapes; outputs allocated;
        *then* CuPy's current stream synchronised (packing done, and no block CuPy's pool hands out
        still read elsewhere); host-to-device copies, the engine and device-to-host copies queued
        on the slot's stream, and an event recorded after them. Nothing is waited for.

        With CUDA graphs on: a shape set seen before on this slot replays its graph (:meth:`_replay`);
        a new one is enqueued as above (the warm-up) into buffers of its own, device inputs copied
        into them on the slot's stream as host ones are, and then captured."""
        dev, stream, ctx = self._dev, slot.stream, slot.context
        key = None
        if self.cuda_graphs:
            key = tg.shape_key(self.input_names, feeds)
            graph = slot.graphs.get(key)
            if graph is not None:
                return self._replay(slot, graph, feeds, to_host)
        host, moved = self._inputs(slot, feeds)
        bufs = tg.input_buffers(dev, self.input_names, host, moved, self._dtypes, own=key is not None)
        self._set_shapes(ctx, bufs)
        outs = {k: dev.empty(s, self._dtypes[k]) for k, s in self._output_shapes(ctx).items()}
        self._context_memory(slot, ctx, bufs)
        dev.synchronize()
        tg.copy_inputs(dev, stream, bufs, host, moved)
        self._execute(ctx, stream, bufs, outs)
        owned = key is not None and self._capture(slot, key, bufs, outs)
        return self._copies_back(slot, outs, to_host, (bufs, host, moved), owned)

    def _copies_back(self, slot: _Slot, outs: Arrays, to_host: bool, inputs: object, owned: bool) -> _InFlight:
        """Queue the device-to-host copies (when ``to_host``) and record the event after them."""
        dev, pinned = self._dev, None
        if to_host:
            pinned = {k: slot.staging.buffer(k, v.shape, v.dtype) for k, v in outs.items()}
            for k in outs:
                dev.copy_to_host(outs[k], pinned[k], slot.stream)
        return _InFlight(slot, outs, pinned, dev.record_event(slot.stream), inputs, owned)

    def _capture(self, slot: _Slot, key: tg.ShapeKey, bufs: Arrays, outs: Arrays) -> bool:
        """Capture the execution just enqueued (its warm-up: same shapes, same bindings) into a CUDA
        graph kept with its buffers and context memory. A failure turns graphs off, logged once.
        unverified on a GPU."""
        ctx, stream = slot.context, slot.stream
        try:
            graph = tg.capture(stream, lambda: self._enqueue(ctx, stream))
        except Exception as e:  # noqa: BLE001 - CuPy's CUDARuntimeError, or the enqueue's failure
            self.cuda_graphs = False
            tg.note_capture_failure(self.name, key, e)
            return False
        slot.graphs.add(key, tg.CapturedGraph(graph, bufs, outs, slot.scratch))
        self.graph_captures += 1
        return True

    def _replay(self, slot: _Slot, g: tg.CapturedGraph, feeds: Mapping[str, Any], to_host: bool) -> _InFlight:
        """Copy the inputs into the graph's own input buffers on the slot's stream (host ones through
        the pinned buffers, device ones device to device), launch the graph on that stream and
        queue the copies back from its output buffers. unverified on a GPU."""
        host, moved = self._inputs(slot, feeds)
        self._dev.synchronize()
        tg.copy_inputs(self._dev, slot.stream, g.inputs, host, moved)
        g.graph.launch(slot.stream)
        self.graph_replays += 1
        return self._copies_back(slot, g.outputs, to_host, (g, host, moved), True)

    def _execute(self, ctx: "trt.IExecutionContext", stream: Stream, bufs: Arrays, outs: Arrays) -> None:
        """Bind every input and output by address and queue the engine on ``stream``."""
        for k, x in [*bufs.items(), *outs.items()]:
            if not ctx.set_tensor_address(k, self._dev.ptr(x)):
                raise TensorRTCallError(
                    f"TensorRT engine {self.name!r}: set_tensor_address({k!r}) failed for shape {tuple(x.shape)}"
                )
        if not self._enqueue(ctx, stream):
            raise TensorRTCallError(
                f"TensorRT execution of {self.name!r} failed (input shapes "
                f"{ {k: tuple(v.shape) for k, v in bufs.items()} })"
            )

    def _enqueue(self, ctx: "trt.IExecutionContext", stream: Stream) -> bool:
        """``execute_async_v3`` on ``stream``'s handle (outside or inside a capture)."""
        return bool(ctx.execute_async_v3(stream.ptr))

    def _finish(self, job: _InFlight) -> Arrays:
        """Wait for a queued execution's event, then hand its outputs over (host copies out of the
        pinned buffers, which the slot's next call refills; or the device outputs)."""
        job.event.synchronize()  # the engine and the copies back are done
        job.slot.staging.next_call()
        if job.pinned is not None:
            return {k: np.array(v) for k, v in job.pinned.items()}
        if job.graph_owned:  # the graph's buffers: its next replay overwrites them
            return {k: self._dev.copy(v) for k, v in job.outs.items()}
        return job.outs

    def _set_shapes(self, ctx: "trt.IExecutionContext", bufs: Arrays) -> None:
        for k in self.input_names:
            shape = tuple(int(n) for n in bufs[k].shape)
            if not ctx.set_input_shape(k, shape):
                raise TensorRTCallError(
                    f"TensorRT engine {self.name!r}: set_input_shape({k!r}, {shape}) failed "
                    "(shape outside the engine's optimization profile?)"
                )

    def _output_shapes(self, ctx: "trt.IExecutionContext") -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for k in self.output_names:
            shape = tuple(int(n) for n in ctx.get_tensor_shape(k))
            if any(n < 0 for n in shape):
                raise TensorRTCallError(
                    f"TensorRT engine {self.name!r}: output {k!r} has shape {shape} after the "
                    "input shapes were set (-1: a data-dependent dimension), so it cannot be "
                    "allocated; the bundle's graphs have none"
                )
            shapes[k] = shape
        return shapes

    def _context_memory(self, slot: _Slot, ctx: "trt.IExecutionContext", bufs: Arrays) -> None:
        """Give the context memory for the shapes just set: ``update_device_memory_size_for_shapes``
        says how much; the buffer grows when a call needs more (never shrinks: a smaller call
        reuses it). unverified on a GPU."""
        size = int(ctx.update_device_memory_size_for_shapes())
        shapes = {k: tuple(v.shape) for k, v in bufs.items()}
        if size <= 0:  # the binding reports failure with 0 (and an engine always needs some activation memory)
            raise TensorRTCallError(
                f"TensorRT engine {self.name!r}: update_device_memory_size_for_shapes() returned "
                f"{size} (failure) for input shapes {shapes}"
            )
        if slot.scratch is None or slot.scratch.nbytes < size:
            slot.scratch = None  # release the smaller buffer before asking for the larger one
            try:
                slot.scratch = self._dev.empty((size,), np.uint8)
            except Exception as e:  # noqa: BLE001 - CuPy raises OutOfMemoryError
                free = self._dev.mem_get_info()[0]
                raise DeviceMemoryError(
                    f"TensorRT engine {self.name!r} needs {size / tp.GIB:.2f} GiB of context "
                    f"memory for input shapes {shapes}; {free / tp.GIB:.2f} GiB are free ({e})"
                ) from e
        ctx.set_device_memory(self._dev.ptr(slot.scratch), int(slot.scratch.nbytes))


def check_available(provider: str = "cuda", precision: str | None = None) -> None:
    """The backend registry's availability check: TensorRT importable and a CUDA provider (the
    engine set for ``precision`` is checked when a runner is loaded).

    Raises:
        BackendUnavailableError: TensorRT is missing (naming what to install), or a non-CUDA provider.
    """
    import_tensorrt()
    _check_provider(provider)


def _check_provider(provider: str) -> None:
    if provider not in ("cuda", "cuda:0", "CUDAExecutionProvider"):
        raise BackendUnavailableError(
            f"the TensorRT backend runs on CUDA GPUs only; provider {provider!r} "
            "is not possible (use provider='cuda', or backend='onnxruntime')"
        )


def load_runner(
    bundle: BundleView,
    graph: str,
    *,
    provider: str = "cuda",
    precision: str | None = None,
    intra_op_threads: int | None = None,
    variant: str = "portable",
    options: Mapping[str, Any] | None = None,
) -> TrtRunner:
    """A :class:`TrtRunner` for one graph of a bundle's engine set, after every check.

    Order: TensorRT importable (else :class:`BackendUnavailableError` naming what to install);
    provider is CUDA; an engine set exists for the precision; it was built for this TensorRT
    version, GPU and compute capability and from this bundle's ONNX graphs
    (:class:`EngineCompatibilityError` naming both sides and the rebuild command); the engine
    file's sha256; the engine's memory plan against the device's free memory
    (:class:`DeviceMemoryError`, before the engine is deserialized).

    unverified on a GPU: never run with TensorRT (the checks are tested with fakes).
    """
    from ...errors import BundleError
    from ..manifest import sha256_file

    check_available(provider)
    if precision is None:
        have = tp.available_precisions(bundle.path)
        if len(have) != 1:
            raise BundleError(
                f"bundle {bundle.path}: choose the TensorRT precision explicitly "
                f"(engine sets present: {have or 'none'}; build one with "
                f"{tp.rebuild_command(bundle.path, 'fp16')})"
            )
        precision = have[0]
    sidecar = tp.read_sidecar(bundle.path, precision)
    tp.check_compatible(sidecar, current_device_info(), bundle.path, precision)
    tp.check_onnx_unchanged(sidecar, bundle.manifest, bundle.path, precision)
    entry = sidecar["engines"].get(graph)
    if entry is None:
        raise BundleError(
            f"bundle {bundle.path}: the TensorRT {precision} engine set has no {graph!r} engine; "
            f"rebuild: {tp.rebuild_command(bundle.path, precision)}"
        )
    path = bundle.path / tp.engine_dir_name(precision) / entry["file"]
    if not path.is_file() or sha256_file(path) != entry["sha256"]:
        raise BundleError(f"{path} is missing or modified; rebuild: {tp.rebuild_command(bundle.path, precision)}")
    need = tp.engine_need_bytes(entry, path.stat().st_size)
    dev = CupyDevice(0)
    free = dev.mem_get_info()[0]
    name = getattr(dev, "name", "the GPU")
    tp.check_fits(graph, precision, need, free, name, bundle.path)
    key = (str(Path(bundle.path).resolve()), precision)
    check_bundle_fits(bundle.path, precision, sidecar, [r for r in list(_LIVE) if r.bundle_key == key], free, name)
    runner = TrtRunner(
        path,
        graph,
        bundle.graph(graph),
        entry["profiles"][0],
        need_bytes=need,
        bundle_dir=bundle.path,
        precision=precision,
        cuda_graphs=(options or {}).get("cuda_graphs", "off") == "on",  # off until a GPU has run it
    )
    runner.bundle_key = key
    _LIVE.add(runner)
    return runner


#: Every TrtRunner load_runner made and not yet collected (the bundle-wide memory check counts them).
_LIVE: "weakref.WeakSet[TrtRunner]" = weakref.WeakSet()


def check_bundle_fits(
    bundle_dir: Path, precision: str, sidecar: dict[str, Any], live: list[TrtRunner], free_bytes: int, device_name: str
) -> None:
    """Refuse a load when the engines of the set still to come would not fit the free memory.

    What is still to come: every engine of ``engines.json`` that no open runner of this set holds
    (the text engine included, though the scorer loads it on first use), at its plan (engine file
    plus TensorRT's activation figure at the profile maxima plus bindings), and for each open
    runner the context memory it may still grow by. Counted at every load, so the first load of a
    set refuses when the whole set could not run together.

    Raises:
        DeviceMemoryError: one line naming the set, each engine's figure, the free memory and the
            rebuild command.
    """
    folder = Path(bundle_dir) / tp.engine_dir_name(precision)
    sizes = {
        g: (folder / e["file"]).stat().st_size if (folder / e["file"]).is_file() else 0  # checked at its own load
        for g, e in sidecar["engines"].items()
    }
    need = {g: tp.engine_need_bytes(e, sizes[g]) for g, e in sidecar["engines"].items()}
    open_ = [r for r in live if r.context is not None and r.name in need]
    held = {r.name for r in open_}
    parts = {g: n for g, n in need.items() if g not in held}
    for r in open_:
        parts[f"{r.name} (growth)"] = parts.get(f"{r.name} (growth)", 0) + max(
            0, need[r.name] - sizes[r.name] - r.device_memory_bytes
        )
    total = sum(parts.values())
    if total > free_bytes:
        each = ", ".join(f"{g} {n / tp.GIB:.2f}" for g, n in parts.items())
        raise DeviceMemoryError(
            f"TensorRT {precision} engines of {bundle_dir} need up to {total / tp.GIB:.2f} GiB of device memory "
            f"together at their profile maxima ({each} GiB; engines.json memory plan, text engine included), "
            f"{device_name} has {free_bytes / tp.GIB:.2f} GiB free; rebuild for this GPU's memory: "
            f"{tp.rebuild_command(bundle_dir, precision)} --gpu-memory-budget {max(0.1, free_bytes / tp.GIB * 0.8):.1f}"
        )
