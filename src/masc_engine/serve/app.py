"""The masc-serve ASGI app (FastAPI): a thin HTTP shell over the scoring library.

Endpoints (OpenAPI at ``/openapi.json``, docs at ``/docs``):

- ``GET /healthz``: 200 while the process serves HTTP; ``GET /readyz``: 200 once the bundle is
  loaded and its graphs ran once (warm), else 503.
- ``POST /v1/score``: one item, JSON (files as base64) or ``multipart/form-data`` (files as
  uploads); 200 with masc-run's record, or a 4xx JSON error naming the field.
- ``POST /v1/score_batch``: ``{"items": [...]}``; results in order. A file problem of one item
  is that item's masc-run status (its record says which field), never the batch's failure.
- ``GET /metrics``: Prometheus text exposition.

Errors are JSON ``{"error": reason, "field": name or null, "detail": one line}``, the server's
own included (docs/service.md lists every reason): 400 malformed body or HTTP, 408 headers not
received within ``--header-timeout-s`` or body not within ``--body-timeout-s``, 413 body over
``--max-body-mb``, 415 other content types, 422 a field's value (missing, wrong type, bad base64,
not an image of an accepted format, over the pixel budget, mask of another size, prompt over its
budget), 500 a server fault (never the request's), 503 not ready, too many requests, queue full,
past ``--request-timeout-s`` or shutting down. The service reads bytes from the request only; it
never opens a path it is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import RequestBodyLimitMiddleware

from ..runtime.config import ScorerConfig
from ..runtime.text import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_PROMPT_TOKENS
from .batcher import MicroBatcher, QueueFull
from .glue import BYTE_FIELDS, FieldError, ServiceScorer
from .limits import BodyTimeout, RequestGuard, set_pixel_budget
from .metrics import ServiceMetrics

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
    extra_strippers: tuple[str, ...] = ("regex", "none")


# ---------------------------------------------------------------------- schemas

_B64 = {"format": "byte", "contentEncoding": "base64"}


class ScoreItem(BaseModel):
    """One pair to score: the four files' bytes as base64 (PNG/JPEG/WebP/TIFF, as masc-run reads
    them), the prompt and the subject name stripped from it for PF."""

    model_config = ConfigDict(extra="forbid", strict=True)
    ref_image: str = Field(description="reference image file, base64", json_schema_extra=_B64)
    ref_mask: str = Field(description="reference foreground mask file, base64", json_schema_extra=_B64)
    out_image: str = Field(description="generated (output) image file, base64", json_schema_extra=_B64)
    out_mask: str = Field(description="output foreground mask file, base64", json_schema_extra=_B64)
    prompt: str = Field(description="the generation prompt")
    object_name: str | None = Field(None, description="subject name stripped from the prompt for PF; "
                                                      "null or absent: the prompt is not stripped")
    stripper: Literal["regex", "spacy", "none"] | None = Field(
        None, description="PF prompt stripper; default: the server's --stripper")


class ScoreBatch(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[ScoreItem] = Field(description="pairs to score; results come back in this order")


class ScoreResult(BaseModel):
    """masc-run's record for the pair (README "masc-run"); null where a score is undefined."""

    model_config = ConfigDict(extra="allow")
    cp: float | None = Field(description="Concept Preservation (masked_maxcos), [-1, 1]; null if undefined")
    pf: float | None = Field(description="Prompt Following, [-1, 1]; null if undefined")
    status: str = Field(description="'ok' or masc-run's reason (README status table)")
    status_detail: str = Field(description="field and cause, notes")


class BatchResult(BaseModel):
    results: list[ScoreResult]


class ErrorBody(BaseModel):
    error: str = Field(description="machine-readable reason, e.g. missing_field, bad_base64, unreadable_image")
    field: str | None = Field(description="the request field at fault, e.g. 'ref_image' or 'items[2].prompt'")
    detail: str = Field(description="one line: what is wrong and why")


_ERRORS = {c: {"model": ErrorBody} for c in (400, 408, 413, 415, 422, 500, 503)}


class ApiError(Exception):
    def __init__(self, status: int, error: str, field: str | None, detail: str, headers: dict | None = None):
        self.status, self.error, self.field, self.detail, self.headers = status, error, field, detail, headers


def _error_response(status: int, error: str, field: str | None, detail: str, headers=None) -> JSONResponse:
    return JSONResponse({"error": error, "field": field, "detail": detail}, status_code=status, headers=headers)


_PYDANTIC_REASON = {"missing": "missing_field", "extra_forbidden": "unknown_field", "json_invalid": "malformed_json",
                    "literal_error": "bad_value", "model_type": "wrong_type", "model_attributes_type": "wrong_type"}


