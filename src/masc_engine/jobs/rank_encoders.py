"""Image encoders and similarities of the FP-Rank job (``masc-rank``).

Similarity:
- ``global``: the engine's pooling head run on *all* patches (an all-False key_padding_mask) gives
  one embedding per image; similarity is their cosine. With an encoder manifest, the manifest's
  embedding is used instead.
- ``maxcos``: CP's masked max-cosine between patch tokens: for each query patch (only those under
  the query's foreground mask when the query has one; all patches otherwise), the max cosine to
  any patch of the gallery image; the mean over the query patches. Gallery images use all their
  patches, as CP uses all output patches. Needs a bundle (patch tokens).

Pluggable encoder manifest:
Any image encoder exported to ONNX (a re-identification or species model) can replace SigLIP2 for
``global`` similarity through a small JSON manifest (paths relative to the manifest's folder)::

    {
      "format": "masc-rank-encoder/1",          (optional; this version if given)
      "name": "my-reid-model",                  (optional label)
      "onnx": "reid.onnx",                      ONNX file
      "input": "images",                        input name: float32 [B, 3, H, W] (or [B, H, W, 3])
      "input_size": [256, 128],                 [H, W] fed to the model
      "mean": [0.485, 0.456, 0.406],            per channel, applied after pixel / pixel_scale
      "std": [0.229, 0.224, 0.225],
      "resize": "stretch",                      stretch | center_crop | letterbox
      "output": "embedding",                    output name
      "output_kind": "embedding",               the only kind: [B, D] (cosine is taken, no
                                                normalisation needed inside the model)
      "layout": "NCHW",                         (optional) NCHW (default) | NHWC
      "interpolation": "bilinear",              (optional) bilinear (default) | bicubic | nearest
      "pixel_scale": 255.0,                     (optional) RGB 0..255 divided by this (default 255)
      "sha256": "..."                           (optional) checked on load
    }

``stretch`` resizes to HxW ignoring the aspect ratio; ``center_crop`` resizes the shorter side to
cover HxW and crops the centre; ``letterbox`` fits the image inside HxW and pads with the mean
colour (0 after normalisation). Images are converted to RGB first (Pillow resize, then float32
``(x / pixel_scale - mean) / std``). A graph with a fixed batch dimension is run that many images
at a time. It runs on ONNX Runtime through :class:`~masc_engine.engine.backends.onnxruntime.OrtRunner`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine.manifest import MAX_IMAGE_SIDE
from ..errors import MascEngineError
from ..runtime import heads
from ..runtime.blas import single_thread_blas


class EncoderManifestError(MascEngineError):
    """An encoder manifest (or its ONNX graph) is unusable."""


def cosine_scores(query: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    """Cosine of one ``[D]`` embedding to each of ``[G, D]`` (float32, ``F.normalize`` eps).

    Computed row by row (an elementwise product summed along D), so a pair's score does not
    depend on the other gallery rows (a matrix product may change the last bits with the shape).
    """
    q = heads.l2_normalize(np.asarray(query, np.float32)[None])[0]
    g = heads.l2_normalize(np.asarray(gallery, np.float32))
    return (g * q[None]).sum(axis=1, dtype=np.float32)


#: Upper bound on the ``[N_query, M_chunk]`` cosine block of :func:`maxcos_scores` (floats).
MAXCOS_BLOCK = 1 << 24


def maxcos_scores(
    query_tokens: np.ndarray, gallery_tokens: Sequence[np.ndarray], query_keep: np.ndarray | None = None
) -> np.ndarray:
    """CP's masked max-cosine of one query against each gallery image.

    Args:
        query_tokens: ``[N, D]`` query patch tokens.
        gallery_tokens: per gallery image ``[M_g, D]`` patch tokens (``M_g >= 1``).
        query_keep: ``[N]`` bool, the query patches to use (its foreground); None = all.

    Returns:
        ``[G] float32``: for each gallery image, the mean over kept query patches of the max
        cosine to any of its patches (equals ``heads.masked_maxcos`` up to float32 rounding).

    Raises:
        ValueError: no query patch is kept.
    """
    q = np.asarray(query_tokens, np.float32)
    if query_keep is not None:
        q = q[np.asarray(query_keep, bool)]
    if q.shape[0] == 0:
        raise ValueError("no query patch is kept")
    qn = heads.l2_normalize(q)
    out = np.empty(len(gallery_tokens), np.float32)
    per_chunk = max(1, MAXCOS_BLOCK // max(1, qn.shape[0]))
    start = 0
    while start < len(gallery_tokens):
        stop, m = start, 0
        while stop < len(gallery_tokens) and (stop == start or m + gallery_tokens[stop].shape[0] <= per_chunk):
            m += gallery_tokens[stop].shape[0]
            stop += 1
        gn = heads.l2_normalize(np.concatenate([np.asarray(t, np.float32) for t in gallery_tokens[start:stop]]))
        with single_thread_blas():  # bits independent of the BLAS thread count (runtime/blas.py)
            sims = qn @ gn.T  # [N, M]
        offsets = np.cumsum([0] + [gallery_tokens[i].shape[0] for i in range(start, stop - 1)])
        best = np.ascontiguousarray(np.maximum.reduceat(sims, offsets, axis=1).T)  # [chunk, N]
        out[start:stop] = np.mean(best, axis=1, dtype=np.float32)
        start = stop
    return out


class EngineEncoder:
    """The engine's SigLIP2 bundle as a rank encoder (patch tokens and the global embedding)."""

    name = "engine"
    supports_tokens = True

    def __init__(self, scorer):
        self.scorer = scorer
        self.fg_threshold = scorer.fg_threshold

    def encode(self, images: Sequence) -> list:
        """``[ImageEncoding]`` (patch tokens and grid) per image."""
        return self.scorer.encode_images(images)

    def global_embeddings(self, encs: Sequence) -> np.ndarray:
        """``[B, D]``: the pooling head on every patch (an all-False key_padding_mask)."""
        pooled, _ = self.scorer.pool_background(encs, [np.zeros(e.tokens.shape[0], bool) for e in encs])
        return pooled

    def embed(self, images: Sequence) -> np.ndarray:
        return self.global_embeddings(self.encode(images))


