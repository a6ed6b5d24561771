"""TensorRT engine bookkeeping that needs neither TensorRT nor a GPU (tested on CPU).

- Optimization profiles: each graph's dynamic axes (named in the bundle manifest) get a
  ``(min, opt, max)`` range: batch-like axes up to ``--max-batch``, patch axes up to the bundle's
  patch budget. :func:`plan_batches` splits a too-large batch into batches that fit and refuses a
  patch count outside the profile with the allowed range (:class:`ProfileError`), before inference.
- The engine set's sidecar (``tensorrt-<precision>/engines.json``): TensorRT version, GPU name,
  compute capability, precision, profiles, and the sha256 of each engine and of the ONNX graph it
  was built from. :func:`check_compatible` refuses an engine set built elsewhere, naming both
  sides and the command that rebuilds it.
- The device-memory plan (:func:`memory_plan`, :func:`choose_ranges`): weights plus activations
  per engine at its profile maxima, on paper (:func:`activation_bytes`), so that profile maxima
  are chosen to fit a device-memory budget before anything is built; the build then records
  TensorRT's own figure per profile beside it (``device_memory_bytes``), and a load refuses an
  engine whose figures exceed the free device memory (:func:`check_fits`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ...errors import BundleError, DeviceMemoryError, EngineCompatibilityError, ProfileError
from ..manifest import confined, one_line

SIDECAR_NAME = "engines.json"
SIDECAR_FORMAT = "masc-tensorrt-engines"
SIDECAR_VERSION = 1
PRECISIONS = ("fp32", "fp16", "bf16")

#: Axes split into several runs when an input exceeds the profile (every output of every graph
#: has its batch-like axis first, so results concatenate back along axis 0).
BATCH_AXES = ("batch", "refs")
#: Axes that must fit the profile: patch and token counts (bounded by the bundle's budget) and
#: outputs per reference (the CP head's packer, runtime/cp_device.py, keeps under it).
BOUNDED_AXES = ("num_patches", "num_tokens", "ref_patches", "out_patches", "outs_per_ref")

#: One optimization profile: ``{input: {"min"|"opt"|"max": shape}}`` (:func:`profile_shapes`).
Profile = dict[str, dict[str, list[int]]]


def engine_dir_name(precision: str) -> str:
    """The engine set's folder inside the bundle: ``tensorrt-<precision>``."""
    return f"tensorrt-{precision}"


def rebuild_command(bundle_dir: str | Path, precision: str) -> str:
    """The command that (re)builds a bundle's engines on the machine that will run them."""
    return f"masc-export --out {bundle_dir} --backend tensorrt --precision {precision} --engines-only"


