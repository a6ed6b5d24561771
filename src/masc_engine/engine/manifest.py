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
