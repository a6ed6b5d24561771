"""The torch-free MaSC scorer: a drop-in for ``masc.MaSC`` built on a bundle.

``from masc_engine import MaSC`` then ``MaSC("bundles/siglip2-so400m").score(ref_image, ref_mask,
out_image, out_mask, prompt, object_name)`` returns the same ``cp``, ``pf`` and ``extras`` as
masc-metric 0.3.0 on the same weights (docs/fidelity.md gives the measured differences).

One scorer object may serve concurrent calls from several threads (:class:`Scorer` says which
of its state changes after construction, and how that is guarded).

``device_resident=True`` keeps patch tokens in the token device's memory (engine/device.py: the
GPU with CuPy for ``provider="cuda"`` or TensorRT; host numpy through IO binding on CPU): the
vision graph writes them there, the pooling head and the CP graph read them there, and only
scores, pooled embeddings and attention rows are copied back. masc-run's in-memory encoding cache
then holds reference tokens on the device across pairs.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol, Sequence, TypeVar, cast

import numpy as np
from PIL import Image

from ..engine.backends.registry import get_backend
from ..engine.bundle import Bundle
from ..engine.manifest import one_line
from ..engine.stage_clock import timed
from ..errors import BundleError, MascEngineError
from . import heads
from .config import ScorerConfig
from .encoder import Encoder, RunnerSettings, runner_property
from .masks import MaskPolicy, mask_to_patch_grid
from .pair_metrics.base import HostTokens
from .pair import EncodedPair, ImageEncoding, MaSCResult, Pair, check_pair_arguments
from .position import position_weights
from .preprocess import PreprocessedImage
from .segmenter import Segmenter, SegmenterConfig
from .stripping import pf_prompt
from .text import EncodedPrompt, PreparedPrompt

if TYPE_CHECKING:
    from ..engine.device import ArrayDevice

T = TypeVar("T")


class TextStore(Protocol):
    """What the scorer reads and writes of a persistent text-embedding store (runtime/cache.py
    ``EncodingStore`` is one)."""

    def get_text(self, text: str) -> np.ndarray | None:
        """The stored ``[P] float32`` embedding of ``text``, or None."""

    def put_text(self, text: str, embedding: np.ndarray) -> None:
        """Store ``text``'s ``[P] float32`` embedding."""


