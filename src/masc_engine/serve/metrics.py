"""Prometheus metrics of masc-serve (``prometheus-client``; one registry per app).

Names follow Prometheus conventions (``_total`` counters, ``_seconds`` histograms). One process
serves one registry: run replicas as separate processes and let Prometheus scrape each.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _CacheGauges:
    def __init__(self, reg: CollectorRegistry):
        self.hits = Counter(
            "masc_reference_cache_hits_total", "reference encodings found in the cache", ["tier"], registry=reg
        )
        self.misses = Counter(
            "masc_reference_cache_misses_total", "reference encodings found in no in-memory cache", registry=reg
        )
        self.bytes = Gauge(
            "masc_reference_cache_bytes", "patch-token bytes held by the in-memory reference LRU", registry=reg
        )
        self.items = Gauge("masc_reference_cache_items", "encodings held by the in-memory reference LRU", registry=reg)
        self._seen = {"memory": 0, "disk": 0, "miss": 0}

    def update(self, service) -> None:
        """Advance the counters to the service's running totals (called after each batch).

        Args:
            service (ServiceScorer): the :class:`~masc_engine.serve.glue.ServiceScorer` (``hits``, ``misses``,
                its reference ``memory`` and its encoding ``cache``'s disk hits).
        """
        for tier, total in (("memory", service.hits), ("disk", service.cache.cache_hits)):
            self.hits.labels(tier).inc(max(0, total - self._seen[tier]))
            self._seen[tier] = total
        self.misses.inc(max(0, service.misses - self._seen["miss"]))
        self._seen["miss"] = service.misses
        self.bytes.set(service.memory.nbytes)
        self.items.set(len(service.memory))


class ServiceMetrics:
    """Requests by path and status code (every code the server answers, 5xx included), errors by
    reason, batch sizes, queue wait, latency, inference time, cache."""

    def __init__(self) -> None:
        reg = self.registry = CollectorRegistry()
        self.requests = Counter("masc_requests_total", "HTTP requests", ["path", "code"], registry=reg)
        self.errors = Counter("masc_errors_total", "requests refused, by reason", ["reason"], registry=reg)
        self.latency = Histogram(
            "masc_request_latency_seconds", "request latency", ["path"], buckets=_LATENCY_BUCKETS, registry=reg
        )
        self.batch_size = Histogram("masc_batch_size", "items per micro-batch", buckets=_BATCH_BUCKETS, registry=reg)
        self.queue_wait = Histogram(
            "masc_queue_wait_seconds",
            "time an item waited for its batch to start",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.inference = Histogram(
            "masc_batch_seconds", "time to score one micro-batch", buckets=_LATENCY_BUCKETS, registry=reg
        )
        self.in_flight = Gauge("masc_requests_in_flight", "requests being handled", ["path"], registry=reg)
        self.queue_depth = Gauge("masc_queue_depth", "items waiting for a micro-batch", registry=reg)
        self.ready = Gauge("masc_ready", "1 once the bundle is loaded and warm", registry=reg)
        self.cache = _CacheGauges(reg)
        self.cache_faults = Counter(
            "masc_cache_faults_total",
            "persistent-cache (--cache-dir) operations not "
            "served because of a storage fault (the cache is bypassed after the first)",
            registry=reg,
        )
        self._cache_faults_seen = 0
        self.paths: frozenset[str] = frozenset()

    def label_paths(self, paths: Iterable[str]) -> None:
        """Set the paths counted under their own ``path`` label: the app's routes (``create_app``
        passes them once they are all added); any other path counts as ``"other"``.

        Args:
            paths: URL paths (``"/v1/score/upload"``), each a route's.
        """
        self.paths = frozenset(paths)

    def update_cache_faults(self, store) -> None:
        """Advance ``masc_cache_faults_total`` to the persistent store's running count.

        Args:
            store (EncodingStore | None): the service's :class:`~masc_engine.runtime.cache.EncodingStore`.
        """
        total = 0 if store is None else store.faults
        self.cache_faults.inc(max(0, total - self._cache_faults_seen))
        self._cache_faults_seen = max(total, self._cache_faults_seen)

    def count_error(self, reason: str) -> None:
        self.errors.labels(reason).inc()

    def path_label(self, path: str) -> str:
        return path if path in self.paths else "other"  # a bounded label set, whatever paths clients try

    def observe_request(self, path: str, code: int, seconds: float) -> None:
        path = self.path_label(path)
        self.requests.labels(path, str(code)).inc()
        self.latency.labels(path).observe(seconds)

    def count_connection_error(self, reason: str, code: int) -> None:
        """A connection answered by the HTTP protocol itself (header deadline, malformed HTTP):
        no path is known, so it counts under ``path="other"``."""
        self.errors.labels(reason).inc()
        self.requests.labels("other", str(code)).inc()

    def observe_batch(self, size: int, waits: list[float], seconds: float) -> None:
        self.batch_size.observe(size)
        for w in waits:
            self.queue_wait.observe(w)
        self.inference.observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
