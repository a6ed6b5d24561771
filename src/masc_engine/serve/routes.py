"""The service's routes: the probes (``/healthz``, ``/readyz``, ``/metrics``) and the scoring
routes (``/v1/score``, ``/v1/score_batch``), each a thin shell over :class:`~.state.ServiceState`."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import Response

from .batcher import QueueFull
from .errors import ApiError, error_response
from .glue import BYTE_FIELDS, FieldError
from .parsing import parse_json, parse_multipart
from .schemas import ERRORS, ErrorBody, multipart_schema, request_models, result_models


#: What ``/readyz`` and ``not_ready`` say about a failed load: the cause (with server paths) is in the log only.
LOAD_FAILED_DETAIL = "the bundle could not be loaded; the server log names the cause"


def _probe(app: FastAPI, path: str, **kw):
    """Route a probe for GET (in the OpenAPI document) and HEAD (not in it): one route for both
    would give the two operations one id, and FastAPI would pick either for the document (set
    order, so the document changed from one process to the next)."""

    def deco(fn):
        app.get(path, **kw)(fn)
        app.head(path, include_in_schema=False, **kw)(fn)
        return fn

    return deco


def add_probe_routes(app: FastAPI, cfg, state) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics``, each answering GET and HEAD (HEAD-based probes).
    No answer names a server path: bundles are identified by their fingerprint."""

    @_probe(app, "/healthz", summary="process alive", responses={200: {"content": {"application/json": {}}}})
    async def healthz() -> dict:
        return {"status": "alive"}

    @_probe(app, "/readyz", summary="bundle loaded and graphs warm", responses={503: {"model": ErrorBody}})
    async def readyz():
        if state.ready:
            scorer = state.service.scorer
            cert = scorer.certificate
            ready = {
                "status": "ready",
                "bundle": {"fingerprint": scorer.bundle.fingerprint},
                "backend": scorer.backend,
                "precision": scorer.precision,
                "certificate": cert and cert["claim"],
                "cache": state.cache_status(),
            }
            masks = state.service.job.masks
            if masks is not None:  # masks optional: say which segmenter and rule compute them
                ready["segmenter"] = masks.segmenter.identity()
            return ready
        if state.load_error:
            return error_response(503, "load_failed", None, LOAD_FAILED_DETAIL)
        return error_response(503, "not_ready", None, "the bundle is still loading")

    @_probe(
        app,
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics():
        if state.batcher is not None:
            state.metrics.queue_depth.set(state.batcher.depth())
        state.metrics.update_cache_faults(state.store)
        body, ctype = state.metrics.exposition()
        return Response(body, media_type=ctype)


class _Scoring:
    """What both scoring routes do with a request: readiness, text budgets, decoding in the
    bounded decode pool, then the micro-batcher."""

    def __init__(self, cfg, state):
        self.cfg, self.state = cfg, state
        self.item_model, self.batch_model = request_models(cfg.segmenter is not None)

    def require_ready(self) -> None:
        if not self.state.ready:
            detail = LOAD_FAILED_DETAIL if self.state.load_error else "the bundle is still loading"
            raise ApiError(503, "not_ready", None, detail, {"Retry-After": "5"})

    def check_text(self, prompt, object_name, label: str) -> None:
        try:
            self.state.service.check_text(prompt, object_name, label)
        except FieldError as e:
            raise ApiError(422, e.reason, e.field, e.detail) from None

    async def decode(self, item, label: str):
        """One item -> ServiceItem in the bounded decode pool (base64, images, masks, prompt tokens)."""
        if isinstance(item, self.item_model):
            data = {f: getattr(item, f) for f in BYTE_FIELDS}
            prompt, obj, strip = item.prompt, item.object_name, item.stripper
        else:
            data, prompt, obj, strip = item["data"], item["prompt"], item["object_name"], item["stripper"]
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self.state.decode_pool, self.state.service.decode, data, prompt, obj, strip, label
            )
        except FieldError as e:
            raise ApiError(422, e.reason, e.field, e.detail) from None

    async def run(self, decoded: list) -> list[dict]:
        """Score decoded items through the micro-batcher, within ``--request-timeout-s``."""
        try:
            futs = [self.state.batcher.submit(d) for d in decoded]
        except QueueFull as e:
            raise ApiError(503, "overloaded", None, str(e), {"Retry-After": "1"}) from e
        try:
            return list(
                await asyncio.wait_for(
                    asyncio.gather(*(asyncio.wrap_future(f) for f in futs)), self.cfg.request_timeout_s
                )
            )
        except asyncio.TimeoutError as e:
            for f in futs:
                f.cancel()
            raise ApiError(
                503,
                "timeout",
                None,
                f"not scored within --request-timeout-s {self.cfg.request_timeout_s:g} s",
                {"Retry-After": "5"},
            ) from e

    async def one(self, request: Request, multipart: bool | None = None) -> dict:
        """One item: ``/v1/score`` (JSON; multipart still read, for clients written before
        ``/v1/score/upload``) or ``/v1/score/upload`` (``multipart=True``: multipart only); a
        file it cannot score is a 422 naming the field."""
        self.require_ready()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data" and multipart is not False:
            item = await parse_multipart(request, self.cfg)
            self.check_text(item["prompt"], item["object_name"], "")
        elif ctype in ("application/json", "") and not multipart:
            item = await parse_json(request, self.item_model)
            self.check_text(item.prompt, item.object_name, "")
        else:
            want = "multipart/form-data" if multipart else "application/json"
            raise ApiError(415, "unsupported_media_type", None, f"content-type {ctype!r}: send {want}")
        decoded = await self.decode(item, "")
        del item
        if decoded.error is not None:
            e = decoded.error
            raise ApiError(422, e.reason, e.field, e.detail)
        return (await self.run([decoded]))[0]

    async def batch(self, request: Request) -> dict:
        """``/v1/score_batch``: every text budget checked before any image is decoded; a bad item
        is its own record's status."""
        self.require_ready()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise ApiError(415, "unsupported_media_type", None, f"content-type {ctype!r}: send application/json")
        batch = await parse_json(request, self.batch_model)
        if len(batch.items) > self.cfg.max_batch_items:
            raise ApiError(
                422,
                "too_many_items",
                "items",
                f"items: {len(batch.items)} > --max-batch-items {self.cfg.max_batch_items}",
            )
        for i, it in enumerate(batch.items):
            self.check_text(it.prompt, it.object_name, f"items[{i}].")
        items, batch = batch.items, None
        decoded = await asyncio.gather(*(self.decode(it, f"items[{i}].") for i, it in enumerate(items)))
        del items
        return {"results": await self.run(list(decoded))}