RESIZE_MODES = ("stretch", "center_crop", "letterbox")
LAYOUTS = ("NCHW", "NHWC")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
MANIFEST_FORMAT = "masc-rank-encoder/1"
MANIFEST_REQUIRED = ("onnx", "input", "input_size", "mean", "std", "resize", "output", "output_kind")


@dataclass(frozen=True)
class EncoderManifest:
    """A parsed encoder manifest (format: module docstring)."""

    onnx: Path
    input: str
    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    resize: str
    output: str
    output_kind: str = "embedding"
    layout: str = "NCHW"
    interpolation: str = "bilinear"
    pixel_scale: float = 255.0
    name: str = ""
    sha256: str | None = None


def _input_size(v, bad) -> tuple[int, int]:
    """``input_size`` as ``(H, W)``: two integers in 1..:data:`MAX_IMAGE_SIDE` (a bundle's image
    side bound), else ``bad(message)`` raised (one line, the value cut short)."""
    if (
        not isinstance(v, list)
        or len(v) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_IMAGE_SIDE for x in v)
    ):
        raise bad(f"input_size must be [H, W], integers 1..{MAX_IMAGE_SIDE}, got {str(v)[:60]}")
    return int(v[0]), int(v[1])


def load_encoder_manifest(path: str | Path) -> EncoderManifest:
    """Read and check an encoder manifest; the ONNX path is resolved against its folder.

    Raises:
        EncoderManifestError: missing file, bad JSON, a missing or invalid key (named; an
            ``input_size`` side outside 1..8192 included).
    """
    path = Path(path)
    if not path.is_file():
        raise EncoderManifestError(f"encoder manifest {path} does not exist")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EncoderManifestError(f"encoder manifest {path}: not valid JSON ({e})") from e
    if not isinstance(d, dict):
        raise EncoderManifestError(f"encoder manifest {path}: expected a JSON object")
    bad = lambda msg: EncoderManifestError(f"encoder manifest {path}: {msg}")  # noqa: E731
    if d.get("format", MANIFEST_FORMAT) != MANIFEST_FORMAT:
        raise bad(f"format {d.get('format')!r} is not {MANIFEST_FORMAT!r}")
    missing = [k for k in MANIFEST_REQUIRED if k not in d]
    if missing:
        raise bad(f"missing key(s) {', '.join(missing)}; required: {', '.join(MANIFEST_REQUIRED)}")
    size = _input_size(d["input_size"], bad)
    try:
        mean = tuple(float(v) for v in d["mean"])
        std = tuple(float(v) for v in d["std"])
        pixel_scale = float(d.get("pixel_scale", 255.0))
    except (TypeError, ValueError) as e:
        raise bad(f"mean, std and pixel_scale must be numbers ({e})") from e
    if len(mean) != 3 or len(std) != 3 or min(abs(s) for s in std) == 0 or pixel_scale <= 0:
        raise bad("mean and std must have 3 values (RGB), std non-zero; pixel_scale > 0")
    checks = (
        ("resize", RESIZE_MODES),
        ("layout", LAYOUTS),
        ("interpolation", INTERPOLATIONS),
        ("output_kind", ("embedding",)),
    )
    defaults = {"layout": "NCHW", "interpolation": "bilinear"}
    for key, allowed in checks:
        v = d.get(key, defaults.get(key))
        if v not in allowed:
            raise bad(f"{key} must be one of {', '.join(allowed)}, got {v!r}")
    onnx_path = Path(d["onnx"])
    if not onnx_path.is_absolute():
        onnx_path = path.resolve().parent / onnx_path
    if not onnx_path.is_file():
        raise bad(f"ONNX file {onnx_path} does not exist")
    return EncoderManifest(
        onnx=onnx_path,
        input=str(d["input"]),
        input_size=size,
        mean=mean,
        std=std,
        resize=d["resize"],
        output=str(d["output"]),
        output_kind=d["output_kind"],
        layout=d.get("layout", "NCHW"),
        interpolation=d.get("interpolation", "bilinear"),
        pixel_scale=pixel_scale,
        name=str(d.get("name", "")),
        sha256=d.get("sha256"),
    )


