"""Torch-free, text-prompted foreground masks: a CLIPSeg segmenter bundle run by the runtime.

A segmenter bundle (``masc-export --model CIDAS/clipseg-rd64-refined``, export/segmenter.py) holds
three graphs: ``vision`` (image -> activations of a few ViT layers), ``text`` (prompt ->
conditional embedding) and ``decoder`` (both -> ``[S, S]`` logits). :class:`Segmenter`, an
:class:`~masc_engine.runtime.encoder.Encoder`, runs them through the backend registry on the
backends it declares (:data:`SEGMENTER_BACKENDS`: ONNX Runtime), with the image side once per
image and the text side once per distinct prompt (an in-memory LRU).

The mask rule (:class:`MaskRecipe`; docs/segmenter.md gives the why of each step):

1. **Prompt**: ``prompt_template`` with ``{}`` replaced by the subject name, surrounding
   whitespace stripped (default template ``"{}"``: the subject name itself, as the MaSC paper
   prompts its segmenters with the subject name).
2. **Preprocessing** as the checkpoint's image processor says (manifest ``image``): Pillow resize
   of the RGB image to ``S x S`` (352 for CIDAS/clipseg-rd64-refined) with its filter (bilinear),
   rescale by 1/255 in float64 then float32, normalize with its mean and std
   (runtime/preprocess.py, the same code as fixed-size SigLIP bundles).
   **Tokenization** with the checkpoint's tokenizer, padded on the right to 77 tokens.
3. **Probability**: the sigmoid of the decoder's logits, float32, ``[S, S]``.
4. **Resize** of the probability map to the image's ``(height, width)`` by Pillow's bilinear
   filter on a 32-bit float image (``Image.resize(..., BILINEAR)`` on mode ``F``: pixel centres
   aligned, i.e. ``align_corners=False``; when the image is smaller than ``S`` Pillow widens the
   filter's support by the scale, an antialiased downscale).
5. **Threshold**: foreground where ``probability > threshold`` (float32 comparison; default 0.5,
   logit > 0, the decision boundary of the per-pixel binary cross-entropy CLIPSeg is trained with).

The mask is ``[H, W] uint8`` with 0 (background) and 255 (foreground), the format mask files have.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from ..engine.bundle import Bundle
from ..errors import InputError
from .masks import mask_coverage
from .encoder import LRU, Encoder, RunnerSettings, runner_property
from .text import EncodedPrompt

#: ``manifest["kind"]`` of a segmenter bundle (a scorer bundle has no ``kind``, or ``"scorer"``).
KIND = "segmenter"
#: Bumped whenever a fixed step of the recipe (sigmoid, resize filter, comparison) changes: part of
#: :meth:`MaskRecipe.identity`, so cached masks of an older rule are never reused.
RECIPE_VERSION = 1
#: Default threshold on the probability: 0.5 is logit 0, the Bayes decision boundary of the
#: per-pixel binary cross-entropy CLIPSeg's decoder is trained with (Lüddecke & Ecker 2022).
DEFAULT_THRESHOLD = 0.5
#: Default prompt: the subject name itself (the MaSC paper prompts its segmenters with it).
DEFAULT_PROMPT_TEMPLATE = "{}"
#: Budget of a prompt (template applied) in characters, checked before tokenizing; the token
#: budget is the text graph's length (77 tokens with the start and end tokens).
MAX_PROMPT_CHARS = 1000
#: The backends that run segmenter bundles (:attr:`Segmenter.BACKENDS`).
SEGMENTER_BACKENDS = ("onnxruntime",)
#: The fixed steps, as recorded in the manifest and in :meth:`MaskRecipe.identity`.
FIXED_STEPS = {
    "probability": "sigmoid of the decoder logits, float32, [S, S]",
    "resize": "Pillow Image.resize(BILINEAR) of the float32 probability map (mode F) to the image's (W, H)",
    "foreground": "probability > threshold (float32); mask uint8 0/255",
}


@dataclass(frozen=True)
class MaskRecipe:
    """The options of the mask rule (module docstring; docs/segmenter.md).

    Attributes:
        threshold: foreground where the resized probability is ``> threshold``; in ``(0, 1)``.
            ``--mask-threshold``.
        prompt_template: the text prompt, ``{}`` standing for the subject name (exactly one
            ``{}``, no other braces), e.g. ``"a photo of a {}"``. ``--mask-prompt-template``.

    Raises:
        ValueError / TypeError: on construction, an option out of range or of the wrong type.
    """

    threshold: float = DEFAULT_THRESHOLD
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float, np.floating, np.integer)):
            raise TypeError(f"mask threshold must be a number, got {type(t).__name__}")
        if not 0.0 < float(t) < 1.0:
            raise ValueError(f"mask threshold must be in (0, 1), got {t}")
        object.__setattr__(self, "threshold", float(t))
        tpl = self.prompt_template
        if not isinstance(tpl, str):
            raise TypeError(f"mask prompt template must be a str, got {type(tpl).__name__}")
        if tpl.count("{}") != 1 or tpl.replace("{}", "").count("{") or tpl.replace("{}", "").count("}"):
            raise ValueError(f"mask prompt template must hold exactly one '{{}}' and no other braces, got {tpl!r}")
        if len(tpl) > MAX_PROMPT_CHARS // 2:
            raise ValueError(f"mask prompt template is longer than {MAX_PROMPT_CHARS // 2} characters")

    def with_options(self, threshold: float | None = None, prompt_template: str | None = None) -> "MaskRecipe":
        """This recipe with the options that are given (not None) replaced."""
        changes: dict[str, Any] = {
            k: v for k, v in (("threshold", threshold), ("prompt_template", prompt_template)) if v is not None
        }
        return replace(self, **changes) if changes else self

    def prompt(self, subject_name: str) -> str:
        """The text prompt for ``subject_name``: the template applied, whitespace stripped.

        Raises:
            InputError: ``empty_prompt`` (no subject name: None, not a str, or only whitespace) or
                ``prompt_too_long`` (over :data:`MAX_PROMPT_CHARS` characters).
        """
        if not isinstance(subject_name, str) or not subject_name.strip():
            raise InputError("empty_prompt", f"no subject name to prompt the segmenter with ({subject_name!r})")
        text = self.prompt_template.replace("{}", subject_name.strip()).strip()
        if len(text) > MAX_PROMPT_CHARS:
            raise InputError(
                "prompt_too_long",
                f"segmenter prompt of {len(text)} characters (budget {MAX_PROMPT_CHARS}): {text[:60]!r}...",
            )
        return text

    def describe(self) -> dict[str, Any]:
        """Every parameter of the rule, the fixed steps included (JSON-serialisable)."""
        return {"version": RECIPE_VERSION, **asdict(self), **FIXED_STEPS}

    def identity(self) -> str:
        """A stable 16-hex-digit identity of the rule (cache keys): sha256 of :meth:`describe`."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:16]

    def to_manifest(self) -> dict[str, Any]:
        """The manifest's ``recipe`` section: :meth:`describe` plus the identity."""
        return {**self.describe(), "identity": self.identity()}

    @classmethod
    def from_manifest(cls, d: dict[str, Any]) -> "MaskRecipe":
        """The recipe a bundle was exported with (its defaults).

        Raises:
            InputError: not a recipe this masc-engine implements (another ``version``).
        """
        if int(d.get("version", -1)) != RECIPE_VERSION:
            raise InputError(
                "unsupported_recipe",
                f"mask recipe version {d.get('version')!r}; this masc-engine "
                f"implements version {RECIPE_VERSION}. Re-export the segmenter.",
            )
        return cls(threshold=float(d["threshold"]), prompt_template=str(d["prompt_template"]))


