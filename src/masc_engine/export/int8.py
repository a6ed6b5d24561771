"""int8 dynamic quantization of a bundle's towers (build time; the gate that accepts or refuses
the result is :mod:`masc_engine.jobs.int8_gate`, which scores pairs and so sits above this layer).
"""

from __future__ import annotations

from pathlib import Path

from ..engine.manifest import read_manifest, write_manifest

#: The graphs quantized; the pooling head stays fp32 (a few MatMuls on one query; PF is its cosine).
INT8_GRAPHS = ("vision", "text")


def quantize_graphs(src: str | Path, stage: str | Path) -> dict:
    """Quantize the vision and text towers' MatMul weights of bundle ``src`` into the bundle copy
    ``stage`` (ONNX Runtime dynamic quantization, per channel, QInt8) and record it in its manifest.

    Args:
        src: the fp32 bundle directory.
        stage: a copy of it, rewritten in place.

    Returns:
        the stage's new manifest (``precision`` = ``{"mode": "int8-dynamic", ...}``).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .external_data import data_files
    from .stages import StageClock

    src, stage = Path(src), Path(stage)
    manifest = read_manifest(src)
    clock = StageClock()
    for graph in INT8_GRAPHS:  # one graph at a time, each a stage line with its memory
        entry = manifest["graphs"][graph]
        f = stage / entry["file"]
        with clock.stage(f"quantize {graph}") as note:
            quantize_dynamic(
                str(src / entry["file"]),
                str(f),
                op_types_to_quantize=["MatMul"],
                per_channel=True,
                weight_type=QuantType.QInt8,
            )
            note["message"] = f"quantized {graph} -> int8 ({f.stat().st_size / 1e6:.1f} MB)"
        entry.pop("external_data", None)  # written inline: the fp32 weight file is no longer read
        if data_files(f):
            entry["external_data"] = data_files(f)
    manifest["precision"] = {"mode": "int8-dynamic", "graphs": list(INT8_GRAPHS), "source_bundle": str(src)}
    # The fp32 bundle's fused ort-cpu graphs (export/fusion.py) would otherwise be picked on CPU
    # instead of the int8 ones: an int8 bundle holds the quantized portable graphs only. (The fp32
    # side of the int8 gate scores the fp32 bundle as masc-run runs it, fused graphs included;
    # they differ from the portable ones by ~1e-6, far inside the gate's 1e-2.)
    from .exporter import _bundle_files, _drop_unreferenced_data

    dropped = sorted(manifest.pop("variants", None) or {})
    gone = set()
    for entry in manifest["graphs"].values():
        for v in entry.pop("variants", {}).values():
            gone.update({v["file"], v["file"] + ".data"})
    for f in gone:
        (stage / f).unlink(missing_ok=True)
    manifest["transforms"] = [r for r in manifest.get("transforms", []) if r.get("variant") not in dropped]
    manifest["precision"]["dropped_variants"] = dropped
    # A quantized graph is written inline: the fp32 external weights it replaced (so400m's
    # ``text.onnx.data``) are no longer referenced and must not stay in the bundle's file list.
    _drop_unreferenced_data(stage, manifest["graphs"])
    manifest["files"] = _bundle_files(stage, manifest["graphs"])
    from .onnx_check import check_graphs

    manifest["onnx_checker"] = {"full_check": True, "graphs": check_graphs(stage, manifest["files"])}
    write_manifest(stage, manifest)
    return manifest
