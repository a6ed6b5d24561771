"""The bundle manifest: the single source of truth for the runtime.

``manifest.json`` holds everything the runtime needs (graph files and their I/O, image and text
settings, scoring thresholds), each file's sha256, the source model id and revision, and the
library versions used to export it. The runtime never guesses a setting from a model name.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import BundleError
from .backends.openvino import BF16_CPU_MODE

MANIFEST_NAME = "manifest.json"
FORMAT = "masc-bundle"
FORMAT_VERSION = 1


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(bundle_dir: str | Path, manifest: dict) -> Path:
    """Write ``manifest.json`` after recording the sha256 of every file it lists in ``files``."""
    bundle_dir = Path(bundle_dir)
    manifest = dict(manifest)
    manifest["format"] = FORMAT
    manifest["format_version"] = FORMAT_VERSION
    manifest["files"] = {name: sha256_file(bundle_dir / name) for name in sorted(manifest["files"])}
    path = bundle_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(bundle_dir: str | Path) -> dict:
    """Read and check the format of ``manifest.json``.

    Raises:
        BundleError: missing directory or manifest, unreadable JSON, another format or version.
    """
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / MANIFEST_NAME
    if not bundle_dir.is_dir():
        raise BundleError(f"bundle directory {bundle_dir} does not exist (make one with masc-export)")
    if not path.is_file():
        raise BundleError(f"{bundle_dir} has no {MANIFEST_NAME}; is it a masc-export bundle?")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BundleError(f"{path}: not valid JSON ({e})") from e
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{path}: format {manifest.get('format')!r} v{manifest.get('format_version')!r}; "
            f"this masc-engine reads {FORMAT!r} v{FORMAT_VERSION}. Re-export the bundle."
        )
    return manifest


def verify_files(bundle_dir: str | Path, manifest: dict) -> None:
    """Check every listed file exists and matches its sha256.

    Raises:
        BundleError: naming the first missing or modified file.
    """
    bundle_dir = Path(bundle_dir)
    for name, digest in manifest["files"].items():
        p = bundle_dir / name
        if not p.is_file():
            raise BundleError(f"bundle {bundle_dir}: file {name} listed in the manifest is missing")
        actual = sha256_file(p)
        if actual != digest:
            raise BundleError(f"bundle {bundle_dir}: {name} sha256 {actual[:12]}... != manifest {digest[:12]}...")


def fingerprint(manifest: dict) -> str:
    """A short content fingerprint of a bundle: sha256 over the manifest's file digests and
    settings (what makes cached tokens and resumed results reusable), and a bf16-cpu
    certificate's plan (export/cpu_precision.py)."""
    keyed = {k: manifest[k] for k in ("files", "image", "text", "scoring") if k in manifest}
    cert = manifest.get("precision") or {}
    if cert.get("mode") == BF16_CPU_MODE:  # the certified plan changes bf16 tokens: re-certifying is a new bundle
        keyed["bf16_cpu"] = {k: cert.get(k) for k in ("graphs", "keep_fp32", "openvino")}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def _dims(manifest: dict, graph: str, tensor: str) -> list | None:
    """The declared shape of a graph's input or output, or None when the manifest lacks it."""
    entry = (manifest.get("graphs") or {}).get(graph) or {}
    for t in (entry.get("inputs") or []) + (entry.get("outputs") or []):
        if t.get("name") == tensor:
            return list(t.get("shape") or [])
    return None


def check_consistency(manifest: dict, where: str) -> None:
    """Check the manifest's settings against the shapes it declares for its graphs, before any
    graph is loaded: a manifest edited (or copied from another bundle) so that it no longer
    describes its graphs fails here in one line, not in ONNX Runtime at the first batch.

    Checked: ``image.patch_size`` (and ``position_grid``) against the vision graph's
    ``pixel_values`` (``3 * p * p`` values a patch, NaFlex) or ``[3, H, W]`` (fixed size) and
    ``position_weights``; ``architecture.vision_width`` against the vision output, the pooling
    head's and the CP graph's token width; ``architecture.text_projection`` against the text and
    pooled embeddings; ``text.max_length`` against the text graph's ``input_ids``. Symbolic
    dimensions are not compared.

    Raises:
        BundleError: naming the setting, both values and what to do.
    """
    image, text, arch = manifest.get("image") or {}, manifest.get("text") or {}, manifest.get("architecture") or {}
    p = image.get("patch_size")
    checks = []  # (setting, its value, graph.tensor[axis], expected dim)
    if image.get("mode") == "naflex" and p:
        checks.append(("image.patch_size", p, ("vision", "pixel_values", -1), 3 * int(p) * int(p)))
        if image.get("position_grid"):
            g = int(image["position_grid"])
            checks.append(("image.position_grid", g, ("vision", "position_weights", -1), g * g))
    elif image.get("mode") == "fixed" and image.get("image_size"):
        h, w = image["image_size"]
        checks += [("image.image_size", image["image_size"], ("vision", "pixel_values", -2), int(h)),
                   ("image.image_size", image["image_size"], ("vision", "pixel_values", -1), int(w))]
    if arch.get("vision_width"):
        d = int(arch["vision_width"])
        checks += [("architecture.vision_width", d, (g, t, -1), d) for g, t in (
            ("vision", "last_hidden_state"), ("pool", "hidden"), ("cp", "ref_tokens"), ("cp", "out_tokens"))]
    if arch.get("text_projection"):
        q = int(arch["text_projection"])
        checks += [("architecture.text_projection", q, (g, t, -1), q) for g, t in (("text", "text_embeds"),
                                                                                   ("pool", "pooled"))]
    if text.get("max_length"):
        n = int(text["max_length"])
        checks.append(("text.max_length", n, ("text", "input_ids", -1), n))
    for setting, value, (graph, tensor, axis), want in checks:
        shape = _dims(manifest, graph, tensor)
        if shape is None or len(shape) < -axis or not isinstance(shape[axis], int):
            continue
        if shape[axis] != want:
            raise BundleError(f"bundle {where}: manifest {setting} is {value}, but its {graph} graph's {tensor} has "
                              f"{shape[axis]} where that needs {want}: the manifest does not describe these graphs; "
                              "re-export the bundle with masc-export")


def check_graph_io(declared: dict, actual_inputs, actual_outputs, graph: str, where: str) -> None:
    """Check a loaded graph's inputs and outputs against the manifest's entry for it: each
    declared tensor exists, with as many axes and equal fixed dimensions.

    Args:
        declared: ``manifest["graphs"][graph]``.
        actual_inputs, actual_outputs (iterable of (str, sequence)): ``(name, shape)`` pairs from the loaded graph (ONNX
            Runtime's ``session.get_inputs()``; a symbolic axis is a string or None).

    Raises:
        BundleError: naming the graph, the tensor and both shapes.
    """
    actual = {name: list(shape) for name, shape in [*actual_inputs, *actual_outputs]}
    for t in (declared.get("inputs") or []) + (declared.get("outputs") or []):
        name, want = t.get("name"), list(t.get("shape") or [])
        if name not in actual:
            raise BundleError(f"bundle {where}: its {graph} graph has no tensor {name!r} (it has "
                              f"{', '.join(sorted(actual))}); the manifest does not describe this graph: re-export the bundle")
        got = actual[name]
        fixed = [(a, b) for a, b in zip(want, got) if isinstance(a, int) and isinstance(b, int)]
        if len(got) != len(want) or any(a != b for a, b in fixed):
            raise BundleError(f"bundle {where}: its {graph} graph's {name} is {got}, the manifest says {want}: the "
                              "manifest does not describe this graph; re-export the bundle with masc-export")