def _validation_error(e: ValidationError | RequestValidationError) -> ApiError:
    errs = e.errors()
    first = errs[0] if errs else {"type": "invalid", "loc": (), "msg": "invalid request"}
    loc = [p for p in first.get("loc", ()) if p != "body"]
    name = ""
    for p in loc:
        name += f"[{p}]" if isinstance(p, int) else (f".{p}" if name else str(p))
    t = first.get("type", "")
    reason = _PYDANTIC_REASON.get(t, "wrong_type" if t.endswith("_type") else "bad_value")
    if reason == "malformed_json":
        return ApiError(400, reason, None, f"the body is not valid JSON: {first.get('msg')}")
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return ApiError(422, reason, name or None, f"{name or 'body'}: {first.get('msg')}{more}")


# ---------------------------------------------------------------------- the app


class _State:
    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.metrics = ServiceMetrics()
        self.ready = False
        self.load_error: str | None = None
        self.service: ServiceScorer | None = None
        self.batcher: MicroBatcher | None = None
        self.decode_pool = ThreadPoolExecutor(cfg.decode_workers, thread_name_prefix="masc-decode")
        self.store = None

    def load(self) -> None:
        """Load the bundle, run its graphs once, then mark ready (runs in a thread at startup)."""
        try:
            from ..engine.bundle import RandomWeightsWarning
            from ..jobs.pairs import RunSettings
            from ..runtime.scorer import Scorer

            cfg = self.cfg
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", RandomWeightsWarning)
                scorer = Scorer(cfg.bundle, cfg.scorer)
            for w in caught:  # one log line, not a Python warning pointing into the library
                log.warning("masc-serve: %s", w.message)
            if cfg.cache_dir:
                from ..runtime.cache import EncodingStore

                from ..jobs.pairs import encoding_namespace

                # masc-run's namespace: the two commands share entries.
                kw = {"size_limit": int(cfg.cache_size_gb * 2**30)} if cfg.cache_size_gb else {}
                self.store = EncodingStore(cfg.cache_dir, encoding_namespace(scorer, cfg.exif), **kw)
                scorer.text_store = self.store
            from ..runtime.text import PromptBudget

            settings = RunSettings(exif=cfg.exif, mask_size_tolerance=cfg.mask_size_tolerance)
            service = ServiceScorer(scorer, settings, cache_bytes=int(cfg.cache_mb * 2**20), store=self.store,
                                    strippers=cfg.extra_strippers, decoded_bytes=int(cfg.max_decoded_mb * 2**20),
                                    prompt_budget=PromptBudget(cfg.max_prompt_bytes, cfg.max_prompt_tokens))
            _warm_up(service)
            self.service = service
            self.batcher = MicroBatcher(self._score_batch, cfg.max_batch, cfg.max_wait_ms, cfg.max_queue,
                                        on_batch=self.metrics.observe_batch)
            self.ready = True
            self.metrics.ready.set(1)
            log.info("masc-serve: ready (bundle %s)", cfg.bundle)
        except Exception as e:  # noqa: BLE001 - reported by /readyz and the log, the process stays up
            self.load_error = f"{type(e).__name__}: {e}"
            log.error("masc-serve: could not load the bundle: %s", self.load_error)

    def _score_batch(self, items):
        out = self.service.score(items)
        self.metrics.cache.update(self.service)
        return out

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close(timeout=60)
        self.decode_pool.shutdown(wait=True)
        if self.store is not None:
            self.store.close()


def _warm_up(service: ServiceScorer) -> None:
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
    item = service.decode({"ref_image": im, "ref_mask": png(m), "out_image": im, "out_mask": png(m)},
                          "a photo of a thing", "thing", None)
    service.score([item])
    service.memory.clear()
    service.hits = service.misses = 0


class _GuardedApp(FastAPI):
    """The FastAPI app with :class:`~masc_engine.serve.limits.RequestGuard` outside Starlette's
    own error middleware, so the guard sees (and counts) every response, 500s included."""

    guard_options: dict = {}

    def build_middleware_stack(self):
        return RequestGuard(super().build_middleware_stack(), **self.guard_options)