@dataclass(frozen=True)
class AxisRange:
    """One dynamic axis's optimization-profile range: ``1 <= min <= opt <= max``."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not (1 <= self.min <= self.opt <= self.max):
            raise ValueError(f"profile range needs 1 <= min <= opt <= max, got {self}")

    def to_list(self) -> list[int]:
        """``[min, opt, max]``."""
        return [self.min, self.opt, self.max]


def default_axis_ranges(
    manifest: Mapping[str, Any], max_batch: int = 16, max_outs_per_ref: int = 16
) -> dict[str, AxisRange]:
    """Profile ranges per axis name for a bundle: patch axes up to the manifest's patch budget
    (``image.max_num_patches``), optimised for the full budget (the scorer pads a NaFlex batch to
    its longest image, usually near the budget); batch axes up to ``max_batch``."""
    budget = int(manifest["image"]["max_num_patches"])
    patches = AxisRange(1, budget, budget)
    batch = AxisRange(1, max(1, max_batch // 2), max_batch)
    return {
        "batch": batch,
        "refs": batch,
        "outs_per_ref": AxisRange(1, max(1, max_outs_per_ref // 2), max_outs_per_ref),
        "num_patches": patches,
        "num_tokens": patches,
        "ref_patches": patches,
        "out_patches": patches,
    }


def profile_shapes(graph_entry: Mapping[str, Any], ranges: Mapping[str, AxisRange]) -> Profile:
    """``{input: {"min": shape, "opt": shape, "max": shape}}`` for one graph of the manifest.

    Raises:
        BundleError: a dynamic axis has no range.
    """
    shapes = {}
    for inp in graph_entry["inputs"]:
        lo, opt, hi = [], [], []
        for ax in inp["shape"]:
            if isinstance(ax, str):
                if ax not in ranges:
                    raise BundleError(f"input {inp['name']!r}: no profile range for dynamic axis {ax!r}")
                r = ranges[ax]
                lo.append(r.min)
                opt.append(r.opt)
                hi.append(r.max)
            else:
                lo.append(int(ax))
                opt.append(int(ax))
                hi.append(int(ax))
        shapes[inp["name"]] = {"min": lo, "opt": opt, "max": hi}
    return shapes


def plan_batches(
    graph: str,
    graph_entry: Mapping[str, Any],
    feed_shapes: Mapping[str, Sequence[int]],
    profile: Mapping[str, Mapping[str, Sequence[int]]],
) -> list[slice]:
    """Split a call into runs that fit an engine profile, or refuse it before inference.

    Args:
        graph: the graph's name (for messages).
        graph_entry: the manifest's entry (input names and axis names).
        feed_shapes: ``{input: shape}`` of the call.
        profile: :func:`profile_shapes` output the engine was built with.

    Returns:
        slices along axis 0 (the batch-like axis), each at most the profile's max batch; one
        empty-free slice per run. A batch of 0 gives ``[]``.

    Raises:
        ProfileError: a non-batch dimension lies outside ``[min, max]`` of the profile, or the
            inputs disagree on the batch size.
    """
    batch: int | None = None
    max_batch: int | None = None
    for inp in graph_entry["inputs"]:
        name = inp["name"]
        if name not in feed_shapes:
            raise ProfileError(f"graph {graph!r}: input {name!r} missing")
        shape = list(feed_shapes[name])
        rng = profile[name]
        if len(shape) != len(rng["min"]):
            raise ProfileError(f"graph {graph!r}: input {name!r} has shape {shape}, expected rank {len(rng['min'])}")
        for i, (ax, n) in enumerate(zip(inp["shape"], shape)):
            lo, hi = rng["min"][i], rng["max"][i]
            if i == 0 and isinstance(ax, str) and ax in BATCH_AXES:
                if batch is not None and n != batch:
                    raise ProfileError(f"graph {graph!r}: inputs disagree on the batch size ({batch} vs {n})")
                batch, max_batch = n, hi if max_batch is None else min(max_batch, hi)
                continue
            if not lo <= n <= hi:
                what = f"axis {ax!r}" if isinstance(ax, str) else f"axis {i}"
                hint = (
                    " (the engine's profile covers the bundle's patch budget; rebuild the engines "
                    "with a larger --max-num-patches bundle, or score with a smaller budget)"
                    if ax in ("num_patches", "num_tokens", "ref_patches", "out_patches")
                    else " (runtime/cp_device.py GraphCP packs within the engine's range when given the "
                    "runner; to pack more outputs per call rebuild the engines with a larger "
                    "--max-outs-per-ref)"
                    if ax == "outs_per_ref"
                    else ""
                )
                raise ProfileError(
                    f"graph {graph!r}: input {name!r} {what} is {n}, outside the engine "
                    f"profile's allowed range [{lo}, {hi}]{hint}"
                )
    if batch is None or max_batch is None:  # no batch-like axis: one run (max_batch is set with batch)
        return [slice(None)]
    return [slice(s, min(s + max_batch, batch)) for s in range(0, batch, max_batch)]


def axis_max(
    graph_entry: Mapping[str, Any], profile: Mapping[str, Mapping[str, Sequence[int]]], axis: str
) -> int | None:
    """The profile's largest size for a named dynamic axis (``outs_per_ref``, ``num_patches``...),
    from the first input that has it; None when no input has that axis."""
    for inp in graph_entry["inputs"]:
        for i, ax in enumerate(inp["shape"]):
            if ax == axis and inp["name"] in profile:
                return int(profile[inp["name"]]["max"][i])
    return None


# --------------------------------------------------------------------------- device memory

GIB = 1 << 30
#: Bytes per element of the reduced-precision tensors of an fp16 / bf16 graph (fp32 islands,
#: export/precision.py, stay 4).
FLOAT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1, "int8": 1}
#: Headroom kept free of the budget: the CUDA context, cuBLAS/cuDNN workspaces, CuPy's pool
#: rounding and the patch tokens masc-run caches on the device live outside the engines.
BUDGET_HEADROOM = 0.9


def _tower(manifest: Mapping[str, Any], graph: str) -> tuple[int, int, int]:
    """(width, heads, MLP width) of the tower a graph runs. The manifest records the width and
    the pooling head's heads (SigLIP2's ``num_attention_heads``, shared by the towers); the MLP
    width is taken as 4 x width (so400m has 4304 = 3.74 x 1152: the estimate errs high by 7%)."""
    a = manifest["architecture"]
    width = int(a["text_projection"] if graph == "text" else a["vision_width"])
    return width, int(a.get("pool_heads", max(1, width // 64))), 4 * width


def activation_bytes(
    graph: str, manifest: Mapping[str, Any], shapes: Mapping[str, Sequence[int]], precision: str
) -> int:
    """On-paper estimate of the activation memory one execution of ``graph`` needs at these input
    shapes (what TensorRT's execution context reserves; inputs and outputs are bound separately,
    :func:`io_bytes`).

    The model: memory is reused across layers, so the peak is one layer's live tensors: the
    residual stream (fp32, 2 copies) plus the larger of attention (q/k/v in the graph's float
    type, scores and softmax in fp32 as the precision policy keeps them, probabilities cast back)
    and the MLP (its hidden layer, plus the fp32 GELU island). Attention scores are counted as
    materialised: TensorRT may fuse attention and never hold them (then this errs high). CP: the
    L2-normalised copies (fp32) and the cosine tensor with its fp32 reduction. unverified on a GPU:
    the build records TensorRT's own figure per profile (``device_memory_bytes``) beside this.

    Args:
        graph: the graph's name (``vision``, ``pool``, ``text``, ``cp``).
        manifest: the bundle's manifest (the towers' widths and depths).
        shapes: ``{input: shape}`` with every dynamic axis resolved.
        precision: the engine set's precision (``fp32``, ``fp16``, ``bf16``).

    Returns:
        bytes.
    """
    reduced = graph in (manifest.get("precision", {}) or {}).get("graphs", ())
    e = FLOAT_BYTES[precision] if reduced else 4
    if graph == "cp":
        r, n, d = shapes["ref_tokens"]
        _, k, m, _ = shapes["out_tokens"]
        return int((r * n + r * k * m) * d * 4 + r * k * n * m * (e + 4))
    width, heads, mlp = _tower(manifest, graph)
    if graph == "vision":
        pv = shapes["pixel_values"]
        b = pv[0]
        n = (
            pv[1]
            if len(pv) == 3
            else (pv[2] // int(manifest["image"]["patch_size"])) * (pv[3] // int(manifest["image"]["patch_size"]))
        )
    elif graph == "text":
        b, n = shapes["input_ids"]
    elif graph == "pool":
        b, n, _ = shapes["hidden"]
        # one probe query: K/V projections of every token, the probe's scores, LayerNorm copy
        return int(2 * b * n * width * e + b * n * width * 4 + 2 * b * heads * n * 4 + b * mlp * (e + 4))
    else:
        raise ValueError(f"no activation model for graph {graph!r}")
    resid = 2 * b * n * width * 4
    attention = b * heads * n * n * (4 + 4 + e) + 3 * b * n * width * e
    mlp_bytes = b * n * mlp * (e + 4)
    return int(resid + max(attention, mlp_bytes))


def resolve_shapes(graph_entry: Mapping[str, Any], input_shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """Output shapes from input shapes, through the manifest's axis names."""
    axes = {}
    for inp in graph_entry["inputs"]:
        for ax, n in zip(inp["shape"], input_shapes[inp["name"]]):
            if isinstance(ax, str):
                axes[ax] = int(n)
    return {
        o["name"]: [axes.get(ax, 1) if isinstance(ax, str) else int(ax) for ax in o["shape"]]
        for o in graph_entry["outputs"]
    }


