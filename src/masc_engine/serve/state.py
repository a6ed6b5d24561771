"""What masc-serve holds while it runs: its options (:class:`ServeConfig`) and the loaded
service (:class:`ServiceState`: the scorer, the micro-batcher, the decode pool, metrics)."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..runtime.config import ScorerConfig
from ..runtime.segmenter import SegmenterConfig
from ..runtime.text import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_PROMPT_TOKENS
from .batcher import MicroBatcher
from .glue import DEFAULT_REQUEST_STRIPPERS, ServiceScorer
from .metrics import ServiceMetrics

if TYPE_CHECKING:
    from ..runtime.cache import EncodingStore

log = logging.getLogger("masc_engine.serve")


@dataclass
class ServeConfig:
    """Every option of ``masc-serve`` (cli/serve_cmd.py documents each)."""

    bundle: str
    #: The scorer's settings (masc-run's and masc-rank's option group); its ``stripper`` is the
    #: default for requests that name none.
    scorer: ScorerConfig = ScorerConfig()
    exif: str = "apply"
    mask_size_tolerance: int = 0
    max_batch: int = 8
    max_wait_ms: float = 5.0
    max_queue: int = 256
    cache_mb: float = 512.0
    cache_dir: str | None = None
    cache_size_gb: float | None = None
    max_body_mb: float = 64.0
    max_pixels: int = 40_000_000
    max_batch_items: int = 64
    request_timeout_s: float = 60.0
    body_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    max_connections: int | None = 128
    decode_workers: int = 2
    max_decoded_mb: float = 1024.0
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    extra_strippers: tuple[str, ...] = DEFAULT_REQUEST_STRIPPERS
    #: The segmenter (``--segmenter``): with one, a request's mask fields are optional (computed
    #: from its object_name); None: every mask is sent.
    segmenter: SegmenterConfig | None = None
    #: The bearer token every request but the probes must carry (``--api-key-file``); None: no check.
    api_key: bytes | None = dataclasses.field(default=None, repr=False)
    #: Serve Swagger UI at ``/docs`` and ReDoc at ``/redoc`` (their assets load from a CDN).
    docs: bool = False
    #: The opt-in metrics every response carries (``--metrics``: the classic ones), or None.
    metrics: tuple[str, ...] | None = None
    #: Embedder bundle folders by name (``--embedder NAME=BUNDLE``) for those metrics.
    embedders: dict | None = None

    def run_settings(self):
        """masc-run's :class:`~masc_engine.jobs.pairs.RunSettings` of this server (EXIF policy,
        mask size tolerance, metrics).

        Raises:
            ValueError: an unknown metric name (one line naming ``--metrics``).
        """
        from ..jobs.pairs import RunSettings

        return RunSettings(exif=self.exif, mask_size_tolerance=self.mask_size_tolerance, metrics=self.metrics)


def _logged_warnings(load):
    """``load()``, its random-weights warning one log line, not a Python warning pointing into the
    library."""
    from ..engine.bundle import RandomWeightsWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RandomWeightsWarning)
        obj = load()
    for w in caught:
        log.warning("masc-serve: %s", w.message)
    return obj


class ServiceState:
    """The service's state: loaded in a background thread at startup (:meth:`load`), then ready."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.metrics = ServiceMetrics()
        self.ready = False
        self.load_error: str | None = None
        self.service: ServiceScorer | None = None
        self.batcher: MicroBatcher | None = None
        self.decode_pool = ThreadPoolExecutor(cfg.decode_workers, thread_name_prefix="masc-decode")
        self.store: EncodingStore | None = None

    def load(self) -> None:
        """Load the bundle (and the segmenter), run their graphs once, then mark ready (runs in a
        thread at startup)."""
        try:
            from ..runtime.embedder import Embedder
            from ..runtime.scorer import Scorer
            from ..runtime.text import PromptBudget

            cfg = self.cfg
            scorer = _logged_warnings(lambda: Scorer(cfg.bundle, cfg.scorer))
            segmenter = None
            if cfg.segmenter is not None:  # on the scorer's provider unless one was chosen
                seg = cfg.segmenter
                if seg.provider is None and scorer.provider in ("cpu", "cuda"):
                    seg = dataclasses.replace(seg, provider=scorer.provider)
                segmenter = _logged_warnings(seg.load)
            if cfg.cache_dir:
                from ..jobs.pairs import encoding_namespace
                from ..runtime.cache import EncodingStore

                # masc-run's namespace: the two commands share entries (masks too).
                kw = {"size_limit": int(cfg.cache_size_gb * 2**30)} if cfg.cache_size_gb else {}
                self.store = EncodingStore(cfg.cache_dir, encoding_namespace(scorer, cfg.exif), **kw)
                scorer.attach_text_store(self.store)
            settings = cfg.run_settings()
            embedders = {
                k: _logged_warnings(lambda k=k: Embedder((cfg.embedders or {})[k])) for k in settings.embedders_needed()
            }
            service = ServiceScorer(
                scorer,
                settings,
                cache_bytes=int(cfg.cache_mb * 2**20),
                store=self.store,
                strippers=cfg.extra_strippers,
                decoded_bytes=int(cfg.max_decoded_mb * 2**20),
                prompt_budget=PromptBudget(cfg.max_prompt_bytes, cfg.max_prompt_tokens),
                segmenter=segmenter,
                embedders=embedders,
            )
            warm_up(service)
            self.service = service
            self.batcher = MicroBatcher(
                self._score_batch, cfg.max_batch, cfg.max_wait_ms, cfg.max_queue, on_batch=self.metrics.observe_batch
            )
            self.ready = True
            self.metrics.ready.set(1)
            log.info(
                "masc-serve: ready (bundle %s%s)",
                cfg.bundle,
                f", segmenter {cfg.segmenter.bundle}" if cfg.segmenter else "",
            )
        except Exception as e:  # noqa: BLE001 - reported by /readyz and the log, the process stays up
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("masc-serve: could not load the bundle: %s", self.load_error)

    def _score_batch(self, items):
        out = self.service.score(items)
        self.metrics.cache.update(self.service)
        self.metrics.update_cache_faults(self.store)
        return out

    def cache_status(self) -> str:
        """The persistent cache (``--cache-dir``): ``"off"``, ``"ok"``, or ``"degraded"`` once a
        storage fault made the service bypass it (the log has the cause)."""
        if self.store is None:
            return "off"
        return "ok" if self.store.fault is None else "degraded"

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close(timeout=60)
        self.decode_pool.shutdown(wait=True)
        if self.store is not None:
            self.store.close()


def warm_up(service: ServiceScorer) -> None:
    """One pair through every graph, so the first request pays no session warm-up."""
    import io

    import numpy as np
    from PIL import Image

    def png(arr) -> bytes:
        b = io.BytesIO()
        Image.fromarray(arr).save(b, format="PNG")
        return b.getvalue()

    rng = np.random.default_rng(0)
    im = png(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    m = np.zeros((64, 64), np.uint8)
    m[16:48, 16:48] = 255
    item = service.decode(
        {"ref_image": im, "ref_mask": png(m), "out_image": im, "out_mask": png(m)}, "a photo of a thing", "thing", None
    )
    service.score([item])
    if service.job.masks is not None:  # the segmenter's graphs too (its mask is not cached)
        service.job.masks.segmenter.segment([Image.open(io.BytesIO(im))], ["thing"])
    service.memory.clear()
    service.hits = service.misses = 0