def add_score_routes(app: FastAPI, cfg, state) -> None:
    """``POST /v1/score`` (JSON), ``POST /v1/score/upload`` (multipart) and ``POST
    /v1/score_batch``: one request content type per operation, so that standard client
    generators (openapi-python-client) give one typed body per call. Their request bodies are
    documented by reference: the routes read the bodies themselves (schemas.py ``add_schemas``)."""
    scoring = _Scoring(cfg, state)
    ScoreResult, BatchResult = result_models(cfg.run_settings().run_metrics())  # noqa: N806 - models

    def body(content_type: str, schema: dict) -> dict:
        return {"requestBody": {"required": True, "content": {content_type: {"schema": schema}}}}

    @app.post(
        "/v1/score",
        response_model=ScoreResult,
        response_model_exclude_unset=True,
        responses=ERRORS,
        operation_id="score",
        openapi_extra=body("application/json", {"$ref": "#/components/schemas/ScoreItem"}),
        summary="score one pair (JSON, the four files as base64)",
    )
    async def score(request: Request):
        return await scoring.one(request)

    @app.post(
        "/v1/score/upload",
        response_model=ScoreResult,
        response_model_exclude_unset=True,
        responses=ERRORS,
        operation_id="score_upload",
        openapi_extra=body("multipart/form-data", multipart_schema(cfg.segmenter is not None)),
        summary="score one pair (multipart/form-data, the four files as uploads)",
    )
    async def score_upload(request: Request):
        return await scoring.one(request, multipart=True)

    @app.post(
        "/v1/score_batch",
        response_model=BatchResult,
        response_model_exclude_unset=True,
        responses=ERRORS,
        operation_id="score_batch",
        openapi_extra=body("application/json", {"$ref": "#/components/schemas/ScoreBatch"}),
        summary="score a list of pairs; results in order",
    )
    async def score_batch(request: Request):
        return await scoring.batch(request)
