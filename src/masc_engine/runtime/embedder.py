"""The classic metrics' embedders (CLIP image/text towers, DINO, DINOv2): :class:`Embedder`.

An embedder bundle (``manifest["kind"] == "embedder"``) holds an ``image`` graph
(``[N, 3, H, W] float32`` normalised pixels -> ``[N, D] float32`` embeddings) and, for CLIP, a
``text`` graph (``input_ids [N, L] int64``, and ``attention_mask`` when the graph takes one, ->
``[N, D] float32``), with:

- the image preprocessing recipe as data (``manifest["recipe"]``, runtime/recipes.py
  :class:`~masc_engine.runtime.recipes.ImageRecipe`), applied torch-free, equal to the reference
  pipelines pixel for pixel;
- ``manifest["embedding"]``: how the graphs read their embeddings and its width ``dim``;
- for a text graph, the tokenizer (``tokenizer.json``, through the ``tokenizers`` package) and the
  ``text`` section (runtime/text.py ``TextSettings``): CLIP pads to its 77-token context with its
  pad token and truncates there, keeping the start- and end-of-text tokens the tokenizer's
  post-processor adds, as transformers' ``CLIPTokenizer(padding="max_length", truncation=True)``.

Embeddings come back as the graphs give them (not L2-normalised): the scores (cosines, x100)
are computed from them by the metrics.

:class:`EmbeddingCache` keeps them by content: an in-memory LRU in front of the persistent store
(runtime/cache.py ``EncodingStore``, the same ``--cache-dir`` as the SigLIP2 encodings), keyed by
the image's content hash (or the prompt's sha256) and the embedder's :meth:`Embedder.identity`
(bundle fingerprint, backend, provider, precision and image recipe), so each encoder runs once per
distinct image across chunks, runs and files.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import Any
from pathlib import Path

import numpy as np
from PIL import Image

from ..engine.bundle import Bundle
from ..engine.stage_clock import timed
from ..errors import BundleError
from .cache import EncodingStore, embedding_scope, sha256_bytes
from .config import bundle_backend
from .encoder import LRU, Encoder, RunnerSettings
from .recipes import ImageRecipe, preprocess
from .text import POOLING_FIRST_EOS, POOLING_LEGACY_ARGMAX

#: ``manifest["kind"]`` of an embedder bundle.
KIND = "embedder"
#: Where an embedder manifest records its :class:`~masc_engine.runtime.recipes.ImageRecipe`.
RECIPE_KEY = "recipe"
#: A text graph whose sequence axis is dynamic runs each prompt at its pooled token's position plus
#: one, rounded up to a multiple of this, capped at the context. CLIP's text tower is causal, so
#: tokens after the pooled one never reach it: the shorter run is the same embedding (bit-equal on
#: ONNX Runtime at the tested shapes) with 4-5x less text work for prompts of DreamBench's length;
#: the length depends on the prompt alone, so its embedding does not depend on its batch.
TEXT_LENGTH_STEP = 16


def pooled_positions(ids: np.ndarray, text: Mapping[str, Any]) -> np.ndarray | None:
    """The token each prompt's text embedding is read from, by the manifest's pooling rule.

    The rules are transformers' ``CLIPTextTransformer``: ``"argmax of input_ids (legacy
    eos_token_id 2)"`` takes the first largest id; ``"first eos_token_id"`` the first
    ``text["eos_token_id"]`` (position 0 when absent, as ``argmax`` of an all-False row gives).

    Args:
        ids: ``[N, L] int64`` padded token ids.
        text: the manifest's ``text`` section.

    Returns:
        ``[N] int64`` positions, or None where the section names no rule this knows (no trimming).
    """
    rule = text.get("pooling")
    if rule == POOLING_LEGACY_ARGMAX:
        return np.asarray(np.argmax(ids, axis=1), np.int64)
    eos = text.get("eos_token_id")
    if rule == POOLING_FIRST_EOS and isinstance(eos, int) and not isinstance(eos, bool):
        return np.asarray(np.argmax(ids == eos, axis=1), np.int64)
    return None


def text_run_lengths(ids: np.ndarray, text: Mapping[str, Any]) -> np.ndarray:
    """Per prompt, the token count its text graph runs at (:data:`TEXT_LENGTH_STEP`).

    Args:
        ids: ``[N, L] int64`` token ids padded to the context ``L``.
        text: the manifest's ``text`` section.

    Returns:
        ``[N] int64`` lengths in ``[1, L]``; ``L`` for every prompt where the pooling rule is unknown.
    """
    length = ids.shape[1]
    pos = pooled_positions(ids, text)
    if pos is None:
        return np.full(len(ids), length, np.int64)
    return np.asarray(np.minimum(length, -(-(pos + 1) // TEXT_LENGTH_STEP) * TEXT_LENGTH_STEP), np.int64)


class Embedder(Encoder):
    """Embeddings of images (and texts) by an embedder bundle's graphs, in batches.

    Args:
        bundle: an embedder bundle directory or a loaded :class:`~masc_engine.engine.bundle.Bundle`.
        runners: how runners are made (backend, provider, threads, variant); None: the backend
            the bundle's precision record names (OpenVINO for a bundle certified with
            ``masc-export --precision bf16-cpu``, its certified graphs in bf16), else ONNX Runtime.
        batch_size: the most items per graph call, an int >= 1.
        verify: check file hashes before first use (``"all"``: every file now).

    Attributes:
        recipe: the manifest's :class:`~masc_engine.runtime.recipes.ImageRecipe`.

    Raises:
        BundleError: the bundle is missing, incomplete or of another kind; its recipe is unusable
            (:class:`~masc_engine.runtime.recipes.RecipeError`, one line); it has no image graph.
        ValueError: ``batch_size`` is not an int >= 1.
    """

    KIND = KIND
    GRAPHS: tuple[str, ...] = ("image", "text")

    def __init__(
        self,
        bundle: str | Path | Bundle,
        runners: RunnerSettings | None = None,
        *,
        batch_size: int = 32,
        verify: bool | str = True,
    ) -> None:
        if runners is None:  # the backend the bundle is for: OpenVINO for a bf16-cpu certified one
            bundle = self.open_bundle(bundle, verify)
            runners = RunnerSettings(backend=bundle_backend(bundle))
        super().__init__(bundle, runners, batch_size=batch_size, verify=verify)
        self.recipe = ImageRecipe.from_manifest(self.bundle.manifest.get(RECIPE_KEY))
        graphs = self.bundle.manifest.get("graphs") or {}
        if "image" not in graphs:
            raise BundleError(f"bundle {self.bundle.path} is an embedder bundle without an image graph")
        self.GRAPHS = tuple(g for g in type(self).GRAPHS if g in graphs)

    @property
    def has_text(self) -> bool:
        """Whether the bundle has a text graph (and its tokenizer)."""
        return "text" in self.GRAPHS

    @property
    def dim(self) -> int:
        """The embedding width D (``manifest["embedding"]["dim"]``)."""
        return int((self.bundle.manifest.get("embedding") or {}).get("dim") or 0)

    def identity(self) -> dict[str, Any]:
        """:meth:`Encoder.identity` with the recipe: the bundle fingerprint covers the graph files,
        not the manifest's ``recipe`` table, and the recipe decides the pixels."""
        return {**super().identity(), "recipe": self.recipe.to_manifest()}

    @timed("preprocess:embedders")
    def preprocess_image(self, image: Image.Image) -> np.ndarray:
        """One image by the manifest's recipe: ``[3, H, W] float32`` (runtime/recipes.py ``preprocess``)."""
        return preprocess(image, self.recipe)

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """Image embeddings, batched by input shape (no padding: an image's embedding does not depend
        on its batch).

        Args:
            images: PIL images of any mode and size (EXIF orientation and transparency as the
                recipe says).

        Returns:
            ``[N, D] float32``, not normalised, in the order given.
        """
        return self.embed_preprocessed([self.preprocess_image(im) for im in images])

    def embed_preprocessed(self, pixels: Sequence[np.ndarray]) -> np.ndarray:
        """Embeddings of images already preprocessed by :meth:`preprocess_image` (each
        ``[3, H, W] float32``), batched by shape as :meth:`embed_images`.

        Returns:
            ``[N, D] float32``, not normalised, in the order given.

        Raises:
            BundleError: the image graph takes more than one input.
        """
        if not pixels:
            return np.zeros((0, self.dim), np.float32)
        names = list(self.runner("image").input_names)
        if len(names) != 1:
            raise BundleError(
                f"bundle {self.bundle.path}: its image graph takes {', '.join(names)}; an embedder's "
                "image graph takes one input, the normalised pixels"
            )
        return self._run_batches("image", [{names[0]: p} for p in pixels], [p.shape for p in pixels])

    def tokenize(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and attention mask of ``texts``, padded and truncated to the text context.

        Returns:
            ``(input_ids [N, L] int64, attention_mask [N, L] int64)``; the mask is 1 on the
            tokens the tokenizer produced (start- and end-of-text included), 0 on padding.

        Raises:
            BundleError: the bundle has no text graph.
        """
        if self.tokenizer is None or not self.has_text:
            raise BundleError(f"bundle {self.bundle.path} has no text graph: it embeds images only")
        length = self.text_recipe.max_length
        encoded = self.tokenizer.encode(list(texts))
        ids = np.stack([e.input_ids for e in encoded]) if encoded else np.zeros((0, length), np.int64)
        mask = np.zeros(ids.shape, np.int64)
        for i, e in enumerate(encoded):
            n = min(e.n_tokens, length)
            if self.text_recipe.padding_side == "right":
                mask[i, :n] = 1
            else:
                mask[i, length - n :] = 1
        return ids, mask

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Text embeddings (CLIP-T's text side), in batches.

        Args:
            texts: prompts; each is tokenized, padded and truncated to the context (77 for CLIP),
                then run at :func:`text_run_lengths` when the graph's sequence axis is dynamic.

        Returns:
            ``[N, D] float32``, not normalised, in the order given.

        Raises:
            BundleError: the bundle has no text graph.
        """
        ids, mask = self.tokenize(texts)
        lengths = [ids.shape[1]] * len(ids)
        if self.text_sequence_dynamic:
            lengths = [int(n) for n in text_run_lengths(ids, self.bundle.manifest.get("text") or {})]
        feeds = [{"input_ids": ids[i, :n], "attention_mask": mask[i, :n]} for i, n in enumerate(lengths)]
        return self._run_batches("text", feeds, lengths)

    @property
    def text_sequence_dynamic(self) -> bool:
        """Whether the text graph's sequence axis is dynamic (``graphs.text.inputs[0].shape[1]`` a
        name): prompts then run at :func:`text_run_lengths`, not the whole context."""
        inputs = ((self.bundle.manifest.get("graphs") or {}).get("text") or {}).get("inputs") or [{}]
        shape = inputs[0].get("shape") if isinstance(inputs[0], dict) else None
        return isinstance(shape, list) and len(shape) == 2 and isinstance(shape[1], str)

    def _run_batches(self, graph: str, items: list[dict[str, np.ndarray]], keys: Sequence[Hashable]) -> np.ndarray:
        """Run ``graph`` over ``items`` (one feed dict per item, each array without the batch axis),
        batched by ``keys``; the first output of each batch, in item order, as float32."""
        if not items:
            return np.zeros((0, self.dim), np.float32)
        runner = self.runner(graph)
        names = list(runner.input_names)
        missing = [n for n in names if n not in items[0]]
        if missing:
            raise BundleError(
                f"bundle {self.bundle.path}: its {graph} graph takes {', '.join(names)}; an embedder "
                f"feeds {' or '.join(items[0])}"
            )
        out: dict[int, np.ndarray] = {}
        for batch in self.batches(keys):
            feeds = {n: np.stack([items[i][n] for i in batch]) for n in names}
            result = np.asarray(runner.run(feeds)[runner.output_names[0]], dtype=np.float32)
            for j, i in enumerate(batch):
                out[i] = result[j]
        return np.stack([out[i] for i in range(len(items))])


class EmbeddingCache:
    """One embedder's embeddings by content: an in-memory LRU in front of an optional disk store.

    Only keys in neither level go through the embedder's graphs. A stored entry that is not in the
    store's format, or not ``embedder.dim`` wide, is refused as the store refuses any (a miss,
    counted in ``EncodingStore.refused``, then rewritten); a failing store is bypassed.

    Args:
        embedder: the :class:`Embedder` that embeds misses.
        store: the persistent :class:`~masc_engine.runtime.cache.EncodingStore` (``--cache-dir``), or None.
        items: in-memory LRU size per side, in embeddings (a ``[D] float32`` each: 2 KiB at D=512).

    Attributes:
        images_embedded, texts_embedded: images and prompts that went through the graphs.
        cache_hits: embeddings served from the disk store.

    Thread-safe for lookups; :meth:`images` and :meth:`texts` are called by one thread at a time.
    """

    def __init__(self, embedder: Embedder, store: EncodingStore | None = None, items: int = 4096):
        self.embedder = embedder
        self.store = store
        ident = embedder.identity()
        self.scopes = {side: embedding_scope(ident, side) for side in ("image", "text")}
        self.memory = {side: LRU(items) for side in ("image", "text")}
        self._lock = threading.Lock()
        self.images_embedded = 0
        self.texts_embedded = 0
        self.cache_hits = 0

    def _get(self, side: str, key: str, store_key: str) -> np.ndarray | None:
        with self._lock:
            v = self.memory[side].get(key)
        if v is None and self.store is not None:
            v = self.store.get_embedding(self.scopes[side], store_key, self.embedder.dim or None)
            if v is not None:
                self.cache_hits += 1
                with self._lock:
                    self.memory[side][key] = v
        return v

    def _put(self, side: str, key: str, store_key: str, v: np.ndarray) -> None:
        with self._lock:
            self.memory[side][key] = v
        if self.store is not None:
            self.store.put_embedding(self.scopes[side], store_key, v)

    def images(self, pixels: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Image embeddings by content hash.

        Args:
            pixels: ``{content hash: [3, H, W] float32}``, each image preprocessed by the
                embedder's recipe (:meth:`Embedder.preprocess_image`).

        Returns:
            ``{content hash: [D] float32}`` for every key of ``pixels``, not normalised.
        """
        out = {k: self._get("image", k, k) for k in pixels}
        todo = [k for k, v in out.items() if v is None]
        made: dict[str, np.ndarray] = {}
        if todo:
            for k, v in zip(todo, self.embedder.embed_preprocessed([pixels[k] for k in todo])):
                made[k] = v
                self._put("image", k, k, v)
            self.images_embedded += len(todo)
        return {k: made[k] if v is None else v for k, v in out.items()}

    def texts(self, prompts: Sequence[str]) -> dict[str, np.ndarray]:
        """Text embeddings of ``prompts`` (as given; the key is the prompt's sha256 in the store).

        Returns:
            ``{prompt: [D] float32}`` for each distinct prompt, not normalised.

        Raises:
            BundleError: the bundle has no text graph.
        """
        keys = list(dict.fromkeys(prompts))
        out = {p: self._get("text", p, sha256_bytes(p.encode())) for p in keys}
        todo = [p for p, v in out.items() if v is None]
        made: dict[str, np.ndarray] = {}
        if todo:
            for p, v in zip(todo, self.embedder.embed_texts(todo)):
                made[p] = v
                self._put("text", p, sha256_bytes(p.encode()), v)
            self.texts_embedded += len(todo)
        return {p: made[p] if v is None else v for p, v in out.items()}

    def stats(self) -> dict[str, int]:
        """``{"images_embedded", "texts_embedded", "embedding_cache_hits"}`` since it was made."""
        return {
            "images_embedded": self.images_embedded,
            "texts_embedded": self.texts_embedded,
            "embedding_cache_hits": self.cache_hits,
        }
