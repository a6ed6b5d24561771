"""CUDA graphs for the TensorRT runner: one graph per execution slot and input-shape set, captured
after that shape set's first (warm-up) enqueue and replayed when the shapes recur.

Rules followed (TensorRT's developer guide, "CUDA Graphs"; CUDA's stream-capture constraints,
docs.nvidia.com/dl-cuda-graph/cuda-graph-basics/constraints.html):

- ``execute_async_v3`` runs once, outside capture, after every input-shape change: its first run
  for new shapes may do shape-dependent setup (allocation, synchronisation) that capture refuses.
  The runner's first call with a shape set is that warm-up; the capture follows it in the same call.
- Nothing synchronises and nothing is allocated between ``begin_capture`` and ``end_capture``,
  and no binding changes: the context's addresses were set for the warm-up and stay.
- A graph replays the device addresses it captured: its input buffers, output buffers and context
  memory are kept with it, inputs are *copied into* its buffers before the launch (never re-bound),
  and its outputs are read from its own buffers. Host inputs go through pinned memory
  (``copy_to_device``), device-resident ones device to device (``ArrayDevice.copy_on_stream``,
  ``cudaMemcpyAsync``), both queued on the stream the graph is launched on, so they are ordered
  before it without a host wait; the caller's device arrays are never a graph's buffers (a
  replay would read the first call's arrays, which the caller may have changed or freed).
- New shapes need a new capture; the context memory growing (a new address) drops the slot's graphs.

CuPy's API (``cupy.cuda.Stream.begin_capture()``, ``.end_capture()`` returning a
``cupy.cuda.Graph``, ``Graph.launch(stream)``). A failed capture (CuPy raises
``CUDARuntimeError``: ``cudaErrorStreamCaptureUnsupported`` / ``...Invalidated``) turns graphs off
for the runner, logged once; executions go on with plain enqueues.

unverified on a GPU: checked on tests/doubles/fake_tensorrt.py, whose capture records work
instead of running it and whose replay uses the captured addresses only.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Callable, Mapping

import numpy as np

from ..device import ArrayDevice, DeviceArray, Stream

log = logging.getLogger(__name__)

#: Graphs kept per execution slot (least recently used dropped first). The NaFlex pipeline runs a
#: few input-shape sets per engine: a full batch and the last, partial one, per patch-count bucket
#: used; 8 holds them for a run with up to four buckets. Each graph keeps its input and output
#: buffers alive: ~115 MB at so400m / 1,024 patches / batch 16 (38.5 MB of patches, 75.5 MB of
#: float32 tokens), so 8 graphs cost < 1 GB per slot of the 141 GB of an H200.
MAX_GRAPHS = 8

ShapeKey = tuple[tuple[str, tuple[int, ...]], ...]


class CapturedGraph:
    """A captured execution: the graph and the device buffers whose addresses it replays."""

    def __init__(self, graph: Any, inputs: dict[str, DeviceArray], outputs: dict[str, DeviceArray], scratch: Any):
        self.graph, self.inputs, self.outputs, self.scratch = graph, inputs, outputs, scratch


class GraphCache:
    """One execution slot's graphs by input-shape set, least recently used dropped past ``limit``.

    Args:
        limit: graphs kept, >= 1 (default :data:`MAX_GRAPHS`, read when the cache is made).
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = MAX_GRAPHS if limit is None else limit
        self._graphs: OrderedDict[ShapeKey, CapturedGraph] = OrderedDict()

    def __len__(self) -> int:
        return len(self._graphs)

    def get(self, key: ShapeKey) -> CapturedGraph | None:
        """The graph for these shapes (marked most recently used), or None."""
        g = self._graphs.get(key)
        if g is not None:
            self._graphs.move_to_end(key)
        return g

    def add(self, key: ShapeKey, graph: CapturedGraph) -> None:
        """Keep ``graph`` for ``key``, dropping the least recently used beyond the limit."""
        self._graphs[key] = graph
        self._graphs.move_to_end(key)
        while len(self._graphs) > self.limit:
            self._graphs.popitem(last=False)

    def clear(self) -> None:
        """Drop every graph (the context memory they captured is being replaced)."""
        self._graphs.clear()


def shape_key(names: list[str], bufs: Mapping[str, DeviceArray]) -> ShapeKey:
    """The input-shape set of one execution: ``((name, shape), ...)`` in the engine's input order."""
    return tuple((k, tuple(int(n) for n in bufs[k].shape)) for k in names)


def input_buffers(
    dev: ArrayDevice,
    names: list[str],
    host: Mapping[str, np.ndarray],
    moved: Mapping[str, DeviceArray],
    dtypes: Mapping[str, np.dtype],
    own: bool,
) -> dict[str, DeviceArray]:
    """The device buffers an execution binds, per input name (in ``names``' order).

    Args:
        dev: the token device (allocates the new buffers).
        names: the engine's input names; each is in ``host`` or in ``moved``.
        host: staged host inputs, each needing a device buffer of its shape and ``dtypes[name]``.
        moved: device-resident inputs (C-contiguous, of the engine's dtype).
        dtypes: the engine's dtype per input name.
        own: True for an execution that will be captured: every input gets a new buffer of its
            own (a graph replays the addresses it captured, so it must own them); False: device
            inputs are bound as given, no copy.

    Returns:
        name -> device array of the input's shape and dtype.
    """
    bufs: dict[str, DeviceArray] = {}
    for k in names:
        if k in moved and not own:
            bufs[k] = moved[k]
        else:
            bufs[k] = dev.empty(tuple((host[k] if k in host else moved[k]).shape), dtypes[k])
    return bufs


def copy_inputs(
    dev: ArrayDevice,
    stream: Stream,
    dst: Mapping[str, DeviceArray],
    host: Mapping[str, np.ndarray],
    moved: Mapping[str, DeviceArray],
) -> None:
    """Queue on ``stream`` the copies of an execution's inputs into the buffers it binds: pinned
    host arrays host to device, device arrays device to device (skipped where ``dst`` is the array
    itself). Asynchronous; ordered before the engine or graph launch queued next on ``stream``.

    Raises:
        DeviceCopyError: a device input whose shape or dtype differs from its buffer's.
    """
    for k, x in host.items():
        dev.copy_to_device(x, dst[k], stream)
    for k, y in moved.items():
        if dst[k] is not y:
            dev.copy_on_stream(y, dst[k], stream)


def capture(stream: Any, enqueue: Callable[[], bool]) -> Any:
    """Capture ``enqueue()`` (one ``execute_async_v3`` on ``stream``, bindings already set and
    warmed up) into a CUDA graph; the work is recorded, not run. unverified on a GPU.

    Returns:
        the graph (``cupy.cuda.Graph``: ``.launch(stream)``).

    Raises:
        RuntimeError: the enqueue reported failure during capture; CuPy's ``CUDARuntimeError``
            when the capture was refused or invalidated. The stream is out of capture mode either way.
    """
    stream.begin_capture()
    try:
        ok = enqueue()
    finally:
        graph = stream.end_capture()  # ends capture even after a failure (raises if invalidated)
    if not ok:
        raise RuntimeError("execute_async_v3 reported failure during capture")
    return graph


def note_capture_failure(engine: str, key: ShapeKey, error: BaseException) -> None:
    """Log, once per runner (the caller turns graphs off), why capture failed."""
    shapes = {k: s for k, s in key}
    log.warning(
        "TensorRT engine %r: CUDA graph capture failed for input shapes %s (%s); CUDA graphs are off "
        "for this engine, executions are enqueued one by one",
        engine,
        shapes,
        error,
    )