def io_bytes(graph_entry: Mapping[str, Any], input_shapes: Mapping[str, Sequence[int]]) -> int:
    """Bytes of a call's input and output bindings (allocated by the runner, not by TensorRT)."""
    total = 0
    outs = resolve_shapes(graph_entry, input_shapes)
    for t in graph_entry["inputs"]:
        total += _DTYPE_BYTES[t["dtype"]] * _prod(input_shapes[t["name"]])
    for t in graph_entry["outputs"]:
        total += _DTYPE_BYTES[t["dtype"]] * _prod(outs[t["name"]])
    return int(total)


def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def memory_plan(
    manifest: Mapping[str, Any],
    precision: str,
    ranges: Mapping[str, AxisRange],
    weights: Mapping[str, int],
    graphs: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The device-memory plan of an engine set at its profile maxima (on paper).

    Args:
        manifest: the bundle's manifest.
        precision: the engine set's precision (``fp32``, ``fp16``, ``bf16``).
        ranges: each dynamic axis's profile range (:func:`default_axis_ranges`).
        weights: bytes of each graph's weights (its ONNX files' size: weights dominate them).
        graphs: the graphs planned (default: every graph of the manifest).

    Returns:
        ``{"engines": {graph: {"weights_bytes", "profile_max": {"shapes", "activation_bytes",
        "io_bytes"}}}, "total_bytes"}``; ``total_bytes`` is every engine's weights, activations
        and bindings at once (each runner keeps its own context memory).
    """
    engines, total = {}, 0
    for graph in graphs or list(manifest["graphs"]):
        entry = manifest["graphs"][graph]
        shapes = {k: v["max"] for k, v in profile_shapes(entry, ranges).items()}
        act = activation_bytes(graph, manifest, shapes, precision)
        io = io_bytes(entry, shapes)
        w = int(weights.get(graph, 0))
        engines[graph] = {
            "weights_bytes": w,
            "profile_max": {"shapes": shapes, "activation_bytes": act, "io_bytes": io},
        }
        total += w + act + io
    return {"engines": engines, "total_bytes": int(total)}


def choose_ranges(
    manifest: Mapping[str, Any],
    precision: str,
    weights: Mapping[str, int],
    budget_bytes: int,
    max_batch: int = 16,
    max_outs_per_ref: int = 16,
    graphs: Sequence[str] | None = None,
) -> tuple[dict[str, AxisRange], dict[str, Any]]:
    """Profile maxima that fit a device-memory budget: the requested ``max_batch`` and
    ``max_outs_per_ref``, halved (batch first, then outputs per reference) until the plan's total
    fits ``BUDGET_HEADROOM`` x ``budget_bytes``.

    Returns:
        ``(ranges, plan)``; the plan records the budget and the maxima chosen.

    Raises:
        DeviceMemoryError: even batch 1 and one output per reference do not fit (the message gives
            the weights and the smallest plan's total against the budget).
    """
    usable = int(budget_bytes * BUDGET_HEADROOM)
    mb, mo = max(1, int(max_batch)), max(1, int(max_outs_per_ref))
    while True:
        ranges = default_axis_ranges(manifest, max_batch=mb, max_outs_per_ref=mo)
        plan = memory_plan(manifest, precision, ranges, weights, graphs)
        if plan["total_bytes"] <= usable:
            break
        if mb > 1:
            mb //= 2
        elif mo > 1:
            mo //= 2
        else:
            w = sum(int(v) for v in weights.values())
            raise DeviceMemoryError(
                f"the {precision} engines need {plan['total_bytes'] / GIB:.2f} GiB of device memory even at batch 1 "
                f"and 1 output per reference (weights {w / GIB:.2f} GiB), more than {BUDGET_HEADROOM:.0%} of the "
                f"{budget_bytes / GIB:.2f} GiB budget; use a GPU with more memory or a smaller --max-num-patches "
                "bundle"
            )
    plan.update(
        budget_bytes=int(budget_bytes),
        usable_bytes=usable,
        max_batch=mb,
        max_outs_per_ref=mo,
        requested={"max_batch": int(max_batch), "max_outs_per_ref": int(max_outs_per_ref)},
    )
    return ranges, plan


def engine_need_bytes(sidecar_engine: Mapping[str, Any], engine_file_bytes: int) -> int:
    """Device memory one loaded engine may hold: its deserialized plan (about the engine file's
    size) plus, at its largest profile, TensorRT's activation figure recorded at build
    (``device_memory_bytes``; the on-paper estimate when the build could not read it) and the
    bindings."""
    plan = sidecar_engine.get("memory", {})
    measured = plan.get("device_memory_bytes") or []
    act = max(measured) if measured else int(plan.get("profile_max", {}).get("activation_bytes", 0))
    return int(engine_file_bytes + act + int(plan.get("profile_max", {}).get("io_bytes", 0)))


def check_fits(
    graph: str, precision: str, need_bytes: int, free_bytes: int, device_name: str, bundle_dir: str | Path
) -> None:
    """Refuse, before anything is loaded, an engine whose plan exceeds the device's free memory.

    Raises:
        DeviceMemoryError: one line naming the engine, both figures and the rebuild command.
    """
    if need_bytes > free_bytes:
        raise DeviceMemoryError(
            f"TensorRT {precision} engine {graph!r} needs up to {need_bytes / GIB:.2f} GiB of device memory at its "
            f"profile maxima (engines.json memory plan), {device_name} has {free_bytes / GIB:.2f} GiB free; rebuild "
            f"for this GPU's memory: {rebuild_command(bundle_dir, precision)} --gpu-memory-budget "
            f"{max(0.1, free_bytes / GIB * 0.8):.1f}"
        )


# --------------------------------------------------------------------------- sidecar


def write_sidecar(engine_dir: str | Path, info: dict[str, Any]) -> Path:
    """Write ``engines.json`` (adds format and version)."""
    path = Path(engine_dir) / SIDECAR_NAME
    data = {"format": SIDECAR_FORMAT, "format_version": SIDECAR_VERSION, **info}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_sidecar(bundle_dir: str | Path, precision: str) -> dict[str, Any]:
    """Read ``<bundle>/tensorrt-<precision>/engines.json``.

    Raises:
        BundleError: no such engine set (with the command that builds it) or another format.
    """
    path = Path(bundle_dir) / engine_dir_name(precision) / SIDECAR_NAME
    if not path.is_file():
        raise BundleError(
            f"bundle {bundle_dir} has no TensorRT {precision} engines ({path} is missing); "
            f"build them on the GPU that will run them: {rebuild_command(bundle_dir, precision)}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise BundleError(
            f"{path}: not valid JSON ({one_line(e)}); rebuild: {rebuild_command(bundle_dir, precision)}"
        ) from None
    if (
        not isinstance(data, dict)
        or data.get("format") != SIDECAR_FORMAT
        or data.get("format_version") != SIDECAR_VERSION
    ):
        data = data if isinstance(data, dict) else {}
        raise BundleError(
            f"{path}: format {data.get('format')!r} v{data.get('format_version')!r}, expected "
            f"{SIDECAR_FORMAT!r} v{SIDECAR_VERSION}; rebuild: {rebuild_command(bundle_dir, precision)}"
        )
    engines = data.get("engines", {})
    entries: Iterable[tuple[str, object]] = engines.items() if isinstance(engines, dict) else [("?", None)]
    for graph, entry in entries:
        name, field = entry.get("file") if isinstance(entry, dict) else None, f"{path.name} engines.{graph}.file"
        confined(bundle_dir, f"{engine_dir_name(precision)}/{name}" if isinstance(name, str) else name, field)
    return data


def available_precisions(bundle_dir: str | Path) -> list[str]:
    """The precisions whose engine set (its sidecar) the bundle holds."""
    return [p for p in PRECISIONS if (Path(bundle_dir) / engine_dir_name(p) / SIDECAR_NAME).is_file()]


#: What must match between the machine that built an engine set and the one loading it.
COMPAT_KEYS = (("tensorrt_version", "TensorRT"), ("compute_capability", "compute capability"), ("gpu_name", "GPU"))


def check_compatible(
    recorded: Mapping[str, Any], current: Mapping[str, Any], bundle_dir: str | Path, precision: str
) -> None:
    """Refuse engines built for another TensorRT version, compute capability or GPU model.

    TensorRT plans are specific to the TensorRT version and the GPU they were built on (a plan
    from another compute capability fails to deserialize; one from another GPU of the same
    capability loads but runs tactics timed elsewhere). We refuse all three, before
    deserializing, with both sides named.

    Raises:
        EngineCompatibilityError: naming built-for vs. this machine and the rebuild command.
    """
    diffs = [
        f"{label}: built with {recorded.get(key)!r}, this machine has {current.get(key)!r}"
        for key, label in COMPAT_KEYS
        if str(recorded.get(key)) != str(current.get(key))
    ]
    if diffs:
        raise EngineCompatibilityError(
            f"the TensorRT {precision} engines in {bundle_dir} were built for another machine ("
            + "; ".join(diffs)
            + f"). Rebuild them here: {rebuild_command(bundle_dir, precision)}"
        )


def check_onnx_unchanged(
    sidecar: Mapping[str, Any], manifest: Mapping[str, Any], bundle_dir: str | Path, precision: str
) -> None:
    """Refuse engines built from other ONNX graphs than the bundle's (a re-export).

    Raises:
        EngineCompatibilityError
    """
    for graph, e in sidecar.get("engines", {}).items():
        onnx_file = manifest["graphs"].get(graph, {}).get("file")
        now = manifest["files"].get(onnx_file)
        if now != e.get("onnx_sha256"):
            raise EngineCompatibilityError(
                f"the TensorRT {precision} engine for {graph!r} in {bundle_dir} was built from another "
                f"{onnx_file} (sha256 {str(e.get('onnx_sha256'))[:12]}..., the bundle has {str(now)[:12]}...). "
                f"Rebuild: {rebuild_command(bundle_dir, precision)}"
            )