def create_app(cfg: ServeConfig) -> FastAPI:
    """The service for one bundle. The bundle loads in a background thread at startup:
    ``/healthz`` answers at once, ``/readyz`` turns 200 when scoring is warm."""
    set_pixel_budget(cfg.max_pixels)
    state = _State(cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from ..jobs.loading import return_large_blocks

        return_large_blocks()  # the serving process's heap gives decoded images back (docs/service.md)
        loader = threading.Thread(target=state.load, name="masc-load", daemon=True)
        loader.start()
        yield
        # SIGTERM: uvicorn has stopped accepting and let in-flight requests finish; now drain.
        loader.join(timeout=5)
        state.close()

    from .. import __version__

    app = _GuardedApp(title="masc-serve", version=__version__, lifespan=lifespan,
                      description="MaSC (masked SigLIP2 CP and PF) as an HTTP service; see docs/service.md.")
    app.state.masc = state
    max_bytes = int(cfg.max_body_mb * 2**20)
    app.guard_options = {"max_bytes": max_bytes, "body_timeout_s": cfg.body_timeout_s,
                         "max_in_flight": cfg.max_connections, "metrics": state.metrics}
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_bytes)  # chunked bodies
    _add_error_handlers(app, cfg, state)
    _add_probe_routes(app, cfg, state)
    _add_score_routes(app, cfg, state)
    _add_schemas(app, strippers=tuple(dict.fromkeys((cfg.scorer.stripper, *cfg.extra_strippers))), cfg=cfg)
    return app


def _add_error_handlers(app: FastAPI, cfg: ServeConfig, state: _State) -> None:
    """Every error the app answers, as the one JSON body."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        state.metrics.count_error(e.error)
        return _error_response(e.status, e.error, e.field, e.detail, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 413:
            return await _api_error(request, ApiError(413, "body_too_large", None,
                                                      f"the body is over --max-body-mb {cfg.max_body_mb:g}"))
        reason = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return await _api_error(request, ApiError(e.status_code, reason, None, str(e.detail), e.headers))

    @app.exception_handler(BodyTimeout)
    async def _body_timeout(request: Request, e: BodyTimeout):
        return await _api_error(request, ApiError(408, "body_timeout", None, str(e), {"Connection": "close"}))

    @app.exception_handler(RequestValidationError)
    async def _req_validation(request: Request, e: RequestValidationError):
        return await _api_error(request, _validation_error(e))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        # Starlette's error middleware answers with this, then re-raises to the guard (which logs).
        state.metrics.count_error("internal_error")
        return _error_response(500, "internal_error", None,
                               "the server failed on this request (logged); it is not the request's fault")


def _add_probe_routes(app: FastAPI, cfg: ServeConfig, state: _State) -> None:
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
            return _error_response(503, "load_failed", None, state.load_error)
        return _error_response(503, "not_ready", None, "the bundle is still loading")

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def metrics():
        if state.batcher is not None:
            state.metrics.queue_depth.set(state.batcher.depth())
        body, ctype = state.metrics.exposition()
        return Response(body, media_type=ctype)


def _add_score_routes(app: FastAPI, cfg: ServeConfig, state: _State) -> None:
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
        "multipart/form-data": {"schema": _multipart_schema()}}}}

    @app.post("/v1/score", response_model=ScoreResult, responses=_ERRORS, openapi_extra=score_body,
              summary="score one pair (JSON with base64 files, or multipart uploads)")
    async def score(request: Request):
        _require_ready()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data":
            item = await _parse_multipart(request, cfg)
            _check_text(item["prompt"], item["object_name"], "")
        elif ctype in ("application/json", ""):
            item = await _parse_json(request, ScoreItem)
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

    @app.post("/v1/score_batch", response_model=BatchResult, responses=_ERRORS, openapi_extra=batch_body,
              summary="score a list of pairs; results in order")
    async def score_batch(request: Request):
        _require_ready()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise ApiError(415, "unsupported_media_type", None, f"content-type {ctype!r}: send application/json")
        batch = await _parse_json(request, ScoreBatch)
        if len(batch.items) > cfg.max_batch_items:
            raise ApiError(422, "too_many_items", "items",
                           f"items: {len(batch.items)} > --max-batch-items {cfg.max_batch_items}")
        for i, it in enumerate(batch.items):  # every text budget before any image is decoded
            _check_text(it.prompt, it.object_name, f"items[{i}].")
        items, batch = batch.items, None
        decoded = await asyncio.gather(*(_decode(it, f"items[{i}].") for i, it in enumerate(items)))
        del items
        return {"results": await _run(list(decoded))}


async def _read_body(request: Request) -> bytearray:
    """The whole body in one buffer (Starlette's ``request.body()`` joins a list of chunks: twice
    the body at its peak)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
    return body


async def _parse_json(request: Request, model):
    """Read and validate a JSON body; validation runs in a thread, so a large body never stalls
    the event loop (and with it the probes)."""
    body = await _read_body(request)
    if not body:
        raise ApiError(400, "malformed_json", None, "the body is empty: send a JSON object")
    try:
        return await asyncio.to_thread(model.model_validate_json, body)
    except ValidationError as e:
        raise _validation_error(e) from e


