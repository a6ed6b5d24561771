"""TensorRT engine builds: a bundle's ONNX graphs to strongly typed engines and their sidecar.

:func:`build_engines` builds the engine set ``<bundle>/tensorrt-<precision>/`` (one engine per
graph, profile maxima chosen from a device-memory budget by :func:`.trt_profiles.choose_ranges`)
and writes ``engines.json`` (:func:`.trt_profiles.write_sidecar`); :func:`build_engine` builds one
engine: TensorRT's ONNX parser, one optimization profile per entry, TF32 cleared, the
``RUNTIME_ACTIVATION_RESIZE_10_10`` preview feature where the bindings have it, a timing cache
read before and written after, and TensorRT's own activation-memory figures read back from the
plan. Every refusal TensorRT reports by a return value is raised as :class:`EngineBuildError`
naming the engine, the profile and the shapes.

UNVERIFIED ON A GPU: never run with TensorRT or on a GPU (docs/verification.md); every TensorRT
call here is checked against the real bindings' surface (tests/test_trt_conformance.py) and run on
CPU against tests/doubles/fake_tensorrt.py.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailableError
from . import trt_profiles as tp
from .trt_profiles import Profile
from .trt_device import (
    TensorRTCallError,
    current_device_info,
    default_timing_cache,
    device_memory_info,
    import_tensorrt,
    trt_logger,
)

#: The backend's logger (engine/backends/tensorrt.py's name: build lines keep the name they had).
logger = logging.getLogger(__package__ + ".tensorrt")

if TYPE_CHECKING:  # the annotations name TensorRT's classes; the module itself imports it lazily
    import tensorrt as trt


class EngineBuildError(TensorRTCallError):
    """Building an engine failed: the parser rejected the graph (its errors are listed), a
    profile was refused (index and shapes named), or the build returned no plan."""


def network_flags(trt: Any) -> int:
    """Creation flags for a strongly typed network: ``1 << STRONGLY_TYPED`` where the flag exists
    (TensorRT 10.x and the 11.4 bindings both bind ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``;
    on 11.x strong typing is the only mode), else 0."""
    flag = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def _parse(
    trt: Any, builder: "trt.Builder", onnx_path: Path, graph: str
) -> "tuple[trt.INetworkDefinition, trt.OnnxParser]":
    """``(network, parser)``: the network TensorRT's ONNX parser makes of a graph (the parser is
    returned so that it outlives the network it filled, as TensorRT requires). unverified on a GPU.

    Raises:
        EngineBuildError: the network could not be made, or the parser rejected the graph (each
            error with its node and operator).
    """
    network = builder.create_network(network_flags(trt))
    if network is None:
        raise EngineBuildError(f"TensorRT could not create a network for engine {graph!r}")
    parser = trt.OnnxParser(network, trt_logger(trt))
    if not parser.parse_from_file(str(onnx_path)):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(f"TensorRT's ONNX parser rejected {onnx_path} (engine {graph!r}): " + "; ".join(errors))
    return network, parser


def _parser_error(err: "trt.ParserError") -> str:
    try:
        return f"node {err.node()} ({err.node_operator()}): {err.desc()}"
    except AttributeError:  # a plain string (older bindings)
        return str(err)


def _add_profiles(
    trt: Any, builder: "trt.Builder", config: "trt.IBuilderConfig", profiles: list[Profile], graph: str
) -> None:
    """One optimization profile per entry of ``profiles``, each checked where TensorRT reports a
    refusal: ``set_shape`` raises on min > opt or opt > max, ``add_optimization_profile`` returns
    -1 for a profile the network does not accept. unverified on a GPU.

    Raises:
        EngineBuildError: naming the engine, the profile index, the input and the shapes.
    """
    for i, shapes in enumerate(profiles):
        profile = builder.create_optimization_profile()
        if profile is None:
            raise EngineBuildError(f"TensorRT could not create optimization profile {i} of engine {graph!r}")
        for name, s in shapes.items():
            try:
                profile.set_shape(name, s["min"], s["opt"], s["max"])
            except (RuntimeError, ValueError, TypeError) as e:
                raise EngineBuildError(
                    f"engine {graph!r}, optimization profile {i}: TensorRT refused input {name!r} "
                    f"min {s['min']} opt {s['opt']} max {s['max']} ({e})"
                ) from e
        if config.add_optimization_profile(profile) < 0:
            raise EngineBuildError(
                f"engine {graph!r}: TensorRT refused optimization profile {i} "
                f"({ {k: v['max'] for k, v in shapes.items()} } at max; every dynamic input needs "
                "min <= opt <= max within its fixed dimensions)"
            )


def _builder_config(trt: Any, builder: "trt.Builder", graph: str, workspace_gib: float) -> "trt.IBuilderConfig":
    config = builder.create_builder_config()
    if config is None:
        raise EngineBuildError(f"TensorRT could not create a builder config for engine {graph!r}")
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gib * (1 << 30)))
    # float32 tensors compute in fp32: fp32 engines are the fidelity reference, and the islands of
    # reduced-precision graphs exist for accuracy.
    config.clear_flag(trt.BuilderFlag.TF32)
    return config


def enable_activation_resize(trt: Any, config: "trt.IBuilderConfig") -> bool:
    """Build with ``PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10`` where the bindings have it (the
    11.4 bindings do): what lets a user-managed context's memory follow the shapes run instead of
    the profile maximum. Returns whether it was set. unverified on a GPU."""
    feature = getattr(getattr(trt, "PreviewFeature", None), "RUNTIME_ACTIVATION_RESIZE_10_10", None)
    if feature is None:
        return False
    config.set_preview_feature(feature, True)
    return True


def _use_timing_cache(config: "trt.IBuilderConfig", timing_cache: Path | None) -> "trt.ITimingCache | None":
    if timing_cache is None:
        return None
    blob = timing_cache.read_bytes() if timing_cache.is_file() else b""
    cache = config.create_timing_cache(blob)
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise TensorRTCallError(
            f"TensorRT refused the timing cache {timing_cache} (another TensorRT version "
            "or GPU?); delete it or pass --timing-cache with a new path"
        )
    return cache


def _measured_device_memory(trt: Any, data: bytes, graph: str, profiles: list[Profile]) -> dict[str, Any]:
    """TensorRT's own activation-memory figures for a just-built plan (read by deserializing it
    once): ``device_memory_bytes``, per profile at its maximum, and ``shape_following_bytes``, what a
    user-managed context on profile 0 asks for at the profile's ``min`` and ``opt`` shapes (equal to
    the maximum where the engine's memory does not follow the shapes). unverified on a GPU.

    Raises:
        EngineBuildError: the plan did not deserialize, no context could be made, a shape was
            refused or the size query failed (0).
    """
    runtime = trt.Runtime(trt_logger(trt))
    engine = runtime.deserialize_cuda_engine(data)
    if engine is None:
        raise EngineBuildError(f"TensorRT could not deserialize the engine it just built for {graph!r}")
    per_profile = [
        int(engine.get_device_memory_size_for_profile_v2(i)) for i in range(engine.num_optimization_profiles)
    ]
    ctx = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    if ctx is None:
        raise EngineBuildError(f"TensorRT could not create a user-managed context for engine {graph!r}")
    following: dict[str, int] = {}
    for point in ("min", "opt"):
        for name, s in profiles[0].items():
            if not ctx.set_input_shape(name, tuple(s[point])):
                raise EngineBuildError(
                    f"engine {graph!r}: set_input_shape({name!r}, {s[point]}) failed at the profile's {point} shapes"
                )
        size = int(ctx.update_device_memory_size_for_shapes())
        if size <= 0:
            raise EngineBuildError(
                f"engine {graph!r}: update_device_memory_size_for_shapes() returned {size} (failure) "
                f"at the profile's {point} shapes"
            )
        following[point] = size
    return {"device_memory_bytes": per_profile, "shape_following_bytes": following}


def build_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    precision: str,
    profiles: list[Profile],
    timing_cache: str | Path | None = None,
    workspace_gib: float = 8.0,
    graph: str | None = None,
) -> dict[str, Any]:
    """Build one serialized engine from an ONNX graph, as a strongly typed network.

    unverified on a GPU: never run with TensorRT.

    Every tensor's type comes from the graph (TensorRT 11 removed the weak-typing builder flags and
    per-layer precision and output-type settings): an fp16 / bf16 engine is built from the
    mixed-precision graph of an fp16 / bf16 bundle (export/precision.py), whose fp32 islands
    (LayerNorm, softmax, GELU, reductions) are already in the graph. TF32 is cleared, so float32
    tensors (fp32 engines, and the islands) compute in fp32.

    Args:
        onnx_path: the graph (external weights beside it are found by the parser).
        engine_path: where to write the serialized engine.
        workspace_gib: TensorRT's builder workspace limit, GiB.
        precision: ``fp32``, ``fp16``, ``bf16`` or ``fp8`` (explicit E4M3 Q/DQ, export/fp8.py): the
            graph's precision (checked by the caller).
        profiles: one or more ``{input: {"min", "opt", "max"}}`` (:func:`trt_profiles.profile_shapes`).
        timing_cache: file read before and written after the build (created when missing).
        graph: the engine's name in messages (default: the file's stem).

    Returns:
        build facts for the sidecar: ``layers``, ``seconds``, ``sha256``, ``strongly_typed``,
        ``activation_resize`` (built with the preview feature that lets context memory follow the
        shapes), ``device_memory_bytes`` (TensorRT's activation memory per profile, at its
        maximum) and ``shape_following_bytes`` (a user-managed context's figure at the profile's
        ``min`` and ``opt`` shapes).

    Raises:
        EngineBuildError: the parser rejected the graph, a profile was refused or the build
            returned no plan (each naming the engine, the profile and the shapes).
        TensorRTCallError: TensorRT refused the timing cache.
    """
    trt = import_tensorrt()
    if precision not in (*tp.PRECISIONS, "fp8"):
        raise ValueError(f"precision must be one of {(*tp.PRECISIONS, 'fp8')}, got {precision!r}")
    graph = graph or Path(onnx_path).stem
    t0 = time.time()
    builder = trt.Builder(trt_logger(trt))
    network, parser = _parse(trt, builder, Path(onnx_path), graph)
    config = _builder_config(trt, builder, graph, workspace_gib)
    resize = enable_activation_resize(trt, config)
    _add_profiles(trt, builder, config, profiles, graph)
    timing_cache = Path(timing_cache) if timing_cache is not None else None
    cache = _use_timing_cache(config, timing_cache)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(
            f"TensorRT failed to build engine {graph!r} from {onnx_path} with profiles "
            f"{[{k: v['max'] for k, v in p.items()} for p in profiles]} at max and a "
            f"{workspace_gib:g} GiB workspace (TensorRT's log above says why)"
        )
    engine_path = Path(engine_path)
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    data = bytes(plan)
    engine_path.write_bytes(data)
    if cache is not None and timing_cache is not None:  # a cache is used only with a path
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = timing_cache.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
        tmp.replace(timing_cache)
    secs = time.time() - t0
    logger.info(
        f"built {engine_path.name} ({precision} graph, strongly typed, {network.num_layers} layers) in {secs:.1f}s"
    )
    return {
        "layers": int(network.num_layers),
        "seconds": round(secs, 1),
        "strongly_typed": True,
        "sha256": hashlib.sha256(data).hexdigest(),
        "activation_resize": resize,
        **_measured_device_memory(trt, data, graph, profiles),
    }


def graph_weight_bytes(bundle_dir: Path, manifest: dict[str, Any], graph: str) -> int:
    """Bytes of a graph's weights, as its ONNX file plus external data (weights dominate them)."""
    f = bundle_dir / manifest["graphs"][graph]["file"]
    return sum(p.stat().st_size for p in (f, f.with_name(f.name + ".data")) if p.is_file())


