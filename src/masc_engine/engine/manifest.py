"""The bundle manifest: the single source of truth for the runtime.

``manifest.json`` holds everything the runtime needs (graph files and their I/O, image and text
settings, scoring thresholds), each file's sha256, the source model id and revision, and the
library versions used to export it. The runtime never guesses a setting from a model name.
"""

from __future__ import annotations

import hashlib
import json
import re
import math
import os
import posixpath
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..errors import BundleError

MANIFEST_NAME = "manifest.json"

#: ``manifest["precision"]["mode"]`` of a bundle certified for bf16 on OpenVINO's CPU plugin
#: (export/cpu_precision.py writes it; its graphs are the fp32 export's, unchanged).
BF16_CPU_MODE = "bf16-cpu"
#: Largest manifest read, bytes (masc-export writes a few KiB).
MAX_MANIFEST_BYTES = 16 * 2**20
FORMAT = "masc-bundle"
FORMAT_VERSION = 1


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(bundle_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` after recording the sha256 of every file it lists in ``files``."""
    bundle_dir = Path(bundle_dir)
    manifest = dict(manifest)
    manifest["format"] = FORMAT
    manifest["format_version"] = FORMAT_VERSION
    manifest["files"] = {name: sha256_file(bundle_dir / name) for name in sorted(manifest["files"])}
    path = bundle_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return path


def read_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    """Read and check the format of ``manifest.json``.

    Raises:
        BundleError: missing directory or manifest, over :data:`MAX_MANIFEST_BYTES`, unreadable
            JSON, another format or version.
    """
    bundle_dir = Path(bundle_dir)
    path = bundle_dir / MANIFEST_NAME
    if not bundle_dir.is_dir():
        raise BundleError(f"bundle directory {bundle_dir} does not exist (make one with masc-export)")
    if not path.is_file():
        raise BundleError(f"{bundle_dir} has no {MANIFEST_NAME}; is it a masc-export bundle?")
    try:
        manifest = json.loads(_read_capped(path).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise BundleError(f"{path}: not valid JSON ({one_line(e)})") from None
    except OSError as e:
        raise BundleError(f"{path}: cannot be read ({e.strerror or e})") from None
    if not isinstance(manifest, dict):
        raise BundleError(f"{path}: not a masc-bundle manifest (a JSON {type(manifest).__name__}, not an object)")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{path}: format {manifest.get('format')!r} v{manifest.get('format_version')!r}; "
            f"this masc-engine reads {FORMAT!r} v{FORMAT_VERSION}. Re-export the bundle."
        )
    return manifest


def _read_capped(path: Path) -> bytes:
    """The manifest's bytes, its size checked before any is read (a huge or sparse file costs one
    ``stat``, not its size in memory)."""
    size = path.stat().st_size
    raw = b""
    if size <= MAX_MANIFEST_BYTES:
        with open(path, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)  # a file growing meanwhile is still capped
    if max(size, len(raw)) > MAX_MANIFEST_BYTES:
        raise BundleError(
            f"{path}: {max(size, len(raw)):,} bytes, over {MAX_MANIFEST_BYTES >> 20} MiB: not a "
            "masc-bundle manifest (masc-export writes a few KiB)"
        )
    return raw


def one_line(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line (whitespace runs, newlines included, become one space)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verify_files(bundle_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Check every listed file exists and matches its sha256.

    Raises:
        BundleError: naming the first missing or modified file.
    """
    bundle_dir = Path(bundle_dir)
    for name, digest in manifest["files"].items():
        p = confined(bundle_dir, name, "manifest files")
        if not p.is_file():
            raise BundleError(f"bundle {bundle_dir}: file {name} listed in the manifest is missing")
        try:
            actual = sha256_file(p)
        except OSError as e:
            raise BundleError(f"bundle {bundle_dir}: {name} cannot be read ({e.strerror or e})") from None
        if actual != digest:
            raise BundleError(f"bundle {bundle_dir}: {name} sha256 {actual[:12]}... != manifest {digest[:12]}...")


def fingerprint(manifest: dict[str, Any]) -> str:
    """A short content fingerprint of a bundle: sha256 over the manifest's file digests and
    settings (what makes cached tokens and resumed results reusable), a bf16-cpu certificate's
    plan (export/cpu_precision.py) and an embedder bundle's recipe and embedding rule."""
    keyed: dict[str, Any] = {k: manifest[k] for k in ("files", "image", "text", "scoring") if k in manifest}
    cert = manifest.get("precision") or {}
    if cert.get("mode") == BF16_CPU_MODE:  # the certified plan changes bf16 tokens: re-certifying is a new bundle
        keyed["bf16_cpu"] = {k: cert.get(k) for k in ("graphs", "keep_fp32", "openvino")}
    if manifest.get("kind") == "embedder":  # its preprocessing and pooling rule are data, not files
        keyed["embedder"] = {k: manifest.get(k) for k in ("recipe", "embedding")}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


def _dims(manifest: dict[str, Any], graph: str, tensor: str) -> list[Any] | None:
    """The declared shape of a graph's input or output, or None when the manifest lacks it."""
    entry = (manifest.get("graphs") or {}).get(graph) or {}
    for t in (entry.get("inputs") or []) + (entry.get("outputs") or []):
        if t.get("name") == tensor:
            return list(t.get("shape") or [])
    return None


def check_consistency(manifest: dict[str, Any], where: str) -> None:
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
        checks += [
            ("image.image_size", image["image_size"], ("vision", "pixel_values", -2), int(h)),
            ("image.image_size", image["image_size"], ("vision", "pixel_values", -1), int(w)),
        ]
    if arch.get("vision_width"):
        d = int(arch["vision_width"])
        checks += [
            ("architecture.vision_width", d, (g, t, -1), d)
            for g, t in (
                ("vision", "last_hidden_state"),
                ("pool", "hidden"),
                ("cp", "ref_tokens"),
                ("cp", "out_tokens"),
            )
        ]
    if arch.get("text_projection"):
        q = int(arch["text_projection"])
        checks += [
            ("architecture.text_projection", q, (g, t, -1), q) for g, t in (("text", "text_embeds"), ("pool", "pooled"))
        ]
    if text.get("max_length"):
        n = int(text["max_length"])
        checks.append(("text.max_length", n, ("text", "input_ids", -1), n))
    for setting, value, (graph, tensor, axis), want in checks:
        shape = _dims(manifest, graph, tensor)
        if shape is None or len(shape) < -axis or not isinstance(shape[axis], int):
            continue
        if shape[axis] != want:
            raise BundleError(
                f"bundle {where}: manifest {setting} is {value}, but its {graph} graph's {tensor} has "
                f"{shape[axis]} where that needs {want}: the manifest does not describe these graphs; "
                "re-export the bundle with masc-export"
            )


def check_graph_io(
    declared: dict[str, Any],
    actual_inputs: Iterable[tuple[str, Sequence[Any]]],
    actual_outputs: Iterable[tuple[str, Sequence[Any]]],
    graph: str,
    where: str,
) -> None:
    """Check a loaded graph's inputs and outputs against the manifest's entry for it: each
    declared tensor exists, with as many axes and equal fixed dimensions.

    Args:
        declared: ``manifest["graphs"][graph]``.
        actual_inputs: ``(name, shape)`` pairs of the loaded graph's inputs (ONNX Runtime's
            ``session.get_inputs()``; a symbolic axis is a string or None).
        actual_outputs: the same for its outputs.
        graph: the graph's name (for messages).
        where: the bundle (for messages).

    Raises:
        BundleError: naming the graph, the tensor and both shapes.
    """
    actual = {name: list(shape) for name, shape in [*actual_inputs, *actual_outputs]}
    for t in (declared.get("inputs") or []) + (declared.get("outputs") or []):
        name, want = t.get("name"), list(t.get("shape") or [])
        if name not in actual:
            raise BundleError(
                f"bundle {where}: its {graph} graph has no tensor {name!r} (it has "
                f"{', '.join(sorted(actual))}); the manifest does not describe this graph: re-export the bundle"
            )
        got = actual[name]
        fixed = [(a, b) for a, b in zip(want, got) if isinstance(a, int) and isinstance(b, int)]
        if len(got) != len(want) or any(a != b for a, b in fixed):
            raise BundleError(
                f"bundle {where}: its {graph} graph's {name} is {got}, the manifest says {want}: the "
                "manifest does not describe this graph; re-export the bundle with masc-export"
            )


# --------------------------------------------------------------------------- confinement


def _refuse_name(bundle_dir: str | Path, field: str, name: object, why: str) -> NoReturn:
    shown = repr(name) if len(repr(name)) <= 120 else repr(name)[:117] + "..."
    raise BundleError(
        f"bundle {bundle_dir}: {field} names {shown}, which {why}; a bundle reads only "
        "files inside its own folder (re-export it with masc-export)"
    )


def confined(bundle_dir: str | Path, name: object, field: str) -> Path:
    """The path of a file a manifest names, checked to lie inside the bundle folder.

    ``name`` must be a relative name with ``/`` between folders (no ``..``, ``.`` or empty part,
    no backslash, drive, NUL or control character), and its real path (symlinks followed,
    ``os.path.realpath``) must stay inside the bundle folder's real path.

    Args:
        bundle_dir: the bundle folder.
        name: the name as the manifest (or a graph's external data) gives it.
        field: where the name comes from (``manifest graphs.vision.file``), for the message.

    Returns:
        ``bundle_dir / name`` (not resolved: the caller opens the checked name).

    Raises:
        BundleError: one line naming the bundle, the field and the name.
    """
    if not isinstance(name, str) or not name:
        _refuse_name(bundle_dir, field, name, "is not a file name")
    if len(name) > 1024 or any(ord(c) < 32 or c in "\\:" for c in name):
        _refuse_name(bundle_dir, field, name, "is not a plain file name (control character, backslash or colon)")
    if posixpath.isabs(name) or os.path.isabs(name):
        _refuse_name(bundle_dir, field, name, "is an absolute path")
    if any(part in ("", ".", "..") for part in name.split("/")):
        _refuse_name(bundle_dir, field, name, "has an empty, '.' or '..' part")
    root = os.path.realpath(bundle_dir)
    real = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, real]) != root or real == root:
        _refuse_name(bundle_dir, field, name, "is a symlink leading out of the bundle folder")
    return Path(bundle_dir) / name


def named_files(manifest: dict[str, Any]) -> list[tuple[str, object]]:
    """``(field, name)`` of every file a manifest names: ``files``, each graph's ``file`` and
    ``external_data`` (its variants' too) and ``text.tokenizer_file``.

    Raises:
        BundleError: a section that should be a table or list is not.
    """
    out: list[tuple[str, object]] = []
    for g, entry in _table(manifest, "graphs", "").items():
        entries = [(f"graphs.{g}", _table({g: entry}, g, "graphs."))]
        for v, ve in _table(entries[0][1], "variants", f"graphs.{g}.", optional=True).items():
            entries.append((f"graphs.{g}.variants.{v}", _table({v: ve}, v, f"graphs.{g}.variants.")))
        for where, e in entries:
            out.append((f"{where}.file", e.get("file")))
            data = e.get("external_data") or []
            if not isinstance(data, list):
                raise BundleError(f"manifest {where}.external_data is not a list of file names")
            out += [(f"{where}.external_data", d) for d in data]
    text = manifest.get("text")
    if isinstance(text, dict) and "tokenizer_file" in text:
        out.append(("text.tokenizer_file", text["tokenizer_file"]))
    return out + [("files", n) for n in _table(manifest, "files", "")]


def _table(d: dict[str, Any], key: str, prefix: str, optional: bool = False) -> dict[str, Any]:
    value = d.get(key)
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise BundleError(f"manifest {prefix}{key} is {type(value).__name__}, not a table; re-export the bundle")
    return value


def check_confined(bundle_dir: str | Path, manifest: dict[str, Any]) -> None:
    """Check that every file the manifest names (:func:`named_files`) lies inside the bundle
    folder (:func:`confined`); a graph's external data, named inside the graph, is checked when
    the graph is first used (engine/bundle.py).

    Raises:
        BundleError: the first name that leaves the folder, with its field.
    """
    try:
        names = named_files(manifest)
    except BundleError as e:
        raise BundleError(f"bundle {bundle_dir}: {e}") from None
    for field, name in names:
        confined(bundle_dir, name, f"manifest {field}")


# --------------------------------------------------------------------------- numbers

#: Largest ``image.patch_size`` accepted (SigLIP2 and CLIPSeg use 16; ViTs 14 to 32).
MAX_PATCH_SIZE = 256
#: Largest ``image.max_num_patches`` (NaFlex patch budget) accepted: 16 times the paper's 1,024;
#: one image's pixel values are then 16,384 x 768 float32 = 48 MiB at patch size 16.
MAX_NUM_PATCHES = 16384
#: Largest ``image.image_size`` side and ``image.position_grid`` side accepted.
MAX_IMAGE_SIDE = 8192
MAX_POSITION_GRID = 1024
#: Largest ``text.max_length`` accepted (SigLIP2: 64, CLIP: 77).
MAX_TEXT_LENGTH = 4096
#: Largest width (``architecture.*``) and fixed dimension of a declared graph tensor accepted.
MAX_WIDTH = 1 << 16
MAX_DIM = 1 << 20
#: Most axes a declared graph tensor may have.
MAX_RANK = 8


def _int_in(where: object, field: str, value: object, lo: int, hi: int, required: bool = True) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BundleError(
            f"bundle {where}: manifest {field} is {_shown(value)}; it must be an integer from {lo} "
            f"to {hi} (re-export the bundle with masc-export)"
        )


def _number_in(where: object, field: str, value: object, lo: float, hi: float, open_lo: bool = False) -> None:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and (lo < value if open_lo else lo <= value)
        and value <= hi
    )
    if not ok:
        raise BundleError(
            f"bundle {where}: manifest {field} is {_shown(value)}; it must be a finite number "
            f"{'above' if open_lo else 'from'} {lo} {'up ' if open_lo else ''}to {hi} "
            "(re-export the bundle with masc-export)"
        )


def _choice(where: object, field: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise BundleError(
            f"bundle {where}: manifest {field} is {_shown(value)}; it must be one of "
            f"{', '.join(map(repr, allowed))} (re-export the bundle with masc-export)"
        )


def _shown(value: object) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


#: Pillow filter names a manifest's ``image.resample`` may name (runtime/preprocess.py maps them to
#: Pillow's constants; the names are those masc-export writes from a processor's ``resample``).
RESAMPLE_NAMES = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
#: Element types a declared graph tensor may have (numpy names, as export/graphs.py writes them;
#: the TensorRT memory plan sizes buffers from them).
TENSOR_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool", "uint8", "int8")


def _check_image(image: dict[str, Any], where: object) -> None:
    _choice(where, "image.mode", image.get("mode"), ("naflex", "fixed"))
    _choice(where, "image.resample", image.get("resample"), RESAMPLE_NAMES)
    _int_in(where, "image.patch_size", image.get("patch_size"), 1, MAX_PATCH_SIZE)
    _int_in(where, "image.max_num_patches", image.get("max_num_patches"), 1, MAX_NUM_PATCHES)
    _int_in(where, "image.position_grid", image.get("position_grid"), 1, MAX_POSITION_GRID, required=False)
    size = image.get("image_size")
    if image.get("mode") == "fixed" or size is not None:
        if not isinstance(size, list) or len(size) != 2:
            raise BundleError(
                f"bundle {where}: manifest image.image_size is {_shown(size)}; it must be [height, "
                "width] (re-export the bundle with masc-export)"
            )
        for side in size:
            _int_in(where, "image.image_size", side, 1, MAX_IMAGE_SIDE)
    _number_in(where, "image.rescale_factor", image.get("rescale_factor"), 0, 1e6, open_lo=True)
    for key, lo in (("image_mean", -1e6), ("image_std", 0)):
        values = image.get(key)
        if not isinstance(values, list) or len(values) != 3:
            raise BundleError(
                f"bundle {where}: manifest image.{key} is {_shown(values)}; it must be 3 numbers, one "
                "a channel (re-export the bundle with masc-export)"
            )
        for v in values:
            _number_in(where, f"image.{key}", v, lo, 1e6, open_lo=key == "image_std")


def _check_text(text: dict[str, Any], where: object) -> None:
    _int_in(where, "text.max_length", text.get("max_length"), 1, MAX_TEXT_LENGTH)
    _int_in(where, "text.pad_token_id", text.get("pad_token_id"), 0, 2**31 - 1)
    _int_in(where, "text.vocab_size", text.get("vocab_size"), 1, 2**31 - 1, required=False)
    for key in ("padding_side", "truncation_side"):
        _choice(where, f"text.{key}", text.get(key), ("left", "right"))


def _check_shapes(graphs: dict[str, Any], where: object) -> None:
    for g, entry in graphs.items():
        for t in (entry.get("inputs") or []) + (entry.get("outputs") or []):
            field = f"graphs.{g}.{t.get('name') if isinstance(t, dict) else '?'}.shape"
            shape = t.get("shape") if isinstance(t, dict) else None
            if isinstance(t, dict) and t.get("dtype") is not None:  # a declared element type is a known one
                _choice(where, field[: -len(".shape")] + ".dtype", t["dtype"], TENSOR_DTYPES)
            if not isinstance(shape, list) or len(shape) > MAX_RANK:
                raise BundleError(
                    f"bundle {where}: manifest {field} is {_shown(shape)}; it must be a list of at "
                    f"most {MAX_RANK} axes (re-export the bundle with masc-export)"
                )
            for d in shape:
                if d is not None and not isinstance(d, str):
                    _int_in(where, field, d, 1, MAX_DIM)


def check_ranges(manifest: dict[str, Any], where: str) -> None:
    """Check the manifest's numbers and choices before anything is sized from them, so that a
    bad value is refused at load in one line (not a ``MemoryError`` or ``ZeroDivisionError`` at
    the first image).

    Checked (when the section is present): ``image`` (mode; ``patch_size`` 1 to
    :data:`MAX_PATCH_SIZE`; ``max_num_patches`` 1 to :data:`MAX_NUM_PATCHES`; ``position_grid``;
    ``image_size`` sides 1 to :data:`MAX_IMAGE_SIDE`; ``resample`` one of :data:`RESAMPLE_NAMES`;
    ``rescale_factor`` > 0; 3 finite
    ``image_mean`` and positive ``image_std`` values), ``text`` (``max_length`` 1 to
    :data:`MAX_TEXT_LENGTH`, ``pad_token_id``, padding and truncation sides), ``architecture``
    widths (1 to :data:`MAX_WIDTH`), ``scoring.fg_threshold`` and ``recipe.threshold`` (0 to 1),
    and every declared graph tensor (its ``dtype``, where declared, one of :data:`TENSOR_DTYPES`;
    each fixed dimension 1 to :data:`MAX_DIM`).

    Raises:
        BundleError: naming the bundle, the field, its value and the accepted range.
    """
    _check_structure(manifest, where)
    if "image" in manifest:
        _check_image(manifest["image"], where)
    if "text" in manifest:
        _check_text(manifest["text"], where)
    for key, value in (manifest.get("architecture") or {}).items():
        if key in ("vision_width", "text_projection", "pool_heads", "vision_layers"):
            _int_in(where, f"architecture.{key}", value, 1, MAX_WIDTH, required=False)
    for section in ("scoring", "recipe"):
        if isinstance(manifest.get(section), dict) and manifest[section].get(_THRESHOLD[section]) is not None:
            key = _THRESHOLD[section]
            _number_in(where, f"{section}.{key}", manifest[section][key], 0, 1)
    _check_shapes(manifest.get("graphs") or {}, where)
    if manifest.get("kind") == "embedder":
        check_embedder(manifest, where)


_THRESHOLD = {"scoring": "fg_threshold", "recipe": "threshold"}

#: The tables a manifest holds when present, and those each bundle kind cannot load without
#: (export/exporter.py and export/segmenter.py write them; an embedder's are checked by
#: :func:`check_embedder`).
TABLES = ("image", "text", "architecture", "scoring", "recipe", "source", "precision", "variants", "validation")
REQUIRED_TABLES = {
    "scorer": ("image", "text", "architecture", "scoring"),
    "segmenter": ("image", "text", "architecture", "recipe"),
}
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _check_structure(manifest: dict[str, Any], where: str) -> None:
    """Each section of the type the loaders read it as: the tables (:data:`TABLES`, those of
    :data:`REQUIRED_TABLES` present), ``files`` digests as sha256 hex, each graph's ``inputs`` /
    ``outputs`` a list of tables; one line naming the field, not a ``KeyError`` later."""
    kind = manifest.get("kind", "scorer")
    for key in TABLES:
        if (key in manifest or key in REQUIRED_TABLES.get(str(kind), ())) and not isinstance(manifest.get(key), dict):
            what = f"{key} is {_shown(manifest[key])}, not a table" if key in manifest else f"has no {key} table"
            raise BundleError(f"bundle {where}: manifest {what} (re-export the bundle with masc-export)")
    for name, digest in (manifest.get("files") or {}).items():
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise BundleError(
                f"bundle {where}: manifest files.{name} is {_shown(digest)}, not a sha256 digest "
                "(re-export the bundle with masc-export)"
            )
    for g, entry in (manifest.get("graphs") or {}).items():
        for side in ("inputs", "outputs"):
            tensors = entry.get(side, []) if isinstance(entry, dict) else None
            if not isinstance(tensors, list) or not all(isinstance(t, dict) for t in tensors):
                raise BundleError(
                    f"bundle {where}: manifest graphs.{g}.{side} is {_shown(tensors)}, not a list of tensor "
                    "tables (re-export the bundle with masc-export)"
                )


#: An embedder bundle's recipe choices and embedding rules (export/embedders.py ``RECIPE_FIELDS``).
EMBEDDER_RESIZE_MODES = ("shortest_edge", "fixed")
EMBEDDER_INTERPOLATIONS = ("bicubic", "bilinear")
EMBEDDER_CROP_ROUNDINGS = ("hf_floor", "torchvision_round")
EMBEDDER_IMAGE_RULES = ("clip_image_projection", "cls_final_norm", "cls_layernorm")
EMBEDDER_TEXT_RULES = ("clip_text_projection",)


def _embedder_table(manifest: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = manifest.get(key)
    if not isinstance(value, dict):
        raise BundleError(
            f"bundle {where}: an embedder manifest needs a {key} table, it has {_shown(value)} "
            "(re-export the bundle with masc-export)"
        )
    return value


def check_embedder(manifest: dict[str, Any], where: str) -> None:
    """Check the sections only an ``embedder`` bundle has (export/embedders.py ``RECIPE_FIELDS``).

    Required: ``recipe`` (``resize_mode``, ``size``, ``interpolation``, ``crop_size`` [h, w] or
    null, ``crop_rounding`` with a crop, ``rescale_factor`` > 0, 3 ``image_mean`` and 3 positive
    ``image_std`` values, ``exif_transpose`` bool, ``alpha`` ``composite_on_white``), ``embedding``
    (``image`` rule, ``text`` rule or null, ``dim``), ``source.model``, and the graphs the rules
    name (``image``; ``text`` with a text rule).

    Raises:
        BundleError: naming the bundle, the field, its value and what it must be.
    """
    recipe, emb = _embedder_table(manifest, "recipe", where), _embedder_table(manifest, "embedding", where)
    _choice(where, "recipe.resize_mode", recipe.get("resize_mode"), EMBEDDER_RESIZE_MODES)
    _int_in(where, "recipe.size", recipe.get("size"), 1, MAX_IMAGE_SIDE)
    _choice(where, "recipe.interpolation", recipe.get("interpolation"), EMBEDDER_INTERPOLATIONS)
    crop = recipe.get("crop_size")
    if crop is not None:
        if not isinstance(crop, list) or len(crop) != 2:
            raise BundleError(
                f"bundle {where}: manifest recipe.crop_size is {_shown(crop)}; it must be [height, "
                "width] or null (re-export the bundle with masc-export)"
            )
        for side in crop:
            _int_in(where, "recipe.crop_size", side, 1, MAX_IMAGE_SIDE)
        _choice(where, "recipe.crop_rounding", recipe.get("crop_rounding"), EMBEDDER_CROP_ROUNDINGS)
    _number_in(where, "recipe.rescale_factor", recipe.get("rescale_factor"), 0, 1e6, open_lo=True)
    for key, lo in (("image_mean", -1e6), ("image_std", 0)):
        values = recipe.get(key)
        if not isinstance(values, list) or len(values) != 3:
            raise BundleError(
                f"bundle {where}: manifest recipe.{key} is {_shown(values)}; it must be 3 numbers, "
                "one a channel (re-export the bundle with masc-export)"
            )
        for v in values:
            _number_in(where, f"recipe.{key}", v, lo, 1e6, open_lo=key == "image_std")
    _choice(where, "recipe.exif_transpose", recipe.get("exif_transpose"), (True, False))
    _choice(where, "recipe.alpha", recipe.get("alpha"), ("composite_on_white",))
    _choice(where, "embedding.image", emb.get("image"), EMBEDDER_IMAGE_RULES)
    _choice(where, "embedding.text", emb.get("text"), (None, *EMBEDDER_TEXT_RULES))
    _int_in(where, "embedding.dim", emb.get("dim"), 1, MAX_WIDTH)
    if not isinstance((manifest.get("source") or {}).get("model"), str):
        raise BundleError(f"bundle {where}: an embedder manifest needs source.model (re-export the bundle)")
    graphs = manifest.get("graphs") or {}
    for g in ("image",) + (("text",) if emb.get("text") else ()):
        if not isinstance(graphs.get(g), dict):
            raise BundleError(
                f"bundle {where}: embedder manifest has no {g} graph for its embedding rule "
                "(re-export the bundle with masc-export)"
            )