# --------------------------------------------------------------------------- the pure rule


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Logistic sigmoid in float32, without overflow warnings for large ``|logits|``."""
    x = np.asarray(logits, np.float32)
    e = np.exp(-np.abs(x))
    prob: np.ndarray = np.where(x >= 0, np.float32(1) / (np.float32(1) + e), e / (np.float32(1) + e)).astype(np.float32)
    return prob


def probability_map(logits: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Step 3-4: ``[S, S]`` logits -> ``[H, W] float32`` probability at the image's size.

    Args:
        logits: ``[S, S]`` float32 decoder logits of one (image, prompt).
        size: the image's ``(width, height)`` (PIL ``Image.size``).
    """
    prob = Image.fromarray(sigmoid(logits))  # mode "F"
    if prob.size != tuple(size):
        prob = prob.resize((size[0], size[1]), resample=Image.Resampling.BILINEAR)
    return np.asarray(prob, dtype=np.float32)


def threshold_mask(probability: np.ndarray, threshold: float) -> np.ndarray:
    """Step 5: ``[H, W] uint8`` mask, 255 where ``probability > threshold`` (float32), else 0."""
    return np.where(np.asarray(probability, np.float32) > np.float32(threshold), 255, 0).astype(np.uint8)


def mask_from_logits(logits: np.ndarray, size: tuple[int, int], recipe: MaskRecipe) -> np.ndarray:
    """Steps 3-5 for one (image, prompt): ``[S, S]`` logits -> ``[H, W] uint8`` 0/255 mask."""
    return threshold_mask(probability_map(logits, size), recipe.threshold)