def manifest_preprocess(image, m: EncoderManifest) -> np.ndarray:
    """One PIL image -> ``[3, H, W]`` (NCHW) or ``[H, W, 3]`` (NHWC) float32 as the manifest says."""
    from PIL import Image

    resample = {
        "bilinear": Image.Resampling.BILINEAR,
        "bicubic": Image.Resampling.BICUBIC,
        "nearest": Image.Resampling.NEAREST,
    }[m.interpolation]
    im = image.convert("RGB")
    h, w = m.input_size
    mean = np.asarray(m.mean, np.float32)
    std = np.asarray(m.std, np.float32)
    if m.resize == "stretch":
        arr = np.asarray(im.resize((w, h), resample), np.float32)
        x = (arr / np.float32(m.pixel_scale) - mean) / std
    elif m.resize == "center_crop":
        scale = max(h / im.height, w / im.width)
        nw, nh = max(w, round(im.width * scale)), max(h, round(im.height * scale))
        left, top = (nw - w) // 2, (nh - h) // 2
        arr = np.asarray(im.resize((nw, nh), resample).crop((left, top, left + w, top + h)), np.float32)
        x = (arr / np.float32(m.pixel_scale) - mean) / std
    else:  # letterbox: fit inside, pad with the mean colour (0 after normalisation)
        scale = min(h / im.height, w / im.width)
        nw, nh = min(w, max(1, round(im.width * scale))), min(h, max(1, round(im.height * scale)))
        arr = np.asarray(im.resize((nw, nh), resample), np.float32)
        x = np.zeros((h, w, 3), np.float32)
        top, left = (h - nh) // 2, (w - nw) // 2
        x[top : top + nh, left : left + nw] = (arr / np.float32(m.pixel_scale) - mean) / std
    x = x.astype(np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1) if m.layout == "NCHW" else x)


