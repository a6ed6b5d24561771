"""The one place where masc-serve meets the library: request bytes in, masc-run's record out.

Every scoring rule (mask checks, undefined scores and their statuses, notes in ``status_detail``,
the encoding cache and the on-disk store) is masc-run's own, reached through the job layer's
public calls on in-memory items:

- :meth:`~masc_engine.jobs.pairs.PairsJob.decode_pair` in a request's decode thread: the four
  files decoded, EXIF-oriented and reduced to what scoring needs (patches and mask weights on
  the patch grid; jobs/items.py) one file at a time under the decoded-bytes budget
  (``--max-decoded-mb``), and the PF prompt stripped with the request's stripper and tokenized;
  then :meth:`~masc_engine.jobs.pairs.PairsJob.check_pair`, so ``/v1/score`` answers 422 for a
  file it cannot score before the item reaches the batcher;
- :meth:`~masc_engine.jobs.pairs.PairsJob.score_decoded` on a micro-batch in the batcher's thread:
  inference and the heads only.

So a request gets exactly the ``cp``, ``pf``, ``status`` and extras that masc-run writes for the
same files, and every string in a response is the request's own or the library's (a field is
named by its request name, e.g. ``items[2].out_mask``, in masc-run's messages).

Two things are added for the service:

- **Reference-encoding cache bounded in bytes.** The encoding cache's memory level is
  :class:`ReferenceMemory`: reference encodings by content hash in an LRU whose size is the patch
  tokens' bytes (``cachetools.LRUCache`` with ``getsizeof``), in front of masc-run's optional
  on-disk store. Output encodings are held only by the batch that needs them (evaluation traffic
  repeats references, not outputs).
- **Batches that cannot change a result.** The vision tower and the pooling head run on groups of
  one patch count only (Scorer.encode_preprocessed, Scorer.pool_background): no tensor is padded,
  and every request gets the bits it would get alone (tests/test_serve.py checks equality, not
  closeness).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass

import numpy as np
from cachetools import LRUCache

from ..errors import InputError
from ..jobs.items import DecodedImage, DecodedPair, PairError
from ..jobs.loading import ByteBudget
from ..jobs.pairs import FILE_COLUMNS, PairsJob, RunSettings
from ..runtime.cache import EncodingCache, EncodingStore
from ..runtime.pair import ImageEncoding
from ..runtime.scorer import Scorer
from ..runtime.stripping import STRIPPERS
from ..runtime.text import PromptBudget

#: The strippers a request may ask for unless the server enables others (``--stripper`` and
#: ``extra_strippers``): spaCy's is opt-in, since its model loads in every worker.
DEFAULT_REQUEST_STRIPPERS = tuple(s for s in STRIPPERS if s != "spacy")

#: The four byte fields of a request, in masc-run's column order.
BYTE_FIELDS = FILE_COLUMNS
#: Keys of masc-run's record that are not part of a service response.
_ROW_ONLY = {"row_index", "row_key"}


class FieldError(InputError):
    """A request field is unusable: ``reason`` (machine-readable), ``field`` (e.g.
    ``"ref_image"`` or ``"items[3].out_mask"``) and ``detail`` (one line)."""

    def __init__(self, reason: str, field: str | None, detail: str):
        super().__init__(reason, detail)
        self.field = field


def b64decode_field(value: str, name: str) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padding required) of one field.

    Raises:
        FieldError: reason ``bad_base64`` naming the field.
    """
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise FieldError("bad_base64", name, f"{name} is not valid base64: {e}") from e


@dataclass
class ServiceItem:
    """One request item, decoded in a decode thread, ready for a micro-batch.

    Attributes:
        pair: the job layer's :class:`~masc_engine.jobs.items.DecodedPair`.
        label: prefix naming the item in messages (``""`` or ``"items[3]."``).
        error: the first problem that keeps it from being scored, as a :class:`FieldError`
            (``/v1/score`` answers 4xx with it; ``/v1/score_batch`` returns masc-run's row status
            instead), else ``None``.
    """

    pair: DecodedPair
    label: str = ""
    error: FieldError | None = None


