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
from .schemas import ERRORS, BatchResult, ErrorBody, ScoreBatch, ScoreItem, ScoreResult, multipart_schema


def add_probe_routes(app: FastAPI, cfg, state) -> None:
    @app.get("/healthz", summary="process alive", responses={200: {"content": {"application/json": {}}}})
    async def healthz() -> dict:
        return {"status": "alive"}

    @app.get("/readyz", summary="bundle loaded and graphs warm", responses={503: {"model": ErrorBody}})
    async def readyz():
        if state.ready:
            cert = state.service.scorer.certificate
            return {"status": "ready", "bundle": cfg.bundle, "backend": state.service.scorer.backend,
                    "precision": state.service.scorer.precision, "certificate": cert and cert["claim"]}
        if state.load_error:
            return error_response(503, "load_failed", None, state.load_error)
        return error_response(503, "not_ready", None, "the bundle is still loading")

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics():
        if state.batcher is not None:
            state.metrics.queue_depth.set(state.batcher.depth())
        body, ctype = state.metrics.exposition()
        return Response(body, media_type=ctype)


def add_score_routes(app: FastAPI, cfg, state) -> None:
    def _require_ready():
        if not state.ready:
            raise ApiError(503, "not_ready", None, state.load_error or "the bundle is still loading",
                           {"Retry-After": "5"})

    def _check_text(prompt, object_name, label: str) -> None:
        try:
            state.service.check_text(prompt, object_name, label)
        except FieldError as e:
            raise ApiError(422, e.reason, e.field, e.detail) from None

    async def _decode(item: ScoreItem | dict, label: str):
        """One item -> ServiceItem in the bounded decode pool (base64, images, prompt tokens)."""
        if isinstance(item, ScoreItem):
            data = {f: getattr(item, f) for f in BYTE_FIELDS}
            prompt, obj, strip = item.prompt, item.object_name, item.stripper
        else:
            data, prompt, obj, strip = item["data"], item["prompt"], item["object_name"], item["stripper"]
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(state.decode_pool, state.service.decode, data, prompt, obj, strip, label)
        except FieldError as e:
            raise ApiError(422, e.reason, e.field, e.detail) from None

    async def _run(decoded: list) -> list[dict]:
        try:
            futs = [state.batcher.submit(d) for d in decoded]
        except QueueFull as e:
            raise ApiError(503, "overloaded", None, str(e), {"Retry-After": "1"}) from e
        try:
            return list(await asyncio.wait_for(asyncio.gather(*(asyncio.wrap_future(f) for f in futs)),
                                               cfg.request_timeout_s))
        except asyncio.TimeoutError as e:
            for f in futs:
                f.cancel()
            raise ApiError(503, "timeout", None, f"not scored within --request-timeout-s {cfg.request_timeout_s:g} s",
                           {"Retry-After": "5"}) from e

    score_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ScoreItem"}},
        "multipart/form-data": {"schema": multipart_schema()}}}}

    @app.post("/v1/score", response_model=ScoreResult, responses=ERRORS, openapi_extra=score_body,
              summary="score one pair (JSON with base64 files, or multipart uploads)")
    async def score(request: Request):
        _require_ready()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data":
            item = await parse_multipart(request, cfg)
            _check_text(item["prompt"], item["object_name"], "")
        elif ctype in ("application/json", ""):
            item = await parse_json(request, ScoreItem)
            _check_text(item.prompt, item.object_name, "")
        else:
            raise ApiError(415, "unsupported_media_type", None,
                           f"content-type {ctype!r}: send application/json or multipart/form-data")
        decoded = await _decode(item, "")
        del item
        if decoded.error is not None:
            e = decoded.error
            raise ApiError(422, e.reason, e.field, e.detail)
        return (await _run([decoded]))[0]

    batch_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/ScoreBatch"}}}}}

    @app.post("/v1/score_batch", response_model=BatchResult, responses=ERRORS, openapi_extra=batch_body,
              summary="score a list of pairs; results in order")
    async def score_batch(request: Request):
        _require_ready()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise ApiError(415, "unsupported_media_type", None, f"content-type {ctype!r}: send application/json")
        batch = await parse_json(request, ScoreBatch)
        if len(batch.items) > cfg.max_batch_items:
            raise ApiError(422, "too_many_items", "items",
                           f"items: {len(batch.items)} > --max-batch-items {cfg.max_batch_items}")
        for i, it in enumerate(batch.items):  # every text budget before any image is decoded
            _check_text(it.prompt, it.object_name, f"items[{i}].")
        items, batch = batch.items, None
        decoded = await asyncio.gather(*(_decode(it, f"items[{i}].") for i, it in enumerate(items)))
        del items
        return {"results": await _run(list(decoded))}