def _multipart_schema() -> dict:
    files = {f: {"type": "string", "format": "binary"} for f in BYTE_FIELDS}
    return {"type": "object", "required": [*BYTE_FIELDS, "prompt"],
            "properties": {**files, "prompt": {"type": "string"}, "object_name": {"type": "string"},
                           "stripper": {"type": "string", "enum": ["regex", "spacy", "none"]}}}


async def _parse_multipart(request: Request, cfg: ServeConfig) -> dict:
    try:
        # Text fields are cut off at the prompt budget while parsing (never held whole); file
        # parts are spooled by Starlette and bounded by --max-body-mb.
        form = await request.form(max_files=len(BYTE_FIELDS), max_fields=8, max_part_size=cfg.max_prompt_bytes)
    except BodyTimeout:
        raise
    except Exception as e:  # noqa: BLE001 - python-multipart / Starlette raise several kinds
        if isinstance(e, StarletteHTTPException) and e.status_code != 400:
            raise  # 413: the body limit
        why = str(getattr(e, "detail", None) or e)
        if "exceeded maximum size" in why:  # Starlette's part limit, hit while parsing
            raise ApiError(422, "prompt_too_long", None, f"a text field (prompt, object_name or stripper) is over "
                                                         f"the budget of {cfg.max_prompt_bytes} bytes") from e
        raise ApiError(400, "malformed_multipart", None, f"the multipart body cannot be parsed: {why}") from e
    known = set(BYTE_FIELDS) | {"prompt", "object_name", "stripper"}
    for k in form.keys():
        if k not in known:
            raise ApiError(422, "unknown_field", k, f"{k}: not a field of /v1/score")
        if len(form.getlist(k)) > 1:
            raise ApiError(422, "bad_value", k, f"{k}: sent more than once")
    data = {}
    for f in BYTE_FIELDS:
        v = form.get(f)
        if v is None:
            raise ApiError(422, "missing_field", f, f"{f}: field required (a file upload, e.g. curl -F {f}=@file)")
        if not isinstance(v, UploadFile):
            raise ApiError(422, "wrong_type", f, f"{f}: expected a file upload, got a text field "
                                                 f"(curl -F {f}=@path, with the @)")
        data[f] = await v.read()
    texts = {k: await _text_part(form.get(k), k, cfg) for k in ("prompt", "object_name", "stripper")}
    if texts["prompt"] is None:
        raise ApiError(422, "missing_field", "prompt", "prompt: field required")
    if texts["stripper"] not in (None, "regex", "spacy", "none"):
        raise ApiError(422, "bad_value", "stripper", "stripper: must be one of regex, spacy, none")
    return {"data": data, "prompt": texts["prompt"], "object_name": texts["object_name"] or None,
            "stripper": texts["stripper"]}


async def _text_part(v, name: str, cfg: ServeConfig) -> str | None:
    """A text field, sent as text or as a file upload (whose size is checked before it is read)."""
    if not isinstance(v, UploadFile):
        return v
    if v.size is not None and v.size > cfg.max_prompt_bytes:
        raise ApiError(422, "prompt_too_long", name, f"{name}: {v.size} bytes, over the budget of "
                                                     f"{cfg.max_prompt_bytes} bytes")
    try:
        return (await v.read(cfg.max_prompt_bytes + 1)).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(422, "wrong_type", name, f"{name}: not UTF-8 text") from e


def _add_schemas(app: FastAPI, strippers: tuple[str, ...], cfg: ServeConfig) -> None:
    """Put the request models into the OpenAPI components (the routes read their bodies
    themselves, to accept JSON and multipart on one path and to name fields in errors), with
    ``stripper`` limited to the strippers this server enables and the text fields' length to
    the prompt budget (``maxLength`` counts characters, the budget bytes: a longer text is
    surely over it)."""
    base = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = base()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (ScoreItem, ScoreBatch):
            s = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for k, v in s.pop("$defs", {}).items():
                comps.setdefault(k, v)
            comps[model.__name__] = s
        multipart = schema["paths"]["/v1/score"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
        for prop in (comps["ScoreItem"]["properties"]["stripper"], multipart["properties"]["stripper"]):
            for alt in [prop, *prop.get("anyOf", [])]:
                if "enum" in alt:
                    alt["enum"] = list(strippers)
        for props in (comps["ScoreItem"]["properties"], multipart["properties"]):
            for name in ("prompt", "object_name"):
                for alt in [props[name], *props[name].get("anyOf", [])]:
                    if alt.get("type") == "string":
                        alt["maxLength"] = cfg.max_prompt_bytes
        app.openapi_schema = schema
        return schema

    app.openapi = openapi


def dumps_openapi(app: FastAPI) -> str:
    return json.dumps(app.openapi(), indent=2)
