"""OpenVINO backend (CPU): the bundle's portable ONNX graphs compiled by OpenVINO's CPU plugin.

Why a second CPU backend: in fp32 ONNX Runtime's fused graphs already run at the machine's GEMM
rate; OpenVINO's CPU plugin runs the same graphs in **bf16** on CPUs with native bf16 (AVX512_BF16
or AMX), about twice the fp32 GEMM rate. bf16 scores are not bit-equal to fp32: a bundle is run in
bf16 only when it carries a certificate (``masc-export --precision bf16-cpu``,
:mod:`masc_engine.export.cpu_precision`): the gate figures against fp32 ONNX Runtime and the
encoder layers kept in fp32 to pass them.

Settings (every one explicit, never OpenVINO's defaults, which differ by CPU):

- ``INFERENCE_PRECISION_HINT``: ``f32`` or ``bf16``, always set. On a bf16-capable CPU OpenVINO's
  default *is* bf16 (it then compiles every FullyConnected and most LayerNorms in bf16), so an
  unset hint would silently give reduced precision. After compiling, the runtime model is read
  back (``get_runtime_model()``, each node's ``runtimePrecision``): an ``f32`` graph with any bf16
  node, or a ``bf16`` graph with no bf16 matrix multiplication, is refused.
- ``PERFORMANCE_HINT`` ``LATENCY``: one stream using every core, for one synchronous call at a
  time (the runtime's pattern: one batch per call). ``THROUGHPUT`` makes streams of one thread
  each, so one synchronous call uses one core.
- ``INFERENCE_NUM_THREADS``: the caller's ``threads`` (``Scorer(intra_op_threads=...)``), else
  OpenVINO's LATENCY default (the physical cores); the value in effect is ``runner.threads``.
- ``DYNAMIC_QUANTIZATION_GROUP_SIZE`` 0: no int8 activation quantization of FullyConnected layers
  (the CPU plugin applies it by default to compressed weights; our weights are fp32, so this only
  keeps it from ever applying).

Graphs are read as they are (``Core.read_model`` on the bundle's portable ``.onnx``): no second
export format. (The fused ``ort-cpu`` graphs also load, their ``com.microsoft`` ops included, but
they are ONNX Runtime's variant and not used here.)

**Per-layer precision.** A certified bf16 graph may keep some encoder layers in fp32. OpenVINO's
CPU plugin honours a per-node precision attribute (rt_info ``DisablePrecisionConversion``) only
on nodes that survive its own fusions: measured with openvino 2026.4.1, a MatMul whose bias Add is
fused into a FullyConnected (every real SigLIP2 linear layer) comes out bf16 although both nodes
were marked. So the runner compiles the graph as consecutive **segments** instead, cut at encoder
layer boundaries (the residual stream's tensor, named in the certificate): each segment is its
own compiled model with its own ``INFERENCE_PRECISION_HINT``, and a layer kept in fp32 runs wholly
in fp32 (its LayerNorms, attention and MLP). The boundary tensor passes between segments without
a copy (shared OpenVINO tensors); the graph inputs are fed to every segment (the attention mask
and shape computations are recomputed per segment, a few element-wise ops).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ...errors import BackendUnavailableError, BundleError
from ..stage_clock import stage
from ..manifest import BF16_CPU_MODE as BF16_CPU_MODE  # its home is the manifest's vocabulary
from ..vendor_telemetry import decline_openvino_telemetry

if TYPE_CHECKING:
    from ..device import ArrayDevice, DeviceArray
    from .base import BundleView


#: Accepted precision names -> OpenVINO ``INFERENCE_PRECISION_HINT`` values.
PRECISION_HINTS = {"fp32": "f32", "f32": "f32", "bf16": "bf16"}

#: Runtime-model layer types that do the matrix multiplications (what bf16 is for).
MATMUL_LAYER_TYPES = ("FullyConnected", "MatMul", "Subgraph", "ScaledDotProductAttention", "MHA")

_CORE: Any = None  # the openvino.Core, made on first use
_CORE_LOCK = threading.Lock()


def import_openvino() -> Any:
    """``import openvino`` or raise :class:`BackendUnavailableError` with the install command.

    Raises:
        BackendUnavailableError: openvino (the ``[openvino]`` extra) is not installed.
    """
    decline_openvino_telemetry()  # before openvino_telemetry first runs (engine/vendor_telemetry.py)
    try:
        import openvino
    except ImportError as e:
        from ...extras import install_hint

        raise BackendUnavailableError(
            f"the OpenVINO backend needs openvino, which is not installed: {install_hint('openvino')}"
        ) from e
    return openvino


def core() -> Any:
    """The process's one ``openvino.Core`` (created on first use)."""
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            _CORE = import_openvino().Core()
        return _CORE