def build_engines(
    bundle_dir: str | Path,
    precision: str | None = None,
    max_batch: int = 16,
    max_outs_per_ref: int = 16,
    graphs: list[str] | None = None,
    timing_cache: str | Path | None = None,
    workspace_gib: float = 8.0,
    gpu_memory_budget: float | None = None,
) -> Path:
    """Build the engine set ``<bundle>/tensorrt-<precision>/`` for every graph of a bundle.

    Strongly typed: the engines' precision is the bundle's (``manifest["precision"]["mode"]``, set
    by ``masc-export --precision``); ``precision``, when given, must equal it. Profile maxima are
    ``max_batch`` / ``max_outs_per_ref``, halved until the memory plan fits the budget:
    ``gpu_memory_budget`` GiB, else the device's free memory now (:func:`trt_profiles.choose_ranges`).

    unverified on a GPU: never run with TensorRT.

    Raises:
        BackendUnavailableError: TensorRT or a GPU is missing, or bf16 on a GPU before sm80.
        EngineBuildError: a build failed (naming the engine, profile and shapes).
        DeviceMemoryError: even the smallest profiles do not fit the budget.
        BundleError: the bundle is missing or modified, or holds graphs of another precision.
    """
    from ..manifest import read_manifest, sha256_file, verify_files

    import_tensorrt()  # fail before any work
    bundle_dir = Path(bundle_dir)
    manifest = read_manifest(bundle_dir)
    verify_files(bundle_dir, manifest)
    precision = _engine_precision(bundle_dir, manifest, precision)
    info = current_device_info()
    major = int(str(info["compute_capability"]).split(".")[0])
    if precision == "bf16" and major < 8:
        raise BackendUnavailableError(
            f"bf16 needs compute capability >= 8.0; {info['gpu_name']} is "
            f"{info['compute_capability']}. Use --precision fp16."
        )
    graphs = graphs or list(manifest["graphs"])
    weights = {g: graph_weight_bytes(bundle_dir, manifest, g) for g in graphs}
    free, total = device_memory_info()
    budget = int(gpu_memory_budget * tp.GIB) if gpu_memory_budget else free
    ranges, plan = tp.choose_ranges(manifest, precision, weights, budget, max_batch, max_outs_per_ref, graphs)
    plan["budget_source"] = (
        f"--gpu-memory-budget {gpu_memory_budget:g} GiB"
        if gpu_memory_budget
        else f"free device memory at build ({free / tp.GIB:.2f} of {total / tp.GIB:.2f} GiB)"
    )
    if (plan["max_batch"], plan["max_outs_per_ref"]) != (max_batch, max_outs_per_ref):
        logger.warning(
            f"profile maxima lowered to fit {budget / tp.GIB:.2f} GiB: --max-batch {plan['max_batch']}, "
            f"--max-outs-per-ref {plan['max_outs_per_ref']} (asked {max_batch}, {max_outs_per_ref})"
        )
    out = bundle_dir / tp.engine_dir_name(precision)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(timing_cache) if timing_cache else default_timing_cache(info)
    engines = {}
    for graph in graphs:
        entry = manifest["graphs"][graph]
        shapes = tp.profile_shapes(entry, ranges)
        facts = build_engine(
            bundle_dir / entry["file"],
            out / f"{graph}.engine",
            precision,
            [shapes],
            timing_cache=cache,
            workspace_gib=workspace_gib,
            graph=graph,
        )
        memory = {
            **plan["engines"][graph],
            "device_memory_bytes": facts.pop("device_memory_bytes"),
            "shape_following_bytes": facts.pop("shape_following_bytes"),
            "activation_resize": facts["activation_resize"],
        }
        engines[graph] = {
            "file": f"{graph}.engine",
            "onnx_sha256": sha256_file(bundle_dir / entry["file"]),
            "profiles": [shapes],
            "memory": memory,
            **facts,
        }
    plan["engines"] = {g: e["memory"] for g, e in engines.items()}
    tp.write_sidecar(
        out,
        {
            **info,
            "precision": precision,
            "engines": engines,
            "timing_cache": str(cache),
            "network": "strongly typed (precision from the ONNX graphs)",
            "precision_policy": manifest.get("precision", {}).get("policy"),
            "axis_ranges": {k: v.to_list() for k, v in ranges.items()},
            "memory_plan": {k: v for k, v in plan.items() if k != "engines"},
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    logger.info(
        f"TensorRT {precision} engines written: {out} (memory plan {plan['total_bytes'] / tp.GIB:.2f} GiB at the "
        f"profile maxima, budget {budget / tp.GIB:.2f} GiB)"
    )
    return out


def _engine_precision(bundle_dir: Path, manifest: dict[str, Any], precision: str | None) -> str:
    from ...errors import BundleError

    graph_precision = str(manifest.get("precision", {}).get("mode", "fp32"))
    if graph_precision not in tp.PRECISIONS:
        raise BundleError(
            f"bundle {bundle_dir} holds {graph_precision} graphs, which TensorRT engines are not built "
            "from; export an fp32, fp16 or bf16 bundle"
        )
    precision = precision or graph_precision
    if precision != graph_precision:
        raise BundleError(
            f"bundle {bundle_dir} holds {graph_precision} graphs; TensorRT builds strongly typed networks, so "
            f"{precision} engines need {precision} graphs: masc-export --model M --out B --precision {precision} "
            f"--backend tensorrt"
        )
    return precision