def mask_cache_key(
    image_digest: str, prompt: str, segmenter_fingerprint: str, recipe_identity: str, exif: str = "apply"
) -> str:
    """The content key of one computed mask (64 hex digits).

    Args:
        image_digest: sha256 of the image file's bytes (runtime/cache.py ``sha256_bytes``).
        prompt: the text prompt (:meth:`MaskRecipe.prompt`, template applied).
        segmenter_fingerprint: :attr:`Segmenter.fingerprint` (the bundle's files and settings).
        recipe_identity: :meth:`MaskRecipe.identity`.
        exif: the EXIF policy the image was read with (runtime/io.py): it decides the pixels.
    """
    key = json.dumps([image_digest, prompt, segmenter_fingerprint, recipe_identity, exif])
    return hashlib.sha256(key.encode()).hexdigest()


def save_mask_png(mask: np.ndarray, path: str | Path, overwrite: bool = False) -> Path:
    """Write a mask as an 8-bit greyscale PNG (0 / 255), atomically (temporary file, then rename).

    Read back with runtime/io.py ``load_mask`` it is the same array.

    Args:
        mask: ``[H, W]`` uint8 (0/255) or bool.
        path: the PNG file; parent folders are created.
        overwrite: replace an existing file (default: refuse).

    Raises:
        FileExistsError: ``path`` exists and ``overwrite`` is False.
        ValueError: not a 2-D uint8 or bool array.
    """
    arr = np.asarray(mask)
    if arr.ndim != 2 or arr.dtype not in (np.uint8, np.bool_) or arr.size == 0:
        raise ValueError(f"a mask is a non-empty [H, W] uint8 or bool array, got {arr.dtype} {arr.shape}")
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8) * 255
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        Image.fromarray(arr, "L").save(tmp, format="PNG")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class SegmenterMask:
    """One computed mask.

    Attributes:
        mask: ``[H, W] uint8``, 0 background / 255 foreground, the image's size.
        prompt: the text prompt it was computed for (template applied).
        coverage: foreground share of the mask's pixels, in ``[0, 1]``
            (runtime/masks.py ``mask_coverage``, the rule every mask's coverage is measured by).
    """

    mask: np.ndarray
    prompt: str
    coverage: float


@dataclass(frozen=True)
class SegmenterConfig:
    """How a :class:`Segmenter` is made: the one home of the segmenter's settings (frozen, picklable:
    Ray workers receive it and build their own segmenter; masc-run, masc-rank and masc-serve build
    it from one option group, cli/options.py ``segmenter_options``).

    A config of its own rather than fields of masc-run's ``RunSettings`` or of ``ScorerConfig``:
    the segmenter is a second bundle with its own backend, provider and recipe, used by the Python
    API, masc-serve and masc-rank as much as by masc-run; and ``RunSettings`` is hashed whole into
    masc-run's resume fingerprint, so a new field there would have invalidated every journal
    written before (a run with a segmenter adds :meth:`Segmenter.identity` to the fingerprint
    instead, and a run without one keeps its fingerprint).

    Attributes:
        bundle: the segmenter bundle's folder (``--segmenter``).
        threshold: the recipe's threshold (``--mask-threshold``); None: the bundle's recipe.
        prompt_template: the recipe's template (``--mask-prompt-template``); None: the bundle's.
        backend, provider, precision, intra_op_threads, batch_size: as :class:`Segmenter` takes
            them (``--segmenter-provider``; threads and batch size follow the scorer's options);
            ``provider=None`` is ``cpu``.

    Raises:
        ValueError / TypeError: on construction, a recipe option out of range or of the wrong type.
    """

    bundle: str
    threshold: float | None = None
    prompt_template: str | None = None
    backend: str = "onnxruntime"
    provider: str | None = None
    precision: str | None = None
    intra_op_threads: int | None = None
    batch_size: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "bundle", str(self.bundle))
        MaskRecipe().with_options(self.threshold, self.prompt_template)  # the recipe's own checks, now

    def load(self, verify: bool | str = True) -> "Segmenter":
        """The :class:`Segmenter` this config describes (its recipe: the bundle's, with the
        options given here replaced).

        Raises:
            BundleError, BackendUnavailableError: as :class:`Segmenter`.
        """
        bundle = Bundle(self.bundle, verify=verify, kind=KIND)
        recipe = MaskRecipe.from_manifest(bundle.manifest["recipe"]).with_options(self.threshold, self.prompt_template)
        return Segmenter(
            bundle,
            recipe=recipe,
            backend=self.backend,
            provider=self.provider or "cpu",
            precision=self.precision,
            intra_op_threads=self.intra_op_threads,
            batch_size=self.batch_size,
        )