class ReferenceMemory(MutableMapping):
    """The encoding cache's memory level in the service: reference encodings only, in an LRU
    bounded by their patch tokens' bytes (``[N, D] float32`` -> ``4 * N * D``).

    Only the digests in :attr:`admit` (the references of the batch being scored, set by the one
    batch thread) are stored; other encodings (outputs) are refused, so they live only as long as
    their batch holds them.

    Args:
        max_bytes: the bound; 0 disables the cache.
    """

    def __init__(self, max_bytes: int):
        self.enabled = max_bytes > 0
        self.lru: LRUCache[str, ImageEncoding] = LRUCache(
            maxsize=max(1, int(max_bytes)), getsizeof=lambda e: int(e.tokens.nbytes)
        )
        self.admit: set[str] = set()

    def __getitem__(self, key):
        return self.lru[key]

    def get(self, key, default=None):
        return self.lru.get(key, default)

    def __setitem__(self, key, enc) -> None:
        if self.enabled and key in self.admit and enc.tokens.nbytes <= self.lru.maxsize:
            self.lru[key] = enc

    def __delitem__(self, key) -> None:
        del self.lru[key]

    def __contains__(self, key) -> bool:
        return key in self.lru

    def __iter__(self):
        return iter(self.lru)

    def __len__(self) -> int:
        return len(self.lru)

    @property
    def nbytes(self) -> int:
        """Patch-token bytes held."""
        return int(self.lru.currsize) if self.enabled else 0