def cpu_supports_bf16() -> bool:
    """Whether OpenVINO's CPU plugin reports native bf16 (``OPTIMIZATION_CAPABILITIES`` has
    ``BF16``: AVX512_BF16 or AMX). Without it OpenVINO would ignore a bf16 hint and run f32."""
    return "BF16" in core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def hint_for(precision: str) -> str:
    """``"fp32"``/``"f32"`` -> ``"f32"``, ``"bf16"`` -> ``"bf16"``.

    Raises:
        ValueError: another precision (OpenVINO's CPU plugin computes fp16 only on some ARM CPUs).
    """
    try:
        return PRECISION_HINTS[precision]
    except KeyError:
        raise ValueError(
            f"OpenVINO CPU precision must be one of {sorted(PRECISION_HINTS)}, got {precision!r}"
        ) from None


def check_available(provider: str = "cpu", precision: str | None = None) -> None:
    """Raise unless OpenVINO is installed and this CPU can run ``precision`` natively (cheap: no
    model is compiled; the backend registry's availability check).

    Raises:
        BackendUnavailableError: openvino missing, a provider other than the CPU, or bf16 asked on
            a CPU without native bf16.
        ValueError: an unknown precision.
    """
    hint = hint_for(precision or "f32")
    import_openvino()
    if provider not in ("cpu", "CPUExecutionProvider"):
        raise BackendUnavailableError(
            f"the OpenVINO backend runs on the CPU only; provider {provider!r} is not possible"
        )
    if hint == "bf16" and not cpu_supports_bf16():
        caps = core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        raise BackendUnavailableError(
            f"bf16 on OpenVINO needs a CPU with native bf16 (AVX512_BF16 or AMX); this CPU reports {caps}. "
            "Run fp32 (the default backend, ONNX Runtime) instead"
        )