class OnnxEmbeddingEncoder:
    """A user's ONNX image encoder (``[B, D]`` embeddings) described by an encoder manifest.

    Raises (on construction):
        EncoderManifestError: bad manifest, sha256 mismatch, or the graph's input/output do not
            match it (name, rank, dtype, fixed size).
        BackendUnavailableError: the provider is missing.
    """

    supports_tokens = False

    def __init__(
        self,
        manifest: str | Path | EncoderManifest,
        provider: str = "cpu",
        intra_op_threads: int | None = None,
        batch_size: int = 8,
    ):
        from ..engine.backends.onnxruntime import OrtRunner

        self.manifest = manifest if isinstance(manifest, EncoderManifest) else load_encoder_manifest(manifest)
        m = self.manifest
        if m.sha256:
            digest = hashlib.sha256(m.onnx.read_bytes()).hexdigest()
            if digest != m.sha256.lower():
                raise EncoderManifestError(f"{m.onnx}: sha256 {digest} differs from the manifest's {m.sha256}")
        try:
            self.runner = OrtRunner(
                str(m.onnx), m.name or m.onnx.stem, provider=provider, intra_op_threads=intra_op_threads
            )
        except MascEngineError:
            raise
        except Exception as e:  # onnxruntime's own load errors (bad file, unsupported op)
            raise EncoderManifestError(f"{m.onnx}: onnxruntime cannot load it ({e})") from e
        self.name = m.name or m.onnx.stem
        inputs = {i.name: i for i in self.runner.session.get_inputs()}
        outputs = {o.name for o in self.runner.session.get_outputs()}
        if m.input not in inputs or len(inputs) != 1:
            raise EncoderManifestError(f"{m.onnx}: expected one input named {m.input!r}, graph has {', '.join(inputs)}")
        if m.output not in outputs:
            raise EncoderManifestError(f"{m.onnx}: no output named {m.output!r}; graph has {', '.join(outputs)}")
        spec = inputs[m.input]
        if spec.type != "tensor(float)" or len(spec.shape) != 4:
            raise EncoderManifestError(
                f"{m.onnx}: input {m.input!r} must be a 4-D float32 tensor, is {spec.type} {spec.shape}"
            )
        h, w = m.input_size
        want = (3, h, w) if m.layout == "NCHW" else (h, w, 3)
        for got, exp in zip(spec.shape[1:], want):
            if isinstance(got, int) and got != exp:
                raise EncoderManifestError(
                    f"{m.onnx}: input shape {spec.shape} does not fit input_size "
                    f"{list(m.input_size)} with layout {m.layout}"
                )
        self.batch_size = (
            spec.shape[0] if isinstance(spec.shape[0], int) and spec.shape[0] > 0 else max(1, int(batch_size))
        )

    def embed(self, images: Sequence) -> np.ndarray:
        """``[B, D] float32`` embeddings of PIL images."""
        out = []
        for start in range(0, len(images), self.batch_size):
            x = np.stack([manifest_preprocess(im, self.manifest) for im in images[start : start + self.batch_size]])
            res = self.runner.session.run([self.manifest.output], {self.manifest.input: x})[0]
            if res.ndim != 2 or res.shape[0] != x.shape[0]:
                raise EncoderManifestError(
                    f"{self.manifest.onnx}: output {self.manifest.output!r} has shape "
                    f"{res.shape}; output_kind 'embedding' needs [B, D]"
                )
            out.append(np.asarray(res, np.float32))
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)
