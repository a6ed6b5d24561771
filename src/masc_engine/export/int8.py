"""int8 dynamic quantization of a bundle's towers (build time; the gate that accepts or refuses
the result is :mod:`masc_engine.jobs.int8_gate`, which scores pairs and so sits above this layer).
"""

from __future__ import annotations

from pathlib import Path

from ..engine.manifest import read_manifest, write_manifest

#: The graphs quantized; the pooling head stays fp32 (a few MatMuls on one query; PF is its cosine).
INT8_GRAPHS = ("vision", "text")


def quantize_graphs(src: str | Path, stage: str | Path, log=print) -> dict:
    """Quantize the vision and text towers' MatMul weights of bundle ``src`` into the bundle copy
    ``stage`` (ONNX Runtime dynamic quantization, per channel, QInt8) and record it in its manifest.

    Args:
        src: the fp32 bundle directory.
        stage: a copy of it, rewritten in place.
        log: progress messages.

    Returns:
        the stage's new manifest (``precision`` = ``{"mode": "int8-dynamic", ...}``).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, stage = Path(src), Path(stage)
    manifest = read_manifest(src)
    for graph in INT8_GRAPHS:
        f = stage / manifest["graphs"][graph]["file"]
        quantize_dynamic(str(src / manifest["graphs"][graph]["file"]), str(f), op_types_to_quantize=["MatMul"],
                         per_channel=True, weight_type=QuantType.QInt8)
        log(f"quantized {graph} -> int8 ({f.stat().st_size / 1e6:.1f} MB)")
    manifest["precision"] = {"mode": "int8-dynamic", "graphs": list(INT8_GRAPHS), "source_bundle": str(src)}
    # The fp32 bundle's fused ort-cpu graphs (export/fusion.py) would otherwise be picked on CPU
    # instead of the int8 ones: an int8 bundle holds the quantized portable graphs only, so its
    # gate figures do not depend on the fusion.
    dropped = sorted(manifest.pop("variants", None) or {})
    gone = set()
    for entry in manifest["graphs"].values():
        for v in entry.pop("variants", {}).values():
            gone.update({v["file"], v["file"] + ".data"})
    for f in gone:
        (stage / f).unlink(missing_ok=True)
    manifest["precision"]["dropped_variants"] = dropped
    manifest["files"] = [f for f in manifest["files"] if f not in gone]
    write_manifest(stage, manifest)
    return manifest