def compile_config(precision: str, threads: int | None = None) -> dict[str, str | int]:
    """The CPU plugin properties of one compiled graph (see the module docstring for each)."""
    cfg: dict[str, str | int] = {
        "INFERENCE_PRECISION_HINT": hint_for(precision),
        "PERFORMANCE_HINT": "LATENCY",
        "EXECUTION_MODE_HINT": "PERFORMANCE",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    if threads:
        cfg["INFERENCE_NUM_THREADS"] = int(threads)
    return cfg


@dataclass(frozen=True)
class Segment:
    """A run of consecutive units compiled with one precision.

    Attributes:
        precision: ``"f32"`` or ``"bf16"``.
        start: tensor name the segment reads from the previous one (None: the graph's inputs only).
        end: tensor name it hands to the next one (None: the graph's outputs).
        units: the unit names it covers (``"vision.layers.3"``).
    """

    precision: str
    start: str | None
    end: str | None
    units: tuple[str, ...] = ()


def plan_segments(units: dict[str, Any], precision: str, keep_fp32: Sequence[str] = ()) -> list[Segment]:
    """Cut a graph into segments: ``precision`` everywhere except the units in ``keep_fp32``.

    Args:
        units: ``{"names": [u_0 .. u_L+1], "boundaries": [b_0 .. b_L]}``: unit ``u_j`` reads
            boundary ``b_{j-1}`` (the graph inputs for ``j = 0``) and writes ``b_j`` (the graph
            outputs for the last unit); export/cpu_precision.py ``graph_units`` makes it.
        precision: the precision of the units not kept (``bf16`` or ``f32``).
        keep_fp32: unit names computed in fp32.

    Returns:
        Segments in order; consecutive units of one precision share a segment.

    Raises:
        BundleError: a unit name not in ``units``, or ``units`` malformed.
    """
    names, bounds = list(units["names"]), list(units["boundaries"])
    if len(names) != len(bounds) + 1:
        raise BundleError(f"unit table has {len(names)} units for {len(bounds)} boundaries (needs one more unit)")
    unknown = sorted(set(keep_fp32) - set(names))
    if unknown:
        raise BundleError(f"units {unknown} kept in fp32 are not units of this graph ({names[0]} .. {names[-1]})")
    hint = hint_for(precision)
    edges = [None] + bounds + [None]
    segs: list[Segment] = []
    for j, name in enumerate(names):
        p = "f32" if name in keep_fp32 else hint
        if segs and segs[-1].precision == p:
            last = segs[-1]
            segs[-1] = Segment(p, last.start, edges[j + 1], last.units + (name,))
        else:
            segs.append(Segment(p, edges[j], edges[j + 1], (name,)))
    return segs


def _submodel(model: Any, seg: Segment) -> Any:
    """The part of ``model`` (an ``openvino.Model``, cloned) from ``seg.start`` to ``seg.end``."""
    ov = import_openvino()
    import openvino.opset13 as ops

    m = model.clone()
    outs = {n: o for op in m.get_ops() for o in op.outputs() for n in o.get_names()}
    params = list(m.get_parameters())
    for name in (seg.start, seg.end):
        if name is not None and name not in outs:
            raise BundleError(f"tensor {name!r} named as a segment boundary is not in the graph")
    if seg.start is not None:
        src = outs[seg.start]
        p = ops.parameter(src.get_partial_shape(), src.get_element_type(), name=seg.start)
        for target in list(src.get_target_inputs()):
            target.replace_source_output(p.output(0))
        p.output(0).set_names({seg.start})
        params.append(p)
    results = [ops.result(outs[seg.end])] if seg.end is not None else list(m.get_results())
    return ov.Model(results, params, f"{model.get_friendly_name()}[{seg.start}:{seg.end}]")


def _matmul_count(model: Any) -> int:
    return sum(op.get_type_name() == "MatMul" for op in model.get_ops())


def runtime_layers(compiled: Any) -> list[dict[str, str]]:
    """What the CPU plugin compiled: per runtime-model node its ``layerType``,
    ``runtimePrecision``, ``outputPrecisions`` and ``originalLayersNames`` (rt_info of
    ``compiled.get_runtime_model()``)."""
    out: list[dict[str, str]] = []
    for node in compiled.get_runtime_model().get_ordered_ops():
        rt = node.get_rt_info()

        def get(k: str) -> str:
            return str(rt[k].astype(str)) if k in rt else ""

        out.append(
            {
                "type": get("layerType"),
                "precision": get("runtimePrecision"),
                "outputs": get("outputPrecisions"),
                "names": get("originalLayersNames"),
            }
        )
    return out


def precision_counts(layers: list[dict[str, str]]) -> dict[str, int]:
    """``{"FullyConnected:bf16": 14, ...}`` over runtime layers (constants and reorders left out)."""
    c = Counter(f"{x['type']}:{x['precision']}" for x in layers if x["type"] not in ("Const", "Input", "Output"))
    return dict(sorted(c.items()))


def check_runtime_precision(layers: list[dict[str, str]], hint: str, what: str) -> None:
    """Refuse a compiled model whose runtime precision is not the one asked for.

    ``f32``: no node computes or outputs bf16. ``bf16``: at least one matrix multiplication node
    computes in bf16 (when the model has any).

    Raises:
        BackendUnavailableError: naming the graph, the precision asked and what was compiled.
    """
    if hint == "f32":
        bad = [x for x in layers if x["precision"] == "bf16" or "bf16" in x["outputs"]]
        if bad:
            raise BackendUnavailableError(
                f"{what}: OpenVINO compiled {len(bad)} nodes in bf16 although f32 was asked "
                f"(first: {bad[0]['type']} {bad[0]['names'][:80]})"
            )
        return
    mm = [x for x in layers if x["type"] in MATMUL_LAYER_TYPES]
    if mm and not any(x["precision"] == "bf16" for x in mm):
        raise BackendUnavailableError(
            f"{what}: OpenVINO compiled no matrix multiplication in bf16 although bf16 was asked "
            f"({precision_counts(layers)}); this CPU or openvino build does not run bf16"
        )


class _CompiledSegment:
    def __init__(self, seg: Segment, compiled: Any, what: str) -> None:
        self.segment = seg
        self.compiled = compiled
        self.input_names = [i.get_any_name() for i in compiled.inputs]
        self.output_names = [o.get_any_name() for o in compiled.outputs]
        self.hint = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # in effect: "f32" / "bf16"
        if self.hint != seg.precision:
            raise BackendUnavailableError(
                f"{what}: OpenVINO compiled with inference precision {self.hint}, not the {seg.precision} asked"
            )
        self.layers = runtime_layers(compiled)
        check_runtime_precision(self.layers, seg.precision, what)


class OpenVINORunner:
    """One graph on OpenVINO's CPU plugin, possibly as several precision segments.

    ``run`` is thread-safe: each calling thread gets its own infer requests.

    Args:
        path: the ONNX graph (the bundle's portable graph).
        name: the graph's name (``vision``, ``pool``, ``text``, ``cp``).
        precision: ``"f32"`` (or ``"fp32"``) or ``"bf16"``.
        threads: ``INFERENCE_NUM_THREADS`` (default: OpenVINO's LATENCY choice, the physical cores).
        units: the graph's unit table (:func:`plan_segments`); needed only with ``keep_fp32``.
        keep_fp32: unit names computed in fp32 inside a bf16 graph.
        segments: an explicit :class:`Segment` list instead of ``precision``/``units``/``keep_fp32``
            (benchmarks and tests: e.g. every boundary cut, all in f32).
        cache_dir: OpenVINO's ``CACHE_DIR`` (its compiled-model cache: a later process compiling the
            same segment with the same settings imports the blob instead of compiling), or None.

    Attributes:
        precision: ``"fp32"`` or ``"bf16"`` (bf16 when any segment computes in bf16).
        threads: ``INFERENCE_NUM_THREADS`` in effect.
        segments: the :class:`Segment` list compiled.

    Raises:
        BackendUnavailableError: openvino missing; bf16 on a CPU without native bf16; a compiled
            model whose runtime precision is not the one asked for.
        BundleError: a boundary tensor missing from the graph, or segments that do not partition it.
    """

    backend = "openvino"

    def __init__(
        self,
        path: str | Path,
        name: str,
        precision: str = "f32",
        threads: int | None = None,
        units: dict[str, Any] | None = None,
        keep_fp32: Sequence[str] = (),
        segments: Sequence[Segment] | None = None,
        cache_dir: str | Path | None = None,
    ) -> None:
        hint = hint_for(precision)
        if keep_fp32 and units is None:
            raise ValueError("keep_fp32 needs the graph's unit table (units=)")
        if segments is None:
            segments = plan_segments(units, hint, keep_fp32) if units is not None else [Segment(hint, None, None)]
        for p in sorted({s.precision for s in segments}):
            check_available(precision=p)
        c = core()
        self.name, self.path = name, str(path)
        self.segments = list(segments)
        self.stage = f"{Path(path).parent.name}/{name}"
        extra = {"CACHE_DIR": str(cache_dir)} if cache_dir is not None else {}
        whole = len(self.segments) == 1 and self.segments[0].start is None and self.segments[0].end is None
        if whole and cache_dir is not None:
            # OpenVINO's path overload: on a cache hit it imports the compiled blob without parsing
            # the ONNX file (0.2-1.2 s for a 150-350 MB graph with its weights inside) or hashing
            # the model's constants. Its key is the file's absolute path, size and modification
            # time with the settings; the folder itself is keyed by the bundle's fingerprint.
            with stage(f"compile:{self.stage}"):
                cfg = {**compile_config(self.segments[0].precision, threads), **extra}
                compiled = c.compile_model(str(path), "CPU", cfg)
            self._finish([compiled], compiled)
            return
        model = c.read_model(str(path))
        if whole:
            parts = [model]
        else:
            parts = [_submodel(model, s) for s in self.segments]
            # A boundary that is not the only path between its two sides would pull earlier layers
            # into a later segment (computed twice, in the wrong precision): count the MatMuls.
            if sum(_matmul_count(p) for p in parts) != _matmul_count(model):
                raise BundleError(
                    f"graph {name!r}: segment boundaries {[s.end for s in self.segments[:-1]]} do not "
                    "cut it into disjoint parts (a layer's residual stream is not its only link)"
                )
        compiled_parts = []
        for s, part in zip(self.segments, parts):
            with stage(f"compile:{self.stage}"):
                compiled_parts.append(c.compile_model(part, "CPU", {**compile_config(s.precision, threads), **extra}))
        self._finish(compiled_parts, model)

    def _finish(self, compiled_parts: list[Any], whole: Any) -> None:
        """Check each compiled segment's precision; take the graph's input and output names from
        ``whole`` (the model, or the one compiled segment: a later segment may take a graph input
        the first does not); set threads and precision."""
        self._compiled = [
            _CompiledSegment(s, cm, f"graph {self.name!r} {list(s.units) or ''}")
            for s, cm in zip(self.segments, compiled_parts)
        ]
        self.input_names = [i.get_any_name() for i in whole.inputs]
        self.output_names = [o.get_any_name() for o in whole.outputs]
        self.threads = int(self._compiled[0].compiled.get_property("INFERENCE_NUM_THREADS"))
        self.precision = "bf16" if any(s.precision == "bf16" for s in self.segments) else "fp32"
        self._local = threading.local()

    def runtime_summary(self) -> list[dict[str, Any]]:
        """Per segment: precision asked, ``INFERENCE_PRECISION_HINT`` in effect, boundaries, units and
        the runtime model's ``{"<layerType>:<runtimePrecision>": count}``."""
        return [
            {
                "precision": cs.segment.precision,
                "hint": cs.hint,
                "start": cs.segment.start,
                "end": cs.segment.end,
                "units": list(cs.segment.units),
                "runtime": precision_counts(cs.layers),
            }
            for cs in self._compiled
        ]

    def _requests(self) -> list[Any]:
        reqs = getattr(self._local, "requests", None)
        if reqs is None:
            reqs = self._local.requests = [cs.compiled.create_infer_request() for cs in self._compiled]
        return reqs

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph. ``feeds`` maps every input name to an array of the graph's dtype; the
        outputs are new arrays (never views of OpenVINO's buffers)."""
        values = {k: feeds[k] for k in self.input_names}
        last = len(self._compiled) - 1
        for i, (cs, req) in enumerate(zip(self._compiled, self._requests())):
            # Intermediate outputs are read straight from the request's buffer by the next segment
            # (share_outputs): this thread does not reuse the request before the call ends.
            with stage(f"run:{self.stage}"):
                res = req.infer({k: values[k] for k in cs.input_names}, share_inputs=True, share_outputs=i < last)
            if i < last:
                values[cs.segment.end] = res[0]
            else:
                return {n: res[j] for j, n in enumerate(cs.output_names)}
        raise AssertionError("unreachable")

    def run_device(self, feeds: dict[str, DeviceArray], device: ArrayDevice) -> dict[str, DeviceArray]:
        """Host memory only (the CPU plugin's): ``device`` must be engine/device.py ``HostDevice``.

        Raises:
            BackendUnavailableError: a GPU token device.
        """
        if getattr(device, "ort_device_type", None) != "cpu":
            raise BackendUnavailableError(
                f"graph {self.name!r} runs on OpenVINO's CPU plugin; it cannot use "
                f"{getattr(device, 'name', device)} memory"
            )
        out = self.run({k: np.asarray(device.to_host(v) if device.is_device_array(v) else v) for k, v in feeds.items()})
        return {k: device.from_host(v) for k, v in out.items()}


def certificate(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The bundle's bf16-cpu record (``manifest["precision"]`` when its mode is ``bf16-cpu``)."""
    rec: dict[str, Any] = manifest.get("precision") or {}
    return rec if rec.get("mode") == BF16_CPU_MODE else None


def load_runner(
    bundle: BundleView,
    graph: str,
    *,
    provider: str = "cpu",
    precision: str | None = None,
    intra_op_threads: int | None = None,
    variant: str = "portable",
    options: Mapping[str, Any] | None = None,
) -> OpenVINORunner:
    """An :class:`OpenVINORunner` for one of a bundle's graphs.

    Precision: ``None`` is the bundle's own: bf16 for a ``bf16-cpu`` bundle (its certified graphs in
    bf16 with their fp32 units; its other graphs f32), else f32. ``"fp32"`` runs any fp32 bundle in
    f32. ``"bf16"`` needs a ``bf16-cpu`` bundle: an uncertified graph is never run in bf16.

    Raises:
        BackendUnavailableError: openvino missing, a non-CPU provider, bf16 without a certificate or
            without native bf16, a bundle whose graphs are not fp32 (fp16, bf16, int8 graphs).
        BundleError: the certificate names units or tensors the graph does not have.
    """
    import warnings

    check_available(provider)
    cert = certificate(bundle.manifest)
    mode = (bundle.manifest.get("precision") or {}).get("mode", "fp32")
    if cert is None and mode != "fp32":
        raise BackendUnavailableError(
            f"bundle {bundle.path} holds {mode} graphs; the OpenVINO backend runs an "
            "fp32 bundle (in f32, or in bf16 once certified: masc-export --precision bf16-cpu)"
        )
    want = hint_for(precision) if precision is not None else ("bf16" if cert else "f32")
    if want == "bf16" and cert is None:
        raise BackendUnavailableError(
            f"bundle {bundle.path} is not certified for bf16 on the CPU: export it with masc-export --precision "
            "bf16-cpu (scores the gates against fp32 and keeps in fp32 the layers that need it), or run fp32"
        )
    units: dict[str, Any] | None = None
    keep: Sequence[str] = ()
    hint = "f32"
    if want == "bf16" and cert is not None:  # (refused above without a certificate)
        openvino = import_openvino()

        if cert.get("openvino") and cert["openvino"] != openvino.__version__:
            warnings.warn(
                f"bundle {bundle.path} was certified for bf16 with openvino {cert['openvino']}; this is "
                f"{openvino.__version__}, whose kernels may round differently (re-certify to be sure)",
                UserWarning,
                stacklevel=2,
            )
        if graph in cert.get("graphs", ()):
            hint, units = "bf16", cert["units"][graph]
            keep = [u for u in cert.get("keep_fp32", ()) if u in units["names"]]
    return OpenVINORunner(
        bundle.graph_file(graph),
        graph,
        hint,
        threads=intra_op_threads,
        units=units,
        keep_fp32=keep,
        cache_dir=compiled_cache_dir(bundle),
    )


def compiled_cache_dir(bundle: BundleView) -> Path | None:
    """Where OpenVINO keeps ``bundle``'s compiled models: ``<cache root>/runtime/openvino/<bundle
    fingerprint>`` (engine/cache_root.py; ``masc-cache clean --all`` removes it), created; None
    (no caching, every process compiles) when it cannot be created or the bundle asks for none
    (``compiled_model_cache`` False)."""
    from ..cache_root import RUNTIME, cache_root
    from ..manifest import fingerprint

    if not getattr(bundle, "compiled_model_cache", True):
        return None

    path = cache_root() / RUNTIME / "openvino" / fingerprint(bundle.manifest)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path