class Segmenter(Encoder):
    """Masks from a segmenter bundle, by :class:`MaskRecipe`.

    An :class:`~masc_engine.runtime.encoder.Encoder` (runtime/encoder.py): the bundle, the
    preprocessing recipe, the lazily made runners (:attr:`vision`, :attr:`text`,
    :attr:`decoder`), ``close()`` and ``with`` are the base's.

    Args:
        bundle: a segmenter bundle directory (or a :class:`~masc_engine.engine.bundle.Bundle`
            loaded with ``kind="segmenter"``).
        recipe: the rule's options; default: the bundle's recorded recipe (``manifest["recipe"]``).
        backend, provider, precision, intra_op_threads: as for the scorer (engine/bundle.py
            ``Bundle.runner``); ``onnxruntime`` only (:attr:`BACKENDS`; provider ``cpu`` or
            ``cuda``), the provider explicit, never a quiet fallback to CPU.
        batch_size: images per vision call and (image, prompt) pairs per decoder call.
        text_cache_size: prompts whose embeddings are kept (LRU); each is ``P`` float32.
        verify: check file hashes before first use (engine/bundle.py).

    Attributes:
        fingerprint: the bundle's 16-hex-digit fingerprint (part of :func:`mask_cache_key`).
        images_encoded, texts_encoded, text_cache_hits: counters since construction.

    Raises:
        ValueError: ``batch_size`` is not an int >= 1.
        BundleError: not a segmenter bundle, or a missing file (a modified graph is refused
            when its session is made: on first use).
        BackendUnavailableError: the backend or provider is not available.

    Each graph's session is made on first use, so a run whose masks all come from a cache never
    loads the graphs (as the scorer's text session). Thread-safe: ONNX Runtime sessions are; the
    prompt cache and the runner table are locked.
    """

    KIND = KIND
    GRAPHS = ("vision", "text", "decoder")
    #: TensorRT engines are not built for segmenter bundles (the engine builder's device-memory
    #: plan, engine/backends/trt_profiles.py, models the scorer's graphs) and OpenVINO's bf16 plan
    #: is the scorer's: ONNX Runtime only.
    BACKENDS = SEGMENTER_BACKENDS
    BACKENDS_HINT = " (provider cpu or cuda)"

    vision = runner_property("vision")
    text = runner_property("text")
    decoder = runner_property("decoder")

    def __init__(
        self,
        bundle: str | Path | Bundle,
        *,
        recipe: MaskRecipe | None = None,
        backend: str = "onnxruntime",
        provider: str = "cpu",
        precision: str | None = None,
        intra_op_threads: int | None = None,
        batch_size: int = 8,
        text_cache_size: int = 4096,
        verify: bool = True,
    ):
        super().__init__(
            bundle, RunnerSettings(backend, provider, precision, intra_op_threads), batch_size=batch_size, verify=verify
        )
        m = self.bundle.manifest
        self.recipe = recipe if recipe is not None else MaskRecipe.from_manifest(m["recipe"])
        self.fingerprint = self.bundle.fingerprint
        #: The resolved :class:`SegmenterConfig` (the recipe's options filled in): what Ray workers receive.
        self.config = SegmenterConfig(
            str(Path(self.bundle.path).resolve()),
            self.recipe.threshold,
            self.recipe.prompt_template,
            backend,
            provider,
            precision,
            intra_op_threads,
            self.batch_size,
        )
        self.check_backend()  # a missing provider fails now, not at the first mask
        from ..engine.backends.onnxruntime import check_graph_precision

        check_graph_precision(self.bundle, provider, precision)
        self._texts = LRU(int(text_cache_size))
        self._lock = threading.Lock()
        self._text_run_lock = threading.Lock()
        self.images_encoded = self.texts_encoded = self.text_cache_hits = 0

    def prompt(self, subject_name: str) -> str:
        """The prompt for ``subject_name`` by this segmenter's recipe (:meth:`MaskRecipe.prompt`),
        its token count checked against the text graph's length; a job calls it per row to give
        each bad row its own status.

        Raises:
            InputError: ``empty_prompt`` or ``prompt_too_long`` (characters or tokens), before any
                graph runs.
        """
        text = self.recipe.prompt(subject_name)
        self._check_tokens(text, self.prompt_tokenizer.encode([text])[0])
        return text

    def _check_tokens(self, prompt: str, encoded: EncodedPrompt) -> None:
        if encoded.truncated:
            raise InputError(
                "prompt_too_long",
                f"segmenter prompt of {encoded.n_tokens} tokens "
                f"(budget {self.text_recipe.max_length}): {prompt[:60]!r}",
            )

    def cache_key(self, image_digest: str, subject_name: str, exif: str = "apply") -> str:
        """:func:`mask_cache_key` for an image (content hash) and subject name under this
        segmenter and recipe."""
        return mask_cache_key(image_digest, self.prompt(subject_name), self.fingerprint, self.recipe.identity(), exif)

    def identity(self) -> dict[str, Any]:
        """What decides this segmenter's masks, as plain JSON-able values: the base's (the bundle's
        fingerprint, backend, provider and the graphs' precision: float32 kernels differ in the last
        bits, which can move a pixel at the threshold) and the recipe (its identity and both
        options). masc-run's resume fingerprint and sidecar record it; a mask cached under other
        values is never reused."""
        base = super().identity()
        return {
            "fingerprint": base.pop("fingerprint"),
            "recipe": self.recipe.identity(),
            "threshold": self.recipe.threshold,
            "prompt_template": self.recipe.prompt_template,
            **base,
        }

    def option_identity(self) -> dict[str, Any]:
        """:meth:`identity` keyed by the command-line option that sets each value (what a rerun with
        other settings names: ``--mask-threshold: 0.5 -> 0.4``)."""
        i = self.identity()
        return {
            "--segmenter": i["fingerprint"],
            "--mask-threshold": i["threshold"],
            "--mask-prompt-template": i["prompt_template"],
            "--segmenter-provider": i["provider"],
        }

    def describe(self) -> dict[str, Any]:
        """The segmenter for a run's sidecar: its folder, source model, identity and the whole recipe."""
        return {**super().describe(), "recipe": self.recipe.describe()}

    def work_bytes(self, size: tuple[int, int]) -> int:
        """Bytes one image of ``size`` ``(width, height)`` holds while it is segmented: the input
        pixels at every preprocessing step (uint8, float64, float32: 17 bytes per value), the
        vision activations, one logit map per prompt, the probability map at the image's size in
        float32 (twice, during the resize) and the uint8 mask (a decoded-bytes budget reserves it,
        jobs/items.py)."""
        s0, s1 = self.image_recipe.fixed_size
        acts = int(np.prod([int(d) for d in self.bundle.graph("vision")["outputs"][0]["shape"][1:]]))
        w, h = size
        return 17 * 3 * s0 * s1 + 4 * acts + 4 * s0 * s1 + 9 * int(w) * int(h)

    def segment_image(self, image: Image.Image, subject_names: Sequence[str]) -> list[SegmenterMask]:
        """One image's masks for several subject names: the vision graph once, the decoder per name
        (:meth:`segment` on the same image object).

        Raises:
            InputError: as :meth:`segment`.
        """
        return self.segment([image] * len(subject_names), list(subject_names))

    def encode_prompts(self, prompts: Sequence[str]) -> np.ndarray:
        """Conditional embeddings ``[n, P] float32``; a prompt not in the LRU goes through the text
        graph once, however often it appears.

        Raises:
            InputError: ``prompt_too_long`` (more tokens than the text graph's length), before any
                graph runs.
        """
        distinct = list(dict.fromkeys(prompts))
        found = self._cached_texts(distinct)
        if len(found) < len(distinct):
            # Misses are computed under one lock and looked up again inside it: loader threads that
            # need the same new prompt at once wait for one text-graph run instead of each making one.
            with self._text_run_lock:
                found.update(self._cached_texts([p for p in distinct if p not in found]))
                self._encode_texts([p for p in distinct if p not in found], found)
        if not prompts:
            return np.zeros((0, int(self.bundle.graph("text")["outputs"][0]["shape"][1])), np.float32)
        return np.stack([found[p] for p in prompts]).astype(np.float32, copy=False)

    def _cached_texts(self, prompts: Sequence[str]) -> dict[str, np.ndarray]:
        """The embeddings of ``prompts`` in the LRU (counted as hits)."""
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for p in prompts:
                e = self._texts.get(p)  # a hit becomes the most recently used
                if e is not None:
                    found[p] = e
            self.text_cache_hits += len(found)
        return found

    def _encode_texts(self, todo: Sequence[str], found: dict[str, np.ndarray]) -> None:
        """Run the text graph on ``todo`` (token budget checked first), into ``found`` and the LRU."""
        if todo:
            enc = self.prompt_tokenizer.encode(todo)
            for p, e in zip(todo, enc):
                self._check_tokens(p, e)
            ids = np.stack([e.input_ids for e in enc])
            emb = np.concatenate(
                [
                    self.text.run({"input_ids": ids[sel]})["conditional_embeddings"]
                    for sel in self.batches([None] * len(todo))
                ]
            )
            found.update(zip(todo, emb))
            with self._lock:
                self.texts_encoded += len(todo)
                for p in todo:  # past text_cache_size the least recently used prompt goes
                    self._texts[p] = found[p]

    def encode_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Vision activations ``[n, K, T, D] float32``, ``batch_size`` images per call."""
        pixels = [self.preprocess(im).pixel_values for im in images]
        out = [
            self.vision.run({"pixel_values": np.stack([pixels[i] for i in sel])})["activations"]
            for sel in self.batches([None] * len(pixels))
        ]
        with self._lock:
            self.images_encoded += len(pixels)
        return np.concatenate(out)

    def logits(self, images: Sequence[Image.Image], subject_names: Sequence[str]) -> np.ndarray:
        """Decoder logits ``[n, S, S] float32`` for the i-th image prompted by the i-th subject name.

        The same image object given several times goes through the vision graph once.

        Raises:
            InputError: a subject name gives no valid prompt (the message names its index);
                nothing has run then.
            ValueError: ``images`` and ``subject_names`` differ in length.
        """
        if len(images) != len(subject_names):
            raise ValueError(f"{len(images)} images but {len(subject_names)} subject names")
        if not len(images):
            return np.zeros((0, *self.image_recipe.fixed_size), np.float32)
        prompts = []
        for i, name in enumerate(subject_names):
            try:
                prompts.append(self.prompt(name))
            except InputError as e:
                raise InputError(e.reason, f"item {i}: {e.detail}") from None
        distinct_prompts = list(dict.fromkeys(prompts))
        cond = self.encode_prompts(distinct_prompts)
        slot: dict[int, int] = {}
        distinct: list[Image.Image] = []
        for im in images:
            if id(im) not in slot:
                slot[id(im)] = len(distinct)
                distinct.append(im)
        acts = self.encode_images(distinct)
        rows = np.array([slot[id(im)] for im in images], dtype=np.int64)
        where = {p: i for i, p in enumerate(distinct_prompts)}
        cond_rows = np.array([where[p] for p in prompts], dtype=np.int64)
        out = [
            self.decoder.run({"activations": acts[rows[sel]], "conditional_embeddings": cond[cond_rows[sel]]})["logits"]
            for sel in self.batches([None] * len(rows))
        ]
        return np.concatenate(out)

    def probabilities(self, images: Sequence[Image.Image], subject_names: Sequence[str]) -> list[np.ndarray]:
        """Steps 1-4: ``[H, W] float32`` probability maps at each image's size."""
        return [probability_map(lg, im.size) for lg, im in zip(self.logits(images, subject_names), images)]

    def segment(self, images: Sequence[Image.Image], subject_names: Sequence[str]) -> list[SegmenterMask]:
        """The recipe's masks for the i-th image prompted by the i-th subject name.

        Args:
            images: PIL images (any mode; converted to RGB as preprocessing does).
            subject_names: one per image; the recipe's template is applied.

        Returns:
            One :class:`SegmenterMask` per image, in order.

        Raises:
            InputError: ``empty_prompt`` / ``prompt_too_long`` for a subject name (index named),
                before any graph runs. A job calls :meth:`prompt` per row first to give each bad
                row its own status.
        """
        logits = self.logits(images, subject_names)
        out = []
        for lg, im, name in zip(logits, images, subject_names):
            mask = mask_from_logits(lg, im.size, self.recipe)
            out.append(SegmenterMask(mask, self.prompt(name), mask_coverage(mask)))
        return out

    def mask(self, image: Image.Image, subject_name: str) -> np.ndarray:
        """One image's ``[H, W] uint8`` 0/255 mask (:meth:`segment` for one item)."""
        return self.segment([image], [subject_name])[0].mask