class Scorer(Encoder):
    """MaSC on a bundle, without PyTorch.

    The settings are one :class:`~masc_engine.runtime.config.ScorerConfig` (``config``), or its
    fields as keywords (the drop-in API: ``MaSC(bundle, stripper="none", provider="cuda")``);
    keywords override the fields of ``config``. ``ort_memory="lean" | "arena"`` is accepted as a
    keyword for ONNX Runtime's ``backend_options``. The resolved config (every choice left to the
    bundle made) is :attr:`config`; its ``identity()`` keys masc-run's resume and caches.

    An :class:`~masc_engine.runtime.encoder.Encoder` (runtime/encoder.py): the bundle, the
    preprocessing recipe, the runner table, batching by shape and ``close()`` are the base's.

    One scorer object may serve concurrent calls from several threads. Its settings are fixed at
    construction; what changes after is locked or safe for threads by contract: the runner
    table (the text runner is made on first use, once), the text store (given to the
    constructor, or attached for one run and detached after: :meth:`attach_text_store`; the
    store itself is safe across threads and processes), the runners (their sessions and
    engines are thread-safe), the tokenizer (configured once, then only read) and the
    segmenter (its prompt LRU and counters are locked).

    Args:
        bundle: a bundle directory (from ``masc-export``) or a loaded :class:`Bundle`.
        config: the settings (default: ``ScorerConfig()``: ONNX Runtime on CPU, or the backend a
            certified bundle names; the fused graphs where the bundle has them; the regex
            stripper; the manifest's threshold and patch budget).
        verify: check the sha256 of each bundle file the scorer loads, before loading it
            (``"all"``: every file, at once; see :class:`Bundle`).
        array_device: the token device to use instead of the one the backend's registry entry
            gives (an engine/device.py ``ArrayDevice``; tests pass a strict fake).
        segmenter: masks for pairs that come without one (``ref_mask`` / ``out_mask`` None), from
            the pair's ``object_name``: a segmenter bundle folder, a
            :class:`~masc_engine.runtime.segmenter.SegmenterConfig` or a
            :class:`~masc_engine.runtime.segmenter.Segmenter` (docs/segmenter.md).
        text_store: a persistent text-embedding store (runtime/cache.py
            ``EncodingStore``) prompts are looked up in before the text tower and written to after
            it (:attr:`text_store`); None: none (:meth:`attach_text_store` can add one later).
        **settings: :class:`~masc_engine.runtime.config.ScorerConfig` fields (see there for each:
            ``backend``, ``provider``, ``precision``, ``graph_variant``, ``stripper``,
            ``fg_threshold``, ``naflex_max_patches``, ``batch_size``, ``intra_op_threads``,
            ``cp_head``, ``device_resident``, ``mask_size_policy``, ``backend_options``), and
            ``ort_memory``.

    Attributes:
        config: the resolved :class:`~masc_engine.runtime.config.ScorerConfig`.
        segmenter: the :class:`~masc_engine.runtime.segmenter.Segmenter`, or None.

    Raises:
        TypeError, ValueError: a setting of the wrong type or out of range (named), before the
            bundle is read.
        BundleError: the bundle is missing, incomplete or lacks what the settings ask for (a
            ``cp`` graph for ``cp_head="graph"``, a graph variant); never a silent switch.
        BackendUnavailableError: the backend, provider, precision or CuPy (device-resident on a
            GPU) is missing; never a silent CPU fallback.
    """

    KIND = "scorer"
    GRAPHS = ("vision", "pool", "text", "cp")

    vision = runner_property("vision")
    pool = runner_property("pool")
    text = runner_property("text")

    def __init__(
        self,
        bundle: str | Path | Bundle,
        config: ScorerConfig | None = None,
        *,
        verify: bool | str = True,
        array_device: ArrayDevice | None = None,
        segmenter: str | Path | SegmenterConfig | Segmenter | None = None,
        text_store: TextStore | None = None,
        **settings: Any,
    ) -> None:
        config = _merge_settings(config, settings)
        if segmenter is not None and not isinstance(segmenter, (str, Path, SegmenterConfig, Segmenter)):
            raise TypeError(
                f"segmenter must be a segmenter bundle folder, a SegmenterConfig or a Segmenter, got "
                f"{type(segmenter).__name__}"
            )
        if config.stripper == "spacy":  # fail now, not mid-evaluation (as the reference does)
            from .stripping import SpacySubjectStripper

            SpacySubjectStripper.load()
        bundle = self.open_bundle(bundle, verify)
        config = config.resolve(bundle)
        spec = get_backend(config.backend)
        super().__init__(
            bundle,
            RunnerSettings(
                config.backend,
                config.provider,
                config.precision,
                config.intra_op_threads,
                config.graph_variant,
                config.options,
            ),
            batch_size=config.batch_size,
            verify=verify,
        )
        budget = _resolved(config.naflex_max_patches, "naflex_max_patches")
        if budget != self.image_recipe.max_num_patches:
            self.image_settings = self.image_recipe.with_budget(budget)
        self.position_grid = self.bundle.manifest["image"].get("position_grid")
        self._text_store = text_store
        self._text_store_lock = threading.Lock()
        #: The token device (engine/device.py) when device-resident, else None (host numpy).
        #: Chosen before any session is made, so a missing backend or CuPy fails at once.
        self.device: ArrayDevice | None = None
        if config.device_resident:
            from ..engine.device import device_for

            spec.check_available(config.provider, config.precision)  # the missing backend is the first thing to say
            self.device = (
                array_device
                if array_device is not None
                else device_for(config.backend, _resolved(config.provider, "provider"))
            )
        # vision and pool now (a missing backend or graph fails here); the text runner on first
        # use: masc-rank and runs whose prompts all come from the persistent cache never pay for it.
        # The precision the runners report (TensorRT picks the engine set when none is named): it
        # keys masc-run's resume fingerprint and token cache.
        self.config = config.replace(precision=self.vision.precision)
        self.runner("pool")
        #: The mask size rule ``config.mask_size_policy`` names (runtime/masks.py).
        self.mask_policy = MaskPolicy.named(config.mask_size_policy)
        self._graph_cp = None
        if config.cp_head == "graph":
            from .cp_device import GraphCP

            self._graph_cp = GraphCP(
                self.runner("cp"), _resolved(config.fg_threshold, "fg_threshold"), device=self.device
            )
        self.segmenter = _segmenter(segmenter, verify, self.config)

    @property
    def certificate(self) -> dict[str, Any] | None:
        """How far these scores may be from fp32, or None when they are fp32 scores (the oracle's
        arithmetic): the bundle's precision record (``manifest["precision"]``: the mode, the gates it
        passed at export, and for ``bf16-cpu`` the layers kept in fp32) whenever the scorer runs in
        reduced precision (an fp16/bf16/int8 bundle, or a ``bf16-cpu`` bundle on OpenVINO). masc-run
        and masc-serve say so: such scores are certified to the gates, not bit-equal to fp32."""
        if self.config.precision in (None, "fp32"):
            return None
        rec = dict(self.bundle.manifest.get("precision") or {"mode": self.config.precision})
        rec.setdefault(
            "claim",
            f"{self.config.precision} scores: validated against fp32 by the export gates, not bit-equal to fp32",
        )
        return rec

    # Read-only views of the resolved config (one home for each setting: ``self.config``).
    stripper = property(lambda self: self.config.stripper)
    fg_threshold = property(lambda self: self.config.fg_threshold)
    batch_size = property(lambda self: self.config.batch_size)
    provider = property(lambda self: self.config.provider)
    backend = property(lambda self: self.config.backend)
    precision = property(lambda self: self.config.precision)
    graph_variant = property(lambda self: self.config.graph_variant)
    cp_head = property(lambda self: self.config.cp_head)
    mask_size_policy = property(lambda self: self.config.mask_size_policy)

    @property
    def text_store(self) -> TextStore | None:
        """The persistent text-embedding store (runtime/cache.py ``EncodingStore``) prompts are
        looked up in and written to, or None. Read-only: given to the constructor, or attached for
        one run with :meth:`attach_text_store`."""
        return self._text_store

    def attach_text_store(self, store: TextStore) -> None:
        """Look prompts up in ``store`` (and write new ones there) until :meth:`detach_text_store`.

        For a scorer made before its store: the store's namespace is computed from the scorer
        (jobs/pairs.py ``encoding_namespace``). A hit returns the stored float32 values, so scores
        are identical with or without it.

        Args:
            store: the store (anything with ``get_text(text)`` and
                ``put_text(text, embedding)``).

        Raises:
            RuntimeError: a store is attached already (two runs on one scorer would share it).
        """
        with self._text_store_lock:
            if self._text_store is not None:
                raise RuntimeError("this Scorer has a text store already; detach it first")
            self._text_store = store

    def detach_text_store(self) -> TextStore | None:
        """Stop using the text store (a run closes it after); returns it, or None when none was attached."""
        with self._text_store_lock:
            store, self._text_store = self._text_store, None
        return store

    def close(self) -> None:
        """Release the runners now: TensorRT contexts, engines and their device memory, ONNX Runtime
        sessions, and the token device's cached blocks. Idempotent; the scorer cannot score after.
        ``with Scorer(...) as s:`` closes on exit."""
        self._graph_cp = None
        super().close()
        if self.device is not None and callable(getattr(self.device, "release_cached", None)):
            self.device.release_cached()

    # ------------------------------------------------------------------ encoders

    def encode_preprocessed(self, items: Sequence[PreprocessedImage]) -> list[ImageEncoding]:
        """Run the vision tower on preprocessed images, ``batch_size`` at a time.

        Batches hold images of one patch count only, so no input is ever padded: an image's
        tokens are the same bits whatever else is in its batch and whatever ``batch_size`` is
        (padding a batch changes ONNX Runtime's reduction order on base-shaped graphs; tests in
        tests/test_batch_invariance.py check equality, not closeness). Images of a dataset at one
        resolution share a patch count, so this costs nothing there; mixed sizes cost more calls.
        """
        out: dict[int, ImageEncoding] = {}
        for sel in self.batches([int(p.spatial_shape[0] * p.spatial_shape[1]) for p in items]):
            n = int(items[sel[0]].spatial_shape[0] * items[sel[0]].spatial_shape[1])
            for i, enc in zip(sel, self._encode_batch([items[i] for i in sel], n)):
                out[i] = enc
        return [out[i] for i in range(len(items))]

    def _encode_batch(self, chunk: Sequence[PreprocessedImage], n: int) -> list[ImageEncoding]:
        """One vision call on images that all have ``n`` real patches."""
        if self.image_recipe.mode == "naflex":
            feeds = {
                "pixel_values": np.stack([p.pixel_values[:n] for p in chunk]),
                "pixel_attention_mask": np.stack([p.pixel_attention_mask[:n] for p in chunk]),
                "position_weights": np.stack([position_weights(self.position_grid, p.spatial_shape, n) for p in chunk]),
            }
        else:
            feeds = {"pixel_values": np.stack([p.pixel_values for p in chunk])}
        if self.device is not None:  # tokens stay on the device
            hidden = self.vision.run_device(feeds, self.device)["last_hidden_state"]
            # A device-to-device copy per image, not a view: a cached encoding must not keep
            # its whole [B, n, D] batch output alive (masc-run caches hundreds of encodings).
            return [ImageEncoding(self.device.copy(hidden[i, :n]), p.spatial_shape) for i, p in enumerate(chunk)]
        hidden = self.vision.run(feeds)["last_hidden_state"]
        return [ImageEncoding(np.ascontiguousarray(hidden[i, :n]), p.spatial_shape) for i, p in enumerate(chunk)]

    def host_encoding(self, enc: ImageEncoding) -> ImageEncoding:
        """``enc`` with its tokens in host memory (a copy from the token device if needed)."""
        if self.device is None or not self.device.is_device_array(enc.tokens):
            return enc
        return ImageEncoding(self.device.to_host(enc.tokens), enc.grid)

    def device_encoding(self, enc: ImageEncoding) -> ImageEncoding:
        """``enc`` with its tokens on the token device (a copy from the host if needed)."""
        if self.device is None or self.device.is_device_array(enc.tokens):
            return enc
        return ImageEncoding(self.device.from_host(np.ascontiguousarray(enc.tokens, np.float32)), enc.grid)

    def encode_images(self, images: Sequence[Image.Image]) -> list[ImageEncoding]:
        """Preprocess and encode images. Returns one :class:`ImageEncoding` per image.

        Raises:
            TypeError: an item is not a PIL image (checked before any inference).
        """
        for i, im in enumerate(images):
            if not isinstance(im, Image.Image):
                raise TypeError(f"images[{i}] must be a PIL.Image.Image, got {type(im).__name__}")
        return self.encode_preprocessed([self.preprocess(im) for im in images])

    def prepare_prompt(self, prompt: str, object_name: str | None, stripper: str | None = None) -> PreparedPrompt:
        """Strip and tokenize a PF prompt ahead of scoring (:class:`EncodedPair` ``prepared``).

        Args:
            prompt: the generation prompt.
            object_name: the subject name stripped from it (None: keep the prompt).
            stripper: ``regex``, ``spacy`` or ``none``; default: the scorer's.
        """
        text, extras = pf_prompt(prompt, object_name, stripper or self.stripper)
        return PreparedPrompt(text, extras, self.prompt_tokenizer.encode([text])[0])

    def encode_texts(
        self, texts: Sequence[str], tokenized: dict[str, EncodedPrompt] | None = None
    ) -> tuple[np.ndarray, list[EncodedPrompt]]:
        """Tokenize and encode prompts: ``([B, P] float32 text embeddings, [EncodedPrompt])``.

        ``tokenized``: token ids already made for some of the texts (not tokenized again).
        With ``text_store`` set, embeddings found there skip the text tower (a hit returns the
        stored float32 values, so scores are identical)."""
        texts = list(texts)
        tokenized = tokenized or {}
        todo_tok = [t for t in texts if t not in tokenized]
        made = dict(zip(todo_tok, self.prompt_tokenizer.encode(todo_tok))) if todo_tok else {}
        encoded = [tokenized[t] if t in tokenized else made[t] for t in texts]
        width = int(self.bundle.manifest["architecture"]["text_projection"])
        out = np.zeros((len(texts), width), np.float32)
        todo = []
        store = self.text_store  # one store for the whole call, even if a run detaches it meanwhile
        for i, t in enumerate(texts):
            hit = store.get_text(t) if store is not None else None
            if hit is None:
                todo.append(i)
            else:
                out[i] = hit
        for run in self.batches([None] * len(todo)):
            sel = [todo[j] for j in run]
            emb = self._run_text(np.stack([encoded[i].input_ids for i in sel]))
            out[sel] = emb
            if store is not None:
                for i, e in zip(sel, emb):
                    store.put_text(texts[i], e)
        return out, encoded

    def _run_text(self, ids: np.ndarray) -> np.ndarray:
        """The text tower on ``[B, L] int64`` ids. A graph that refuses the ids (a tokenizer.json
        whose ids pass the tower's vocabulary, in a bundle without ``text.vocab_size``) is the
        bundle's one-line :class:`BundleError`, not a library traceback.
        """
        try:
            emb: np.ndarray = self.text.run({"input_ids": ids})["text_embeds"]
            return emb
        except MascEngineError:
            raise
        except Exception as e:  # noqa: BLE001 - ONNX Runtime / OpenVINO raise their own kinds
            raise BundleError(
                f"bundle {self.bundle.path}: the text graph failed on token ids up to {int(ids.max())} "
                f"(does tokenizer.json match the text tower?): {one_line(e)}"
            ) from None

    def pool_background(
        self, encs: Sequence[ImageEncoding], kpms: Sequence[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """Background-pooled embeddings: ``([B, D] float32, [attention [Hp*Wp] float32])``.

        Rows whose mask hides every patch are not run (their PF is NaN); their row is NaN.
        """
        d = encs[0].tokens.shape[1] if encs else 0
        pooled = np.full((len(encs), d), np.nan, dtype=np.float32)
        attn: list[np.ndarray | None] = [None] * len(encs)
        # Batches of one sequence length only: no padding slot, so a pooled vector is the same
        # bits in any batch (see encode_preprocessed).
        rows = [i for i, k in enumerate(kpms) if not k.all()]
        batches = [[rows[j] for j in sel] for sel in self.batches([int(encs[i].tokens.shape[0]) for i in rows])]
        dev = self.device
        for sel in batches:
            n = max(encs[i].tokens.shape[0] for i in sel)
            hidden = (np.zeros if dev is None else dev.zeros)((len(sel), n, d), np.float32)
            kpm = np.ones((len(sel), n), dtype=bool)
            for j, i in enumerate(sel):
                c = encs[i].tokens.shape[0]
                hidden[j, :c] = encs[i].tokens
                kpm[j, :c] = kpms[i]
            feeds = {"hidden": hidden, "key_padding_mask": kpm}
            if dev is None:
                res = self.pool.run(feeds)
            else:  # only [B, D] pooled and [B, N] attention come back
                res = {k: dev.to_host(v) for k, v in self.pool.run_device(feeds, dev).items()}
            for j, i in enumerate(sel):
                pooled[i] = res["pooled"][j]
                attn[i] = res["attention"][j, : encs[i].tokens.shape[0]]
        return pooled, attn

    # ------------------------------------------------------------------ scoring

    def mask_weights(self, image: Image.Image, mask: np.ndarray, grid: tuple[int, int], what: str) -> np.ndarray:
        """``[Hp * Wp] float32`` weights of ``mask`` on ``grid``, once :attr:`mask_policy` passes it.

        Raises:
            InputError: the mask policy refuses the mask (see :class:`MaskPolicy`).
        """
        self.mask_policy.check((image.height, image.width), np.shape(mask), what)
        return mask_to_patch_grid(mask, grid)

    def score(
        self,
        ref_image: Image.Image,
        ref_mask: np.ndarray | None = None,
        out_image: Image.Image | None = None,
        out_mask: np.ndarray | None = None,
        prompt: str | None = None,
        object_name: str | None = None,
    ) -> MaSCResult:
        """Score one (reference, output, prompt) sample, as ``masc.MaSC.score``.

        Args:
            ref_image: the reference PIL image (converted to RGB).
            ref_mask: ``[H, W]`` mask of the reference's size (as ``out_mask``).
            out_image: the output PIL image (converted to RGB).
            out_mask: ``[H, W]`` mask of its image's size, uint8 0..255 or float
                0..1, foreground non-zero; None (or left out: ``score(ref_image=..., out_image=...,
                prompt=..., object_name=...)``) when the scorer has a segmenter, which computes
                it from ``object_name`` (``result.masks`` holds it).
            prompt: the generation prompt.
            object_name: subject name stripped from the prompt for PF (``None``: keep the prompt),
                and the segmenter's subject.

        Raises:
            TypeError: an argument of the wrong type (named): images must be PIL images, masks
                numpy arrays (or None with a segmenter), ``prompt`` a str, ``object_name`` a str
                or None (``out_image`` and ``prompt`` are required: None is refused so).
            InputError: (a ``ValueError``) a mask is not 2-D, or its size differs from its
                image's and the mask policy refuses it (``mask_size_policy="refuse"``: sizes must
                match); a mask left to the segmenter without an ``object_name``
                (``no_mask_source``). Raised before any inference.
        """
        # The caller's arguments as given: check_pair_arguments refuses a None out_image or prompt
        # (a TypeError naming it), as it refuses any other wrong type.
        pair = Pair(ref_image, ref_mask, cast(Image.Image, out_image), out_mask, cast(str, prompt), object_name)
        check_pair_arguments(pair, "", self.mask_policy, segmenter=self.segmenter)
        return self.score_batch([pair])[0]

    def score_batch(self, pairs: Iterable[Pair]) -> list[MaSCResult]:
        """Score many pairs; each distinct image object and each distinct PF prompt is encoded
        once (a benchmark reuses one reference across prompts, methods and seeds).

        Results do not depend on batch composition or order (tests/test_scorer.py). With a
        segmenter, the masks left None are computed first (each image object through the
        segmenter's vision graph once, each distinct prompt's text embedding once); the results
        then say where each mask came from (``extras["ref_mask_source"]`` / ``["out_mask_source"]``:
        ``file`` or ``segmenter``) and hold the computed ones (``MaSCResult.masks``).
        """
        pairs = list(pairs)
        for i, p in enumerate(pairs):  # every argument checked before any inference
            if not isinstance(p, Pair):
                raise TypeError(f"pairs[{i}] must be a masc_engine.Pair, got {type(p).__name__}")
            check_pair_arguments(p, f"pairs[{i}].", self.mask_policy, segmenter=self.segmenter)
        pairs, computed = self._segment_missing(pairs)
        results = self._score_pairs(pairs)
        if self.segmenter is not None:
            for res, made in zip(results, computed):
                res.masks = made
                for side in ("ref_mask", "out_mask"):
                    res.extras[f"{side}_source"] = "segmenter" if side in made else "file"
        return results

    def _segment_missing(self, pairs: list[Pair]) -> tuple[list[Pair], list[dict[str, np.ndarray]]]:
        """The pairs with their None masks computed by the segmenter (one call for all), and per
        pair the masks computed (``{"ref_mask": array, ...}``)."""
        need = [(i, side) for i, p in enumerate(pairs) for side in ("ref", "out") if getattr(p, f"{side}_mask") is None]
        computed: list[dict[str, np.ndarray]] = [{} for _ in pairs]
        if not need:
            return pairs, computed
        # check_pair_arguments let a mask be None only with a segmenter and an object_name
        segmenter = _resolved(self.segmenter, "segmenter")
        masks = segmenter.segment(
            [getattr(pairs[i], f"{side}_image") for i, side in need],
            [_resolved(pairs[i].object_name, "object_name") for i, _ in need],
        )
        for (i, side), m in zip(need, masks):
            computed[i][f"{side}_mask"] = m.mask
        filled = [
            dataclasses.replace(p, ref_mask=c.get("ref_mask", p.ref_mask), out_mask=c.get("out_mask", p.out_mask))
            if c
            else p
            for p, c in zip(pairs, computed)
        ]
        return filled, computed

    def _score_pairs(self, pairs: list[Pair]) -> list[MaSCResult]:
        """Score checked pairs with their masks: each distinct image object encoded once."""
        images: dict[int, Image.Image] = {}
        for p in pairs:
            images.setdefault(id(p.ref_image), p.ref_image)
            images.setdefault(id(p.out_image), p.out_image)
        keys = list(images)
        encs = dict(zip(keys, self.encode_images([images[k] for k in keys])))
        items = []
        for p in pairs:
            r, o = encs[id(p.ref_image)], encs[id(p.out_image)]
            ref_mask, out_mask = _resolved(p.ref_mask, "ref_mask"), _resolved(p.out_mask, "out_mask")
            items.append(
                EncodedPair(
                    r,
                    self.mask_weights(p.ref_image, ref_mask, r.grid, "reference"),
                    o,
                    self.mask_weights(p.out_image, out_mask, o.grid, "output"),
                    p.prompt,
                    p.object_name,
                )
            )
        return self.score_encoded(items)

    @timed("score_encoded (text, pool, CP/PF heads)")
    def score_encoded(
        self, items: Sequence["EncodedPair"], with_arrays: bool = False, stripper: str | None = None
    ) -> list[MaSCResult]:
        """Score pairs whose images are already encoded and masks already on the patch grid
        (the entry point of ``masc-run``, which caches encodings across rows). The other pair
        metrics of a run (the ``--baselines`` family, ...) read these results and encodings:
        runtime/pair_metrics.

        Args:
            items: the encoded pairs (:class:`EncodedPair`).
            with_arrays: fill ``MaSCResult.arrays`` (per-patch maxima and PF attention, for maps).
            stripper: PF prompt stripper for the items without a ``prepared`` prompt (default:
                the scorer's).
        """
        stripper = stripper or self.stripper
        prompts = [
            (it.prepared.text, it.prepared.extras)
            if it.prepared is not None
            else pf_prompt(it.prompt, it.object_name, stripper)
            for it in items
        ]
        texts = sorted({t for t, _ in prompts})
        text_emb, text_enc = self.encode_texts(
            texts, {it.prepared.text: it.prepared.encoded for it in items if it.prepared is not None}
        )
        text_row = {t: i for i, t in enumerate(texts)}
        kpms = [heads.background_key_padding_mask(it.out_weights, self.fg_threshold) for it in items]
        pooled, attention = self.pool_background([it.out_enc for it in items], kpms)
        if self._graph_cp is not None:
            from .cp_device import CPItem

            cps = self._graph_cp.score_items(
                [CPItem(it.ref_enc.tokens, it.ref_weights, it.out_enc.tokens) for it in items]
            )
        else:
            cps = [
                heads.masked_maxcos(it.ref_enc.tokens, it.out_enc.tokens, it.ref_weights, self.fg_threshold)
                for it in items
            ]
        results = []
        host_tokens = HostTokens(self.host_encoding)  # maps read tokens on the host: one copy per image
        for i, it in enumerate(items):
            r, o = it.ref_enc, it.out_enc
            cp, cp_extras = cps[i]
            text, strip_extras = prompts[i]
            k = text_row[text]
            n_fg = int(kpms[i].sum())
            n_bg = int((~kpms[i]).sum())
            pf = float("nan") if n_bg == 0 else heads.cosine(pooled[i], text_emb[k])
            res = MaSCResult(
                cp=cp,
                pf=pf,
                extras={
                    "prompt_text": text,
                    **strip_extras,
                    **cp_extras,
                    "pf_n_fg": n_fg,
                    "pf_n_total": o.grid[0] * o.grid[1],
                    "pf_n_bg_pooled": n_bg,
                    "prompt_truncated": bool(text_enc[k].truncated),
                    "prompt_n_tokens": int(text_enc[k].n_tokens),
                    "ref_grid": list(r.grid),
                    "out_grid": list(o.grid),
                },
            )
            if np.isnan(cp):
                res.extras["cp_undefined"] = f"no reference patch has mask weight > {self.fg_threshold}"
            if np.isnan(pf):
                res.extras["pf_undefined"] = "the output mask hides every patch: no background to pool"
            if with_arrays:  # maps need the tokens on the host: copied only when asked for
                res.arrays = {
                    "cp_best": heads.best_match_cosines(host_tokens(r), host_tokens(o)),
                    "pf_attention": attention[i]
                    if attention[i] is not None
                    else np.zeros(o.tokens.shape[0], np.float32),
                    "pf_hidden": kpms[i],
                }
            results.append(res)
        return results


def _resolved(value: T | None, name: str) -> T:
    """``value``, which the scorer's checks (``ScorerConfig.resolve``, ``check_pair_arguments``)
    have set by the time it is read.

    Raises:
        ValueError: it is None all the same (a broken invariant, named).
    """
    if value is None:
        raise ValueError(f"Scorer: {name} is unset where the scorer's checks set it")
    return value


def _segmenter(
    segmenter: str | Path | SegmenterConfig | Segmenter | None, verify: bool | str, config: ScorerConfig
) -> Segmenter | None:
    """The scorer's segmenter from what was passed: a folder or a config is loaded on the
    scorer's provider when it is one ONNX Runtime runs the segmenter on (``cpu``, ``cuda``) and
    the config names none; a :class:`Segmenter` is used as it is."""
    if segmenter is None or isinstance(segmenter, Segmenter):
        return segmenter
    if isinstance(segmenter, (str, Path)):
        segmenter = SegmenterConfig(
            str(segmenter), intra_op_threads=config.intra_op_threads, batch_size=config.batch_size
        )
    if segmenter.provider is None and config.provider in ("cpu", "cuda"):
        segmenter = dataclasses.replace(segmenter, provider=config.provider)
    loaded: Segmenter = segmenter.load(verify=verify)
    return loaded


def _merge_settings(config: ScorerConfig | None, settings: dict[str, Any]) -> ScorerConfig:
    """``config`` with the keyword settings applied (``ort_memory`` into ``backend_options``).

    Raises:
        TypeError: ``config`` is not a ScorerConfig, or a keyword that is no setting (named).
    """
    if config is not None and not isinstance(config, ScorerConfig):
        raise TypeError(f"config must be a masc_engine.ScorerConfig, got {type(config).__name__}")
    config = config or ScorerConfig()
    if "ort_memory" in settings:
        settings["backend_options"] = {
            **config.options,
            **dict(settings.get("backend_options", ())),
            "ort_memory": settings.pop("ort_memory"),
        }
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(ScorerConfig)})
    if unknown:
        raise TypeError(f"Scorer got unexpected setting(s) {', '.join(unknown)}; see masc_engine.ScorerConfig")
    return config.replace(**settings) if settings else config


__all__ = ["EncodedPair", "ImageEncoding", "MaSC", "MaSCResult", "Pair", "Scorer", "check_pair_arguments"]

#: Drop-in name: ``from masc_engine import MaSC``.
MaSC = Scorer
