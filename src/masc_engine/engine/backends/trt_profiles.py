"""TensorRT engine bookkeeping that needs neither TensorRT nor a GPU (tested on CPU).

- Optimization profiles: each graph's dynamic axes (named in the bundle manifest) get a
  ``(min, opt, max)`` range: batch-like axes up to ``--max-batch``, patch axes up to the bundle's
  patch budget. :func:`plan_batches` splits a too-large batch into batches that fit and refuses a
  patch count outside the profile with the allowed range (:class:`ProfileError`), before inference.
- The engine set's sidecar (``tensorrt-<precision>/engines.json``): TensorRT version, GPU name,
  compute capability, precision, profiles, and the sha256 of each engine and of the ONNX graph it
  was built from. :func:`check_compatible` refuses an engine set built elsewhere, naming both
  sides and the command that rebuilds it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ...errors import BundleError, EngineCompatibilityError, ProfileError

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


def engine_dir_name(precision: str) -> str:
    return f"tensorrt-{precision}"


def rebuild_command(bundle_dir: str | Path, precision: str) -> str:
    """The command that (re)builds a bundle's engines on the machine that will run them."""
    return f"masc-export --out {bundle_dir} --backend tensorrt --precision {precision} --engines-only"


@dataclass(frozen=True)
class AxisRange:
    min: int
    opt: int
    max: int

    def __post_init__(self):
        if not (1 <= self.min <= self.opt <= self.max):
            raise ValueError(f"profile range needs 1 <= min <= opt <= max, got {self}")

    def to_list(self) -> list[int]:
        return [self.min, self.opt, self.max]


def default_axis_ranges(manifest: Mapping, max_batch: int = 16, max_outs_per_ref: int = 16) -> dict[str, AxisRange]:
    """Profile ranges per axis name for a bundle: patch axes up to the manifest's patch budget
    (``image.max_num_patches``), optimised for the full budget (the scorer pads a NaFlex batch to
    its longest image, usually near the budget); batch axes up to ``max_batch``."""
    budget = int(manifest["image"]["max_num_patches"])
    patches = AxisRange(1, budget, budget)
    batch = AxisRange(1, max(1, max_batch // 2), max_batch)
    return {"batch": batch, "refs": batch, "outs_per_ref": AxisRange(1, max(1, max_outs_per_ref // 2), max_outs_per_ref),
            "num_patches": patches, "num_tokens": patches, "ref_patches": patches, "out_patches": patches}


def profile_shapes(graph_entry: Mapping, ranges: Mapping[str, AxisRange]) -> dict[str, dict[str, list[int]]]:
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
                lo.append(r.min), opt.append(r.opt), hi.append(r.max)
            else:
                lo.append(int(ax)), opt.append(int(ax)), hi.append(int(ax))
        shapes[inp["name"]] = {"min": lo, "opt": opt, "max": hi}
    return shapes


def plan_batches(graph: str, graph_entry: Mapping, feed_shapes: Mapping[str, Sequence[int]],
                 profile: Mapping[str, Mapping[str, Sequence[int]]]) -> list[slice]:
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
    batch, max_batch = None, None
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
                hint = (" (the engine's profile covers the bundle's patch budget; rebuild the engines "
                        "with a larger --max-num-patches bundle, or score with a smaller budget)"
                        if ax in ("num_patches", "num_tokens", "ref_patches", "out_patches") else
                        " (runtime/cp_device.py GraphCP packs within the engine's range when given the "
                        "runner; to pack more outputs per call rebuild the engines with a larger "
                        "--max-outs-per-ref)" if ax == "outs_per_ref" else "")
                raise ProfileError(f"graph {graph!r}: input {name!r} {what} is {n}, outside the engine "
                                   f"profile's allowed range [{lo}, {hi}]{hint}")
    if batch is None:  # no batch-like axis: one run
        return [slice(None)]
    return [slice(s, min(s + max_batch, batch)) for s in range(0, batch, max_batch)]


def axis_max(graph_entry: Mapping, profile: Mapping[str, Mapping[str, Sequence[int]]], axis: str) -> int | None:
    """The profile's largest size for a named dynamic axis (``outs_per_ref``, ``num_patches``...),
    from the first input that has it; None when no input has that axis."""
    for inp in graph_entry["inputs"]:
        for i, ax in enumerate(inp["shape"]):
            if ax == axis and inp["name"] in profile:
                return int(profile[inp["name"]]["max"][i])
    return None


# --------------------------------------------------------------------------- sidecar


def write_sidecar(engine_dir: str | Path, info: dict) -> Path:
    """Write ``engines.json`` (adds format and version)."""
    path = Path(engine_dir) / SIDECAR_NAME
    data = {"format": SIDECAR_FORMAT, "format_version": SIDECAR_VERSION, **info}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def read_sidecar(bundle_dir: str | Path, precision: str) -> dict:
    """Read ``<bundle>/tensorrt-<precision>/engines.json``.

    Raises:
        BundleError: no such engine set (with the command that builds it) or another format.
    """
    path = Path(bundle_dir) / engine_dir_name(precision) / SIDECAR_NAME
    if not path.is_file():
        raise BundleError(f"bundle {bundle_dir} has no TensorRT {precision} engines ({path} is missing); "
                          f"build them on the GPU that will run them: {rebuild_command(bundle_dir, precision)}")
    data = json.loads(path.read_text())
    if data.get("format") != SIDECAR_FORMAT or data.get("format_version") != SIDECAR_VERSION:
        raise BundleError(f"{path}: format {data.get('format')!r} v{data.get('format_version')!r}, expected "
                          f"{SIDECAR_FORMAT!r} v{SIDECAR_VERSION}; rebuild: {rebuild_command(bundle_dir, precision)}")
    return data


def available_precisions(bundle_dir: str | Path) -> list[str]:
    return [p for p in PRECISIONS if (Path(bundle_dir) / engine_dir_name(p) / SIDECAR_NAME).is_file()]


#: What must match between the machine that built an engine set and the one loading it.
COMPAT_KEYS = (("tensorrt_version", "TensorRT"), ("compute_capability", "compute capability"),
               ("gpu_name", "GPU"))


def check_compatible(recorded: Mapping, current: Mapping, bundle_dir: str | Path, precision: str) -> None:
    """Refuse engines built for another TensorRT version, compute capability or GPU model.

    TensorRT plans are specific to the TensorRT version and the GPU they were built on (a plan
    from another compute capability fails to deserialize; one from another GPU of the same
    capability loads but runs tactics timed elsewhere). We refuse all three, before
    deserializing, with both sides named.

    Raises:
        EngineCompatibilityError: naming built-for vs. this machine and the rebuild command.
    """
    diffs = [f"{label}: built with {recorded.get(key)!r}, this machine has {current.get(key)!r}"
             for key, label in COMPAT_KEYS if str(recorded.get(key)) != str(current.get(key))]
    if diffs:
        raise EngineCompatibilityError(
            f"the TensorRT {precision} engines in {bundle_dir} were built for another machine ("
            + "; ".join(diffs) + f"). Rebuild them here: {rebuild_command(bundle_dir, precision)}"
        )


def check_onnx_unchanged(sidecar: Mapping, manifest: Mapping, bundle_dir: str | Path, precision: str) -> None:
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
