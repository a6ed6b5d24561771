"""The pairs job: decode, encode once per image, score through the registered pair metrics."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path

from ...errors import InputError
from ...engine.stage_clock import stage
from ...runtime.cache import EncodingCache, EncodingStore
from ...runtime.config import ScorerConfig
from ...runtime.embedder import EmbeddingCache, Embedder
from ...runtime.pair_metrics import HostTokens, MetricBatch
from ...runtime.encoder import RunnerSettings
from ...runtime.scorer import EncodedPair, ImageEncoding, MaSCResult, Scorer
from ...runtime.segmenter import Segmenter, SegmenterConfig
from ..executors import Chunk
from ..items import (
    DecodedImage,
    DecodedMask,
    DecodedPair,
    PairError,
    check_mask,
)
from ..loading import ByteBudget
from ..mask_source import MASK_SOURCE_COLUMNS, SAVED_MASK_COLUMNS, SegmenterMasks
from ..results import output_errors
from ..tables import open_fresh
from .columns import FILE_COLUMNS, SCORED_COLUMNS
from .decoding import Loaded, PairDecoding
from .outcome import RowOutcome, _raise, _row_text
from .settings import RunOptions, RunSettings


class PairsJob(PairDecoding):
    """Score rows of a pairs file, or in-memory pairs, with one :class:`Scorer`.

    Every pair goes through :meth:`score_decoded`: masc-run's rows (:meth:`score_rows`, files
    decoded by path in :meth:`load`), one in-memory pair (:meth:`score_item`) and masc-serve's
    request items (:meth:`decode_pair` in its decode threads, then :meth:`score_decoded` on a
    micro-batch) get the same statuses, notes and scores.

    Each distinct image (by content) is encoded once: ``cache`` (an
    :class:`~masc_engine.runtime.cache.EncodingCache`, by default an LRU of ``cache_items``
    encodings in front of ``store``, a persistent content-keyed store shared across runs and
    processes). Files are decoded and reduced (jobs/items.py) by ``io_workers`` threads, each
    file under ``decode_budget`` when one is given.

    With a ``segmenter``, a pair without a mask (an empty or absent mask cell, a ``None`` mask)
    gets the segmenter's mask of its image for its ``object_name``
    (:class:`~masc_engine.jobs.mask_source.SegmenterMasks`: an in-memory LRU, then the
    persistent store, then the segmenter), computed while the image is decoded.

    With ``embedders`` (name -> runtime/embedder.py ``Embedder``), each image is preprocessed by
    the recipe of every embedder the run's metrics read (``settings.metrics``: the classic
    metrics) while it is decoded, and each distinct image embedded once, batched: each embedder's
    :class:`~masc_engine.runtime.embedder.EmbeddingCache` (an LRU in front of ``store``, keyed by
    content and the embedder's identity) serves every image and prompt it embedded before, in
    this job or in any run sharing the store. Those metrics read no mask: a row without masks (an
    empty mask cell, no segmenter) still gets them, its CP and PF statuses saying why they are
    missing (``no_mask_source``), as does a row whose masks fail a check.

    Raises:
        ValueError: ``settings.save_masks`` without a segmenter; a metric whose embedder is not in
            ``embedders``.
    """

    def __init__(
        self,
        scorer: Scorer,
        settings: RunSettings = RunSettings(),
        store: EncodingStore | None = None,
        io_workers: int = 4,
        cache_items: int = 512,
        cache: EncodingCache | None = None,
        decode_budget: ByteBudget | None = None,
        segmenter: Segmenter | None = None,
        embedders: Mapping[str, Embedder] | None = None,
    ):
        if settings.save_masks is not None and segmenter is None:
            raise ValueError("save_masks (--save-masks) needs a segmenter (--segmenter)")
        given = embedders or {}
        missing = [k for k in settings.embedders_needed() if k not in given]
        if missing:
            raise ValueError(f"--metrics reads the {', '.join(missing)} embedder(s): give --embedder NAME=BUNDLE")
        check_backbones(settings, given)
        #: The embedders the run's metrics read, by name.
        self.embedders = {k: given[k] for k in settings.embedders_needed()}
        self.scorer = scorer
        self.settings = settings
        self.io_workers = io_workers
        self.cache = cache if cache is not None else EncodingCache(scorer, cache_items, store)
        self.decode_budget = decode_budget
        self._encoders = {e for m in settings.run_metrics() for e in m.encoders}
        #: Each embedder's embeddings by content (memory, then the persistent store).
        self.embeddings = {
            k: EmbeddingCache(e, store if store is not None else self.cache.store) for k, e in self.embedders.items()
        }
        #: The segmenter's masks for pairs without one, or None (every mask from a file).
        self.masks = (
            None
            if segmenter is None
            else SegmenterMasks(
                segmenter, settings.exif, store if store is not None else self.cache.store, settings.save_masks
            )
        )

    @property
    def images_encoded(self) -> int:
        """Images that went through the vision tower for this job."""
        return self.cache.images_encoded

    @property
    def cache_hits(self) -> int:
        """Images served from the disk store for this job."""
        return self.cache.cache_hits

    def stats(self) -> dict:
        """``{"images_encoded", "cache_hits"}`` since this job was made (executor interface), and
        with a segmenter its counters (``masks_segmented``, ``mask_cache_hits``,
        ``segmenter_images_encoded``), with embedders theirs summed over the embedders
        (``images_embedded``, ``texts_embedded``, ``embedding_cache_hits``)."""
        st = {"images_encoded": self.cache.images_encoded, "cache_hits": self.cache.cache_hits}
        if self.masks is not None:
            st.update(self.masks.stats())
        for c in self.embeddings.values():
            for k, v in c.stats().items():
                st[k] = st.get(k, 0) + v
        return st

    # ---------------------------------------------------------------- encoding

    def encode(self, images: list[DecodedImage]) -> dict:
        """Encodings by content hash; only images in neither cache level go through the vision tower."""
        encs: dict = {}
        sources: dict = {}
        for d in images:
            if d.encoding is not None:
                encs[d.sha256] = d.encoding
        for d in images:
            if d.sha256 not in encs:
                sources.setdefault(d.sha256, d.pre)
        encs.update(self.cache.encode(sources))
        return encs

    # ---------------------------------------------------------------- scoring

    def _save_maps(
        self, folder: str, row_index: int, ref: DecodedImage, out: DecodedImage, it: EncodedPair, sc: MaSCResult
    ) -> dict:
        """Write the pair's CP and PF overlays; returns their paths (absolute; run_pairs makes
        them relative to the output file).

        Raises:
            OutputWriteError: the maps folder cannot be written (full, read-only, no permission).
        """
        from ...runtime.maps import cp_map, pf_map

        if ref.image is None or out.image is None:  # kept by every decode while save_maps is set
            raise ValueError("attribution maps need the decoded PIL images (keep_image)")
        d = Path(folder)
        cp_path, pf_path = d / f"{row_index:07d}_cp.png", d / f"{row_index:07d}_pf.png"
        with output_errors(d, "--save-maps folder"):
            d.mkdir(parents=True, exist_ok=True)
            cp = cp_map(ref.image, it.ref_enc.grid, sc.arrays["cp_best"], it.ref_weights, self.scorer.fg_threshold)
            _save_png(cp, cp_path)
            _save_png(pf_map(out.image, it.out_enc.grid, sc.arrays["pf_attention"], sc.arrays["pf_hidden"]), pf_path)
        return {"cp_map": str(cp_path.resolve()), "pf_map": str(pf_path.resolve())}

    def score_rows(
        self,
        rows: list[dict],
        base: str | Path,
        first_index: int = 1,
        loaded: Loaded | None = None,
        indices: list[int] | None = None,
    ) -> list[dict]:
        """Score rows; ``indices`` are their 1-based row indices (default ``first_index``,
        ``first_index + 1``, ...). Results in input order."""
        images, masks, texts = loaded if loaded is not None else self.load(rows, base)
        indices = indices if indices is not None else list(range(first_index, first_index + len(rows)))
        return self.score_decoded(
            [self._row_pair(i, row, base, images, masks, texts[_row_text(row)]) for i, row in zip(indices, rows)]
        )

    def score_chunk(self, chunk: Chunk, loaded: Loaded | None = None) -> list[dict]:
        """Score a chunk's rows (executor interface); each result carries its ``row_key``."""
        results = self.score_rows(list(chunk.rows), chunk.base, loaded=loaded, indices=list(chunk.indices))
        for r, k in zip(results, chunk.keys):
            r["row_key"] = k
        return results

    def score_item(
        self,
        ref_image,
        ref_mask,
        out_image,
        out_mask,
        prompt: str,
        object_name: str = "",
        row_index: int = 1,
        extra: dict | None = None,
    ) -> dict:
        """Score one in-memory pair; returns the very result record masc-run writes for a row.

        Args:
            ref_image, out_image (bytes | PIL.Image.Image): encoded image bytes (PNG, JPEG, ...) or a PIL image (converted
                to RGB; an 8-bit image is used as it is).
            ref_mask, out_mask (bytes | numpy.ndarray): encoded mask bytes, or a ``[H, W]`` uint8 array (foreground
                non-zero), as masc-run decodes mask files.
            prompt, object_name: the row's ``prompt`` and ``object_name`` cells.
            row_index: the record's ``row_index`` (a service's request item number).
            extra: other cells to carry through (as a pairs file's extra columns).

        Returns:
            a dict with ``RESULT_COLUMNS`` (``row_key`` empty) and the carried cells; a bad input
            gives its status and detail (naming the field), never an exception.
        """
        cells = {**(extra or {}), **{c: c for c in FILE_COLUMNS}, "prompt": prompt, "object_name": object_name}
        files = {"ref_image": ref_image, "ref_mask": ref_mask, "out_image": out_image, "out_mask": out_mask}
        res = self.score_decoded([self.decode_pair(files, prompt, object_name, row_index=row_index, cells=cells)])[0]
        res["row_key"] = ""
        return res

    def check_pair(self, item: DecodedPair) -> list[str]:
        """Whether a decoded pair can be scored (before any inference): its notes if so.

        Raises:
            PairError: a file that could not be read, a mask whose size does not fit its image
                (``mask_size_mismatch``, ``mask_orientation_mismatch``) or an empty cell
                (``bad_row``); ``field`` names the file at fault.
        """
        if item.error is not None:
            raise PairError(item.error.reason, item.error.detail, None)
        for c in FILE_COLUMNS:
            e = item.file(c)
            if isinstance(e, InputError):  # name the column: the same file can be in two
                raise PairError(e.reason, e.detail if c in e.detail else f"{c}: {e.detail}", c)
        st, notes = self.settings, []
        for im_c, m_c, what in (("ref_image", "ref_mask", "reference"), ("out_image", "out_mask", "output")):
            try:
                notes.append(
                    check_mask(item.file(im_c), item.file(m_c), what, item.names[m_c], st.mask_size_tolerance, st.exif)
                )
            except InputError as e:
                raise PairError(e.reason, e.detail, m_c) from None
        return [n for n in notes if n] + list(_raise(item.ref_image).notes) + list(_raise(item.out_image).notes)

    def score_decoded(self, items: list[DecodedPair], stripper: str | None = None) -> list[dict]:
        """Score decoded pairs; one masc-run record per item, in order.

        Each score gets its own outcome (``cp_status``, ``pf_status``; ``status`` is the first
        that is not ``ok``): a pair that cannot be read costs both, a reference mask without a
        usable foreground costs CP only, an output mask hiding every patch costs PF only. Results
        do not depend on which other items are in the call (batches of one patch count only,
        Scorer.encode_preprocessed).

        Args:
            items: pairs from :meth:`decode_pair` or :meth:`load`.
            stripper: PF prompt stripper for items whose prompt is not ``prepared`` (default: the
                scorer's).

        Returns:
            dicts with the item's ``cells``, ``row_index`` and the result columns; NaN scores
            where undefined, with their status (:meth:`RowOutcome.record`).
        """
        metrics = self.settings.run_metrics()
        outcomes = [RowOutcome(it, metrics) for it in items]
        if self.masks is not None:
            for o in outcomes:
                o.values.update(self._mask_columns(o.item))
        encs = self.encode([o for it in items for o in (it.ref_image, it.out_image) if isinstance(o, DecodedImage)])
        ready = [o for o in outcomes if self._admit(o, encs)]
        scored = self.scorer.score_encoded(
            [o.encoded for o in ready], with_arrays=self.settings.save_maps is not None, stripper=stripper
        )
        batch = MetricBatch(
            [o.encoded for o in ready],
            scored,
            HostTokens(self.scorer.host_encoding),
            self.scorer.fg_threshold,
            [_raise(o.item.ref_mask).any_foreground for o in ready],
            [o.item.names["ref_mask"] for o in ready],
            scorer=self.scorer,
        )
        # Metrics that read no SigLIP2 encoder (the classic ones) need no mask: every pair whose
        # two images decoded gets them, the pairs CP and PF could not score included.
        maskless = [m for m in metrics if m.encoders and not any(e.startswith("siglip2.") for e in m.encoders)]
        imaged = [o for o in outcomes if _images_decoded(o.item)] if maskless else []
        if self.embedders:
            self._embed(batch, [o.item for o in imaged])
            batch.image_keys = [_image_keys(o.item) for o in ready]
        plain = MetricBatch(
            [o.item for o in imaged],
            [],
            batch.host_tokens,
            batch.fg_threshold,
            image_keys=[_image_keys(o.item) for o in imaged],
            embeddings=batch.embeddings,
            text_embeddings=batch.text_embeddings,
        )
        with stage("metrics"):
            for m in maskless:
                for o, values in zip(imaged, m.compute(plain)):
                    o.take(m, values)
            computed = [(m, m.compute(batch)) for m in metrics if m not in maskless]
        for k, (o, sc) in enumerate(zip(ready, scored)):
            for m, per_pair in computed:
                o.take(m, per_pair[k])
            self._fill(o, sc)
        return [o.record() for o in outcomes]

    def _embed(self, batch: MetricBatch, items: list[DecodedPair]) -> None:
        """Fill ``batch``'s embeddings: each distinct image of ``items`` embedded by each embedder
        (batched; those its :class:`EmbeddingCache` holds are not run again), and with a text graph
        each distinct prompt as given."""
        images = {d.sha256: d for it in items for d in (_raise(it.ref_image), _raise(it.out_image))}
        for name, cache in self.embeddings.items():
            batch.embeddings[name] = cache.images(
                {k: d.embed_pixels[name] for k, d in images.items() if name in d.embed_pixels}
            )
            if f"{name}.text" in self._encoders:  # CLIP-T: the prompts as given
                batch.text_embeddings[name] = cache.texts([it.prompt for it in items])

    def _mask_columns(self, it: DecodedPair) -> dict:
        """A pair's mask source columns (and with ``save_masks`` the saved PNGs of its segmenter masks)."""
        d = dict(zip(MASK_SOURCE_COLUMNS, it.mask_sources))
        if self.settings.save_masks is not None:
            for col, m in zip(SAVED_MASK_COLUMNS, (it.ref_mask, it.out_mask)):
                d[col] = m.saved if isinstance(m, DecodedMask) else ""
        return d

    def _admit(self, o: RowOutcome, encs: dict[str, ImageEncoding]) -> bool:
        """Check one pair (files, masks, the coverage filter) and make its :class:`EncodedPair`;
        False (with the row's failure in ``o``) when it cannot be scored."""
        st, it = self.settings, o.item
        try:
            o.notes = list(self.check_pair(it))
            ref_mask, out_mask = _raise(it.ref_mask), _raise(it.out_mask)  # check_pair passed: decoded
            o.coverage = (ref_mask.coverage, out_mask.coverage)
            for frac, cov, reason, what in (
                (st.min_reference_mask_frac, ref_mask.coverage, "filtered_reference_mask", "reference"),
                (st.min_output_mask_frac, out_mask.coverage, "filtered_output_mask", "output"),
            ):
                if frac is not None and cov < frac:
                    raise InputError(reason, f"{what} mask covers {cov:.2%} < {frac:.2%} of the image")
            ref_key, out_key = _image_keys(it)
            r, out = encs[ref_key], encs[out_key]
            o.pair = EncodedPair(
                r,
                ref_mask.weights[r.grid],
                out,
                out_mask.weights[out.grid],
                it.prompt,
                it.object_name or None,
                it.prepared,
            )
            return True
        except InputError as e:
            o.fail(e)
            return False

    def _fill(self, o: RowOutcome, sc: MaSCResult) -> None:
        """Put one scored pair's diagnostics, maps and notes into its outcome (its metrics' values
        and statuses are in already: :meth:`RowOutcome.take`)."""
        s, st, ex, it = self.scorer, self.settings, sc.extras, o.item
        o.values.update({k: ex[k] for k in SCORED_COLUMNS})
        if st.save_maps is not None:
            ref, out = _raise(it.ref_image), _raise(it.out_image)
            o.values.update(self._save_maps(st.save_maps, it.row_index, ref, out, o.encoded, sc))
        if not it.object_name.strip():
            o.notes.append("no object_name: the PF prompt was not stripped")
        if not ex["prompt_text"].strip():
            o.prompt_empty = True
            o.notes.append(
                "prompt_empty: PF compares with an empty text"
                + ("" if not it.prompt.strip() else f" (the prompt is only the subject {it.object_name!r})")
            )
        if ex["prompt_truncated"]:
            o.notes.append(f"prompt truncated to {s.text_recipe.max_length} tokens")


