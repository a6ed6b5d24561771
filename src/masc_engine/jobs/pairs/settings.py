"""What a pairs run is asked to do: the settings a row's result depends on (fingerprinted) and
the options of how it runs (not fingerprinted)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from collections.abc import Mapping

from ...runtime.cache import EncodingStore
from ...runtime.embedder import Embedder
from ...runtime.io import default_max_file_bytes
from ...runtime.pair_metrics import PairMetric, columns_of, metrics_for, registered
from ...runtime.scorer import Scorer
from ...runtime.segmenter import Segmenter
from ...runtime.text import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_PROMPT_TOKENS, PromptBudget
from ..mask_source import MASK_SOURCE_COLUMNS, SAVED_MASK_COLUMNS
from ..tables import DEFAULT_MAX_PAIRS_BYTES
from .columns import MAP_COLUMNS, result_columns, schema_identity, schema_label


@dataclass(frozen=True)
class RunSettings:
    """Everything besides the bundle that can change a row's result (part of the fingerprint).

    Attributes:
        exif: ``"apply"`` or ``"ignore"`` (runtime/io.py).
        min_reference_mask_frac / min_output_mask_frac: the paper's coverage filter (0.05 in the
            paper, 0.005 for ORIDa); ``None`` disables it.
        mask_size_tolerance: a mask up to this many pixels off its image's size is stretched
            (the reference's behaviour) instead of refused; 0 refuses any difference.
        baselines: add the same-forward-pass baseline columns (``BASELINE_COLUMNS``).
        save_maps: folder for per-pair attribution PNGs (runtime/maps.py), or ``None``.
        save_masks: folder for the segmenter's masks as PNGs (jobs/mask_source.py), or ``None``;
            needs a segmenter.
        max_prompt_bytes, max_prompt_tokens: the text budget of a row (masc-serve's defaults,
            runtime/text.py): its prompt and its object name each at most ``max_prompt_bytes``
            UTF-8 bytes, checked before anything is tokenized; the object name and the stripped
            prompt each at most ``max_prompt_tokens`` tokens (the bundle's tokenizer, before
            truncation). Over it: ``prompt_too_long`` / ``object_name_too_long``.
        max_file_bytes: byte cap of a file named as an image or mask, checked from its size
            before it is read (``file_too_large``); None: 4 bytes a pixel of the pixel budget
            plus 16 MiB (runtime/io.py ``default_max_file_bytes``).
        metrics: metric names asked for by name (``masc-run --metrics``: ``clip_i``, ``dino``, ...,
            runtime/pair_metrics/classic.py) besides those every run computes (named ones of those
            are dropped); None: none (the default set). Recorded and fingerprinted only when set.

    Raises:
        ValueError: ``metrics`` names no registered metric (one line naming ``--metrics``).
    """

    exif: str = "apply"
    min_reference_mask_frac: float | None = None
    min_output_mask_frac: float | None = None
    mask_size_tolerance: int = 0
    baselines: bool = False
    save_maps: str | None = None
    save_masks: str | None = None
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_file_bytes: int | None = None
    metrics: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.metrics is not None:
            names = tuple(dict.fromkeys(str(n).strip() for n in self.metrics))
            known = [m.name for m in registered()]
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ValueError(f"--metrics: unknown metric(s) {', '.join(unknown)}; registered: {', '.join(known)}")
            # Metrics every run computes (cp, pf) add nothing: naming only them is the default run.
            # Kept in registration order (column order): the order given changes nothing.
            opted = tuple(m.name for m in registered() if m.name in names and m.option is not None)
            object.__setattr__(self, "metrics", opted or None)

    def as_dict(self) -> dict:
        """The fields as a dict, ``save_masks``, ``metrics`` and the budgets only when not their defaults (what
        the fingerprint hashes and the sidecar records: unchanged for runs without them)."""
        d = asdict(self)
        for k, v in _OPTIONAL_SETTINGS.items():
            if d[k] == v:
                del d[k]
        return d

    def prompt_budget(self) -> PromptBudget:
        """The text budget of a row (:attr:`max_prompt_bytes`, :attr:`max_prompt_tokens`)."""
        return PromptBudget(self.max_prompt_bytes, self.max_prompt_tokens)

    def file_cap(self) -> int:
        """The byte cap of an image or mask file, bytes."""
        return default_max_file_bytes() if self.max_file_bytes is None else int(self.max_file_bytes)

    def metric_options(self) -> frozenset[str]:
        """The opt-in metric families these settings ask for (``{"baselines"}``)."""
        return frozenset({"baselines"} if self.baselines else ())

    def run_metrics(self) -> tuple[PairMetric, ...]:
        """The registered pair metrics a run with these settings computes, in order: those of
        :meth:`metric_options` and those named in :attr:`metrics`."""
        named = set(self.metrics or ()) | {m.name for m in metrics_for(self.metric_options())}
        return tuple(m for m in registered() if m.name in named)

    def embedders_needed(self) -> tuple[str, ...]:
        """The embedders (``masc-run --embedder NAME=...``) the computed metrics read, in order: the
        prefix of each encoder that is not SigLIP2's (``clip.image`` -> ``clip``)."""
        names = [e.split(".")[0] for m in self.run_metrics() for e in m.encoders if not e.startswith("siglip2.")]
        return tuple(dict.fromkeys(names))

    def result_columns(self, segmenter: bool = False) -> tuple[str, ...]:
        """The result columns a run with these settings (and a segmenter or not) writes, in order."""
        opted = columns_of(tuple(m for m in self.run_metrics() if m.option is not None))
        return (
            result_columns(self.run_metrics())
            + (MASK_SOURCE_COLUMNS if segmenter else ())
            + opted
            + (MAP_COLUMNS if self.save_maps else ())
            + (SAVED_MASK_COLUMNS if self.save_masks else ())
        )

    def _budget_identity(self) -> dict:
        """The budgets set away from their defaults, under their masc-run options."""
        d = {}
        for k, option in _BUDGET_OPTIONS.items():
            v = getattr(self, k)
            if v != _OPTIONAL_SETTINGS[k]:
                d[option] = v / 2**20 if k == "max_file_bytes" else v
        return d

    def identity(
        self, scorer: Scorer, segmenter: Segmenter | None = None, embedders: Mapping[str, Embedder] | None = None
    ) -> dict:
        """The settings a row's result depends on, each under the masc-run option that sets it
        (``--bundle``, ``--segmenter``: their content fingerprints): what a rerun on the same
        output compares (jobs/results.py ``settings_diff``). The same settings as
        :meth:`fingerprint`. ``embedders``: name -> runtime/embedder.py ``Embedder``; those the
        metrics read enter under ``--embedder NAME``."""
        d = {
            "--bundle": scorer.bundle.fingerprint,
            "--exif": self.exif,
            **scorer.config.option_identity(),
            "--min-reference-mask-frac": self.min_reference_mask_frac,
            "--min-output-mask-frac": self.min_output_mask_frac,
            "--mask-size-tolerance": self.mask_size_tolerance,
            "--baselines": self.baselines,
            "--save-maps": self.save_maps,
            **self._budget_identity(),
        }
        schema = schema_identity(self.run_metrics())
        if schema:
            d["result schema"] = schema_label(schema)
        if self.metrics is not None:
            d["--metrics"] = ",".join(self.metrics)
        d.update({f"--embedder {k}": v["fingerprint"] for k, v in self._embedder_identity(embedders).items()})
        if segmenter is not None:
            d.update({**segmenter.option_identity(), "--save-masks": self.save_masks})
        return d

    def _embedder_identity(self, embedders: Mapping[str, Embedder] | None) -> dict:
        """``name -> Embedder.identity()`` of the embedders the computed metrics read (given ones only)."""
        given = embedders or {}
        return {k: given[k].identity() for k in self.embedders_needed() if k in given}

    def fingerprint(
        self, scorer: Scorer, segmenter: Segmenter | None = None, embedders: Mapping[str, Embedder] | None = None
    ) -> str:
        """16 hex digits identifying these settings with the scorer's (a journal is reused only
        under the same fingerprint): the run settings, the bundle's fingerprint, the scorer's
        ``config.identity()`` and, with a segmenter, its ``identity()``.

        Settings added after journals existed (``save_masks``, the segmenter, a result schema other
        than the built-in one: jobs/pairs/columns.py ``schema_identity``) enter only when they are set,
        so a run without them keeps the fingerprint it always had; the embedders the metrics read
        (``Embedder.identity()``) enter likewise."""
        d = {
            "run": self.as_dict(),
            "bundle": scorer.bundle.fingerprint,
            **scorer.config.identity(),
            **schema_identity(self.run_metrics()),
        }
        if self._embedder_identity(embedders):
            d["embedders"] = self._embedder_identity(embedders)
        if segmenter is not None:
            d["segmenter"] = segmenter.identity()
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


#: Settings recorded (and fingerprinted) only when they differ from these defaults.
_OPTIONAL_SETTINGS = {
    "save_masks": None,
    "max_prompt_bytes": DEFAULT_MAX_PROMPT_BYTES,
    "max_prompt_tokens": DEFAULT_MAX_PROMPT_TOKENS,
    "max_file_bytes": None,
    "metrics": None,
}
_BUDGET_OPTIONS = {
    "max_prompt_bytes": "--max-prompt-bytes",
    "max_prompt_tokens": "--max-prompt-tokens",
    "max_file_bytes": "--max-file-mb",
}


def encoding_namespace(scorer: Scorer, exif: str) -> dict:
    """The disk store's namespace (runtime/cache.py ``EncodingStore``) for ``scorer``'s encodings:
    everything that changes a stored token or text embedding. masc-run and masc-serve both use it,
    so the two share entries exactly when their encodings are interchangeable.

    Args:
        scorer: the scorer whose encodings are stored.
        exif: the EXIF orientation policy (``RunSettings.exif``).
    """
    return {"bundle": scorer.bundle.fingerprint, "exif": exif, **scorer.config.encoding_identity()}


@dataclass(frozen=True)
class RunOptions:
    """How :func:`run_pairs` runs (none of these changes a row's result).

    Attributes:
        chunk_size: rows decoded, scored and journaled per step.
        io_workers: decoding threads per job.
        cache_dir: the persistent encoding store's folder (``--cache-dir``), or None.
        cache_size_limit: its bound in bytes (None: the store's default).
        executor: ``local`` or ``ray``.
        ray_address, ray_workers: the Ray cluster and its number of actors.
        progress: draw a progress bar.
        overwrite: replace results made with other settings.
        max_pairs_bytes: the pairs file's byte budget (``--max-pairs-mb``; None: none).
    """

    chunk_size: int = 64
    io_workers: int = 4
    cache_dir: str | None = None
    cache_size_limit: int | None = None
    executor: str = "local"
    ray_address: str | None = None
    ray_workers: int | None = None
    progress: bool = True
    overwrite: bool = False
    max_pairs_bytes: int | None = DEFAULT_MAX_PAIRS_BYTES

    def store(self, scorer: Scorer, exif: str) -> EncodingStore | None:
        """The persistent encoding store these options name, or None."""
        if self.cache_dir is None:
            return None
        return EncodingStore(
            self.cache_dir,
            encoding_namespace(scorer, exif),
            **({"size_limit": self.cache_size_limit} if self.cache_size_limit else {}),
        )