class ServiceScorer:
    """Decode request items and score micro-batches of them through the pairs job.

    Args:
        scorer: the loaded :class:`Scorer` (its ``stripper`` is the server default).
        settings: masc-run's :class:`RunSettings` (EXIF policy, mask size tolerance).
        cache_bytes: bound of the in-memory reference-encoding LRU, bytes.
        store: masc-run's on-disk :class:`EncodingStore` (``--cache-dir``), or ``None``.
        strippers: strippers a request may ask for (the default is always allowed).
        decoded_bytes: the decoded-bytes budget shared by all decode threads (``--max-decoded-mb``),
            bytes; None: unbounded.
        prompt_budget: the prompt and object-name limits (``--max-prompt-bytes``,
            ``--max-prompt-tokens``).
        segmenter (Segmenter | None): a :class:`~masc_engine.runtime.segmenter.Segmenter` (``--segmenter``): an item
            whose mask field is left out gets the segmenter's mask for its ``object_name``,
            computed in its decode thread (under the decoded-bytes budget) and cached as masc-run
            caches it; None: every mask is sent.
        embedders: name -> runtime/embedder.py ``Embedder`` for the opt-in metrics of
            ``settings.metrics`` (``--metrics``, ``--embedder``); their embeddings are cached as
            masc-run caches them (in ``store`` too).

    Attributes:
        hits, misses: reference lookups (once per distinct reference and batch) found, or not
            found, in memory.
    """

    def __init__(
        self,
        scorer: Scorer,
        settings: RunSettings = RunSettings(),
        cache_bytes: int = 512 * 2**20,
        store: EncodingStore | None = None,
        strippers: tuple[str, ...] = DEFAULT_REQUEST_STRIPPERS,
        decoded_bytes: int | None = None,
        prompt_budget: PromptBudget = PromptBudget(),
        segmenter=None,
        embedders: dict | None = None,
    ):
        self.scorer = scorer
        self.default_stripper = scorer.stripper
        self.strippers = tuple(dict.fromkeys((scorer.stripper, *strippers)))
        self.memory = ReferenceMemory(cache_bytes)
        self.cache = EncodingCache(scorer, store=store, memory=self.memory)
        self.budget = ByteBudget(decoded_bytes) if decoded_bytes else None
        self.prompt_budget = prompt_budget
        self.job = PairsJob(
            scorer,
            # the job's text budget is the server's: masc-run's text rule (prepare_text) reads it
            dataclasses.replace(
                settings, max_prompt_bytes=prompt_budget.max_bytes, max_prompt_tokens=prompt_budget.max_tokens
            ),
            io_workers=1,
            cache=self.cache,
            decode_budget=self.budget,
            segmenter=segmenter,
            embedders=embedders,
        )
        self.hits = 0
        self.misses = 0
        self._count_lock = threading.Lock()

    # ------------------------------------------------------------------ request threads

    def check_text(self, prompt: str | None, object_name: str | None, label: str = "") -> None:
        """The byte budget of the text fields: checked in the request handler, before any decoding.

        Raises:
            FieldError: ``prompt_too_long`` naming ``prompt`` or ``object_name``.
        """
        for name, text in (("prompt", prompt), ("object_name", object_name)):
            try:
                self.prompt_budget.check_text(text, label + name)
            except InputError as e:
                raise FieldError(e.reason, label + name, e.detail) from None

    def check_object_name(self, object_name: str | None, label: str = "") -> None:
        """masc-run's rule for an object name: within the byte budget, then within the token budget
        (the bundle's tokenizer). The rule's one home is the job's
        :meth:`~masc_engine.jobs.pairs.decoding.PairDecoding.prepare_text`, asked here with an
        empty prompt: it judges the object name alone, and the request's prompt is judged with the
        request's own stripper once decoded (:meth:`decode`).

        Raises:
            FieldError: ``prompt_too_long`` (the service's reason for any text over its budget;
                masc-run's row status is ``object_name_too_long``) naming ``object_name``.
        """
        if not object_name:
            return
        refused = self.job.prepare_text("", object_name)  # an empty prompt: no bytes, no tokens
        if isinstance(refused, InputError):
            raise FieldError("prompt_too_long", label + "object_name", label + refused.detail)

    def decode(
        self, data: dict[str, bytes | str], prompt: str, object_name: str | None, stripper: str | None, label: str = ""
    ) -> ServiceItem:
        """Decode one item (base64 text is decoded here), make its PF prompt ready, and check
        whether it can be scored.

        Raises:
            FieldError: a request-shape problem: ``bad_stripper``, ``bad_base64``,
                ``prompt_too_long`` (the prompt or the object name; never a row status).
        """
        stripper = stripper or self.default_stripper
        if stripper not in self.strippers:
            why = (
                f"'{stripper}' is not enabled on this server (enabled: {', '.join(self.strippers)})"
                if stripper in STRIPPERS
                else f"must be one of {', '.join(STRIPPERS)}"
            )
            raise FieldError("bad_stripper", f"{label}stripper", f"{label}stripper {why}")
        self.check_text(prompt, object_name, label)
        self.check_object_name(object_name, label)  # before any file is decoded, as masc-run
        files = {f: b64decode_field(v, label + f) if isinstance(v := data.get(f), str) else v for f in BYTE_FIELDS}
        names = {f: label + f for f in BYTE_FIELDS}
        pair = self.job.decode_pair(files, prompt, object_name, names, stripper)
        del files
        assert pair.prepared is not None  # decode_pair prepares the PF prompt
        try:
            self.prompt_budget.check_tokens(pair.prepared, label + "prompt")
        except InputError as e:
            raise FieldError(e.reason, label + "prompt", e.detail) from None
        error = None
        try:
            self.job.check_pair(pair)
        except PairError as e:
            error = FieldError(e.reason, names.get(e.field or ""), e.detail)  # no field: None
        return ServiceItem(pair, label, error)

    # ------------------------------------------------------------------ the batch thread

    def score(self, items: list[ServiceItem]) -> list[dict]:
        """Score a micro-batch; one record per item, in order (masc-run's row record without
        ``row_index`` and ``row_key``; NaN as ``None``).

        Not thread-safe: one batch at a time (the batcher's single worker).
        """
        refs = {
            it.pair.ref_image.sha256: it.pair.ref_image for it in items if isinstance(it.pair.ref_image, DecodedImage)
        }
        with self._count_lock:
            for sha, ref in refs.items():
                found = self.cache.cached(sha) is not None  # also refreshes its place in the LRU
                hit = found or ref.encoding is not None
                self.hits += hit
                self.misses += not hit
        self.memory.admit = set(refs)
        try:
            records = self.job.score_decoded([it.pair for it in items])
        finally:
            self.memory.admit = set()
        return [_record(r) for r in records]


def _record(res: dict) -> dict:
    out = {}
    for k, v in res.items():
        if k in _ROW_ONLY:
            continue
        if isinstance(v, float) and np.isnan(v):
            v = None
        elif isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out
