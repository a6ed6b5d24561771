"""The pairs job's decoding half: rows and in-memory pairs to :class:`DecodedPair` (files decoded,
masks read or segmented, PF text checked against its budgets and tokenized), everything but
inference. :class:`~masc_engine.jobs.pairs.job.PairsJob` inherits it; kept apart so that each
module reads at once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import TypeAlias

from ...engine.stage_clock import timed
from ...errors import InputError
from ...runtime.cache import EncodingCache
from ...runtime.embedder import Embedder
from ...runtime.io import read_bytes
from ...runtime.scorer import Scorer
from ...runtime.text import PreparedPrompt
from ..items import (
    DecodedImage,
    DecodedMask,
    DecodedPair,
    array_mask,
    decode_image,
    decode_mask,
    reduce_image,
)
from ..loading import ByteBudget, load_all
from ..mask_source import SEGMENTER, SegmenterMasks
from ..tables import resolve_path
from .columns import FILE_COLUMNS, MASK_COLUMNS
from .outcome import _raise, _row_text
from .settings import RunSettings

#: What :meth:`PairDecoding.load` gives: images and masks by path, prepared texts by ``(prompt,
#: object_name)``, each value the decoded object or the :class:`InputError` it raised.
Loaded: TypeAlias = tuple[
    dict[str, DecodedImage | InputError],
    dict[str, DecodedMask | InputError],
    dict[tuple[str, str], PreparedPrompt | InputError],
]


class PairDecoding:
    """Decoding for :class:`~masc_engine.jobs.pairs.job.PairsJob`: its files, masks and texts.

    Reads the job's attributes declared below (set by ``PairsJob.__init__``); holds no state of
    its own.
    """

    scorer: Scorer
    settings: RunSettings
    cache: EncodingCache
    decode_budget: ByteBudget | None
    io_workers: int
    embedders: dict[str, Embedder]
    masks: SegmenterMasks | None

    def _image(self, v, name: str, subjects=()) -> DecodedImage | InputError:
        """Image bytes or a PIL image -> :class:`DecodedImage` (segmented for ``subjects``), or
        the :class:`InputError`."""
        keep = self.settings.save_maps is not None
        try:
            if isinstance(v, (bytes, bytearray, memoryview)):
                return decode_image(
                    bytes(v),
                    name,
                    self.scorer,
                    self.cache,
                    self.settings.exif,
                    self.decode_budget,
                    keep_image=keep,
                    masks=self.masks,
                    subjects=subjects,
                    embedders=self.embedders,
                )
            return reduce_image(
                v,
                name,
                self.scorer,
                self.cache,
                keep_image=keep,
                masks=self.masks,
                subjects=subjects,
                embedders=self.embedders,
            )
        except InputError as e:
            return e

    def _subject_error(self, subject: str) -> InputError | None:
        """Why the segmenter cannot make a mask for ``subject`` (``no_mask_source`` without a
        segmenter or a subject name, ``mask_prompt_too_long``), or None."""
        if self.masks is None:
            return InputError("no_mask_source", "no mask given, and no segmenter to compute one (--segmenter)")
        try:
            self.masks.prompt(subject)
        except InputError as e:
            return e
        return None

    def _segmented(self, image, subject: str) -> DecodedMask | InputError:
        """The segmenter's mask of a decoded image for ``subject`` (or why there is none)."""
        e = self._subject_error(subject)
        if e is not None:
            return e
        if not isinstance(image, DecodedImage):
            return image  # the image's own error (check_pair reports the image first)
        return image.segmented[subject]

    def _mask(self, v, name: str, grids) -> DecodedMask | InputError:
        """Mask bytes or a ``[H, W] uint8`` array -> :class:`DecodedMask` on ``grids``, or the error."""
        try:
            if isinstance(v, (bytes, bytearray, memoryview)):
                return decode_mask(bytes(v), name, grids, self.settings.exif, self.decode_budget)
            return array_mask(v, name, grids)
        except InputError as e:
            return e

    def _sides(self, row: dict, base) -> list[tuple[str, str | None]] | None:
        """A row's ``(image path, mask path)`` per side (mask ``None``: the segmenter's), or None
        when the row is a ``bad_row`` (an empty image cell; an empty mask cell with neither a
        segmenter nor a metric that reads no mask)."""
        sides = []
        for im_c, m_c in (("ref_image", "ref_mask"), ("out_image", "out_mask")):
            image, mask = (row.get(im_c) or "").strip(), (row.get(m_c) or "").strip()
            if not image or (not mask and self.masks is None and not self.embedders):
                return None
            sides.append((resolve_path(base, row[im_c]), resolve_path(base, row[m_c]) if mask else None))
        return sides

    def _text_error(self, prompt: str, subject: str) -> InputError | None:
        """``prompt_too_long`` / ``object_name_too_long`` for text over the byte budget (nothing
        tokenized; a text with more characters than the budget has bytes is not even encoded)."""
        budget = self.settings.prompt_budget()
        for name, text, reason in (
            ("prompt", prompt, "prompt_too_long"),
            ("object_name", subject, "object_name_too_long"),
        ):
            try:
                budget.check_text(text, name)
            except InputError as e:
                return InputError(reason, f"{e.detail} (--max-prompt-bytes)")
        return None

    def prepare_text(self, prompt: str, subject: str) -> PreparedPrompt | InputError:
        """A row's PF prompt stripped and tokenized, once its prompt and object name are within the
        byte budget and the object name and the stripped prompt within the token budget; else the
        row's ``prompt_too_long`` / ``object_name_too_long``."""
        e = self._text_error(prompt, subject)
        if e is not None:
            return e
        budget = self.settings.prompt_budget()
        if subject.strip():
            n = self.scorer.prompt_tokenizer.encode([subject])[0].n_tokens
            if n > budget.max_tokens:
                return InputError(
                    "object_name_too_long",
                    f"object_name: {n} tokens, over the budget of {budget.max_tokens} tokens (--max-prompt-tokens)",
                )
        prepared = self.scorer.prepare_prompt(prompt, subject or None)
        try:
            budget.check_tokens(prepared, "prompt")
        except InputError as over:
            return InputError(over.reason, f"{over.detail} (--max-prompt-tokens)")
        return prepared

    @timed("load (decode, preprocess, text; its threads)")
    def load(self, rows: Iterable[dict], base: str | Path) -> Loaded:
        """Check and prepare the rows' text (:meth:`prepare_text`, once per distinct prompt and
        object name), then, for the rows whose text is within budget, decode the distinct images
        (each segmented for the subject names of its mask-less rows), then the distinct masks
        (onto the grids of the images they are paired with): ``(images, masks, texts)``, images
        and masks by path, texts by ``(prompt, object_name)``, each value a
        :class:`DecodedImage` / :class:`DecodedMask` / :class:`PreparedPrompt` or the
        :class:`InputError` it raised."""
        paired: dict[str, set[str]] = defaultdict(set)  # mask path -> its images' paths
        subjects: dict[str, set[str]] = defaultdict(set)  # image path -> subject names to segment it for
        image_paths: set[str] = set()
        texts: dict[tuple[str, str], PreparedPrompt | InputError] = {}
        for row in rows:
            subject = row.get("object_name") or ""
            text = _row_text(row)
            if text not in texts:
                texts[text] = self.prepare_text(*text)
            if isinstance(texts[text], InputError):
                continue  # the row's status: none of its files is read
            for image, mask in self._sides(row, base) or ():
                image_paths.add(image)
                if mask is not None:
                    paired[mask].add(image)
                elif self._subject_error(subject) is None:
                    subjects[image].add(subject)

        cap = self.settings.file_cap()

        def load_image(p: str) -> DecodedImage:
            return _raise(self._image(read_bytes(p, "image", cap), p, sorted(subjects.get(p, ()))))

        images = load_all(image_paths, load_image, self.io_workers)

        def load_mask(p: str) -> DecodedMask:
            grids = {im.grid for im in (images[i] for i in paired[p]) if isinstance(im, DecodedImage)}
            return _raise(self._mask(read_bytes(p, "mask", cap), p, sorted(grids)))

        return images, load_all(paired, load_mask, self.io_workers), texts

    def decode_pair(
        self,
        files: dict,
        prompt: str,
        object_name: str | None = None,
        names: dict | None = None,
        stripper: str | None = None,
        row_index: int = 1,
        cells: dict | None = None,
    ) -> DecodedPair:
        """Decode one in-memory pair (each file an independent result, as masc-run's loader) and
        make its PF prompt ready (stripped with ``stripper``, tokenized): everything but
        inference, for a thread other than the one that batches inference.

        Args:
            files: ``ref_image``/``out_image`` -> encoded image bytes or a PIL image;
                ``ref_mask``/``out_mask`` -> encoded mask bytes or a ``[H, W] uint8`` array, or
                None / absent: the segmenter's mask for ``object_name`` (``no_mask_source``
                without a segmenter or a subject name).
            prompt: the pair's prompt.
            object_name: the pair's subject (None or ``""``: the prompt is not stripped).
            names: how each file is named in messages (default: the field name).
            stripper: ``regex``, ``spacy`` or ``none`` (default: the scorer's).
            row_index: the record's ``row_index``.
            cells: the record's other cells, carried through.

        Returns:
            a :class:`DecodedPair`; a bad file is that file's :class:`InputError` in it, never an
            exception.
        """
        names = {**{c: c for c in FILE_COLUMNS}, **(names or {})}
        subject = object_name or ""
        ims: list[DecodedImage | InputError] = []
        masks: list[DecodedMask | InputError] = []
        sources: list[str] = []
        for im_c, m_c in (("ref_image", "ref_mask"), ("out_image", "out_mask")):
            given = files.get(m_c) is not None
            segment = not given and self._subject_error(subject) is None
            im = self._image(files[im_c], names[im_c], [subject] if segment else ())
            ims.append(im)
            if given:
                masks.append(self._mask(files[m_c], names[m_c], [im.grid] if isinstance(im, DecodedImage) else []))
            else:
                masks.append(self._segmented(im, subject))
            sources.append("file" if given else (SEGMENTER if segment else ""))
        prepared = self.scorer.prepare_prompt(prompt or "", object_name or None, stripper)
        return DecodedPair(
            ims[0],
            masks[0],
            ims[1],
            masks[1],
            prompt=prompt or "",
            object_name=subject,
            names=names,
            prepared=prepared,
            row_index=row_index,
            cells=dict(cells or {}),
            mask_sources=(sources[0], sources[1]),
        )

    def _row_pair(
        self, index: int, row: dict, base, images: dict, masks: dict, text: PreparedPrompt | InputError
    ) -> DecodedPair:
        """One row's :class:`DecodedPair` from the loaded files and its prepared ``text`` (the
        text's error first: its files were not read; then a ``bad_row`` for an empty cell the run
        cannot fill)."""
        prompt, obj = _row_text(row)
        # a refused row's masks come from nowhere: "file" only where its cell names one
        ref_m, out_m = ("file" if (row.get(c) or "").strip() else "" for c in MASK_COLUMNS)
        named = (ref_m, out_m)
        if isinstance(text, InputError):
            return DecodedPair(
                text, text, text, text, prompt, obj, row_index=index, cells=row, error=text, mask_sources=named
            )
        sides = self._sides(row, base)
        if sides is None:
            empty = [c for c in FILE_COLUMNS if not (row.get(c) or "").strip()]
            e = InputError("bad_row", f"empty column(s): {', '.join(empty)}")
            return DecodedPair(e, e, e, e, prompt, obj, row_index=index, cells=row, error=e, mask_sources=named)
        ims: list[DecodedImage | InputError] = []
        side_masks: list[DecodedMask | InputError] = []
        names: dict[str, str] = {}
        sources: list[str] = []
        for (image, mask), im_c, m_c in zip(sides, ("ref_image", "out_image"), ("ref_mask", "out_mask")):
            names[im_c] = image
            ims.append(images[image])
            if mask is not None:
                names[m_c] = mask
                side_masks.append(masks[mask])
            else:
                names[m_c] = f"segmenter mask of {image}"
                side_masks.append(self._segmented(images[image], obj))
            sources.append("file" if mask is not None else (SEGMENTER if self._subject_error(obj) is None else ""))
        return DecodedPair(
            ims[0],
            side_masks[0],
            ims[1],
            side_masks[1],
            prompt=prompt,
            object_name=obj,
            names=names,
            prepared=text,
            row_index=index,
            cells=row,
            mask_sources=(sources[0], sources[1]),
        )