def _save_png(img, path: Path) -> None:
    """Write ``img`` as PNG at ``path`` through a temporary file of its own (this process's, made
    afresh: :func:`~masc_engine.jobs.tables.open_fresh`) renamed over ``path``: a link planted at
    ``path`` is replaced by the map, never written through."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        with open_fresh(tmp, binary=True) as f:
            img.save(f, format="PNG")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _image_keys(item: DecodedPair) -> tuple[str, str]:
    """``(reference, output)`` content hashes of a pair whose images decoded."""
    return _raise(item.ref_image).sha256, _raise(item.out_image).sha256


def _images_decoded(item: DecodedPair) -> bool:
    """Whether both images of a pair decoded (and the row itself is readable)."""
    return item.error is None and isinstance(item.ref_image, DecodedImage) and isinstance(item.out_image, DecodedImage)


def check_backbones(settings: RunSettings, embedders: Mapping) -> None:
    """Refuse a metric whose embedder is a bundle of another backbone than its column's recipe
    names (runtime/pair_metrics/classic.py ``BACKBONE_OF``: a DINO column filled by a CLIP bundle
    would carry CLIP's numbers under DINO's name).

    Args:
        embedders: name -> bundle folder, or a loaded ``Embedder``; names not given are skipped.

    Raises:
        ValueError: one line naming the metric, the ``--embedder`` and both backbones.
    """
    from ...runtime.pair_metrics.classic import EMBEDDER_OF, backbone_mismatch

    for m in settings.run_metrics():
        name = EMBEDDER_OF.get(m.name)
        if name is None or name not in embedders:
            continue
        why = backbone_mismatch(m.name, _manifest_of(embedders[name]))
        if why:
            e = embedders[name]
            raise ValueError(f"--embedder {name}={e.bundle.path if hasattr(e, 'bundle') else e}: {why}")


def _manifest_of(embedder) -> dict:
    """An embedder's manifest: a loaded ``Embedder``'s, or read from a bundle folder ({} when it
    cannot be read: loading the bundle refuses it in one line)."""
    from ...engine.manifest import read_manifest
    from ...errors import BundleError

    if hasattr(embedder, "bundle"):
        return embedder.bundle.manifest
    try:
        return read_manifest(embedder)
    except BundleError:
        return {}


def build_pairs_job(
    bundle_dir: str,
    config: ScorerConfig,
    settings: dict,
    io_workers: int,
    cache_dir: str | None = None,
    cache_size_limit: int | None = None,
    segmenter: SegmenterConfig | None = None,
    embedders: dict[str, tuple[str, RunnerSettings, int]] | None = None,
) -> PairsJob:
    """A :class:`PairsJob` on a fresh scorer with the driver's resolved ``config`` (and a fresh
    segmenter from the driver's resolved ``segmenter`` config): the factory Ray workers call
    (picklable through :func:`functools.partial`, so executors need not know this module). The
    bundles are loaded unverified: the driver hashed the files the workers load. With
    ``cache_dir`` the worker reads and writes the same persistent store as the driver (diskcache
    is safe across processes; on several nodes the folder must be shared storage). ``embedders``:
    name -> ``(bundle folder, RunnerSettings, batch_size)`` of the driver's embedders, each loaded
    unverified in the worker as the scorer is."""
    scorer = Scorer(bundle_dir, config, verify=False)
    run_settings = RunSettings(**settings)
    store = RunOptions(cache_dir=cache_dir, cache_size_limit=cache_size_limit).store(scorer, run_settings.exif)
    if store is not None:  # none without a cache folder: the scorer keeps no text store
        scorer.attach_text_store(store)
    seg = None if segmenter is None else segmenter.load(verify=False)
    embs = {
        k: Embedder(path, runners, batch_size=bs, verify=False) for k, (path, runners, bs) in (embedders or {}).items()
    }
    return PairsJob(scorer, run_settings, store=store, io_workers=io_workers, segmenter=seg, embedders=embs)


def _ray_factory(
    scorer: Scorer,
    settings: RunSettings,
    io_workers: int,
    cache_dir=None,
    cache_size_limit=None,
    segmenter: Segmenter | None = None,
    embedders: Mapping[str, Embedder] | None = None,
) -> functools.partial[PairsJob]:
    if scorer.bundle.verify:
        # The workers load the bundle unverified (one hash per run, not per worker): the driver
        # checks every graph file (and weights) they will load, the text graph included, which the
        # driver itself may never load. (TensorRT engines are hashed by their loader.)
        for g in ("vision", "pool", "text", "cp"):
            scorer.bundle.graph_file(g, scorer.config.graph_variant)
    if segmenter is not None and segmenter.bundle.verify:
        segmenter.check_graphs()
    specs = {}
    given = embedders or {}
    for k in settings.embedders_needed():  # those the metrics read: as the local job keeps them
        e = given[k]
        if e.bundle.verify:
            e.check_graphs()
        specs[k] = (str(Path(e.bundle.path).resolve()), e.runner_settings, e.batch_size)
    return functools.partial(
        build_pairs_job,
        str(Path(scorer.bundle.path).resolve()),
        scorer.config,
        settings.as_dict(),
        io_workers,
        None if cache_dir is None else str(Path(cache_dir).resolve()),
        cache_size_limit,
        None if segmenter is None else segmenter.config,
        specs or None,
    )
