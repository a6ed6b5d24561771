"""The masc-serve ASGI app (FastAPI): a thin HTTP shell over the scoring library.

Endpoints (OpenAPI at ``/openapi.json``; Swagger UI at ``/docs`` only with ``--docs``, since its
assets load from a CDN):

- ``GET /healthz``: 200 while the process serves HTTP; ``GET /readyz``: 200 once the bundle is
  loaded and its graphs ran once (warm), else 503.
- ``POST /v1/score``: one item, JSON (files as base64); ``POST /v1/score/upload``: the same as
  ``multipart/form-data`` (files as uploads); 200 with masc-run's record, or a 4xx JSON error
  naming the field. One request content type per operation, so standard client generators give
  one typed body per call (``/v1/score`` still reads multipart, for clients written before).
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

import json
import threading
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.routing import Route

from .errors import add_error_handlers
from .limits import RequestGuard, set_pixel_budget
from .routes import add_probe_routes, add_score_routes
from .schemas import add_schemas
from .state import ServeConfig, ServiceState

__all__ = ["ServeConfig", "create_app", "dumps_openapi"]


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
    state = ServiceState(cfg)

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

    app = _GuardedApp(
        title="masc-serve",
        version=__version__,
        lifespan=lifespan,
        # FastAPI's default paths, or none: Swagger UI / ReDoc load from a CDN
        docs_url="/docs" if cfg.docs else None,
        redoc_url="/redoc" if cfg.docs else None,
        description="MaSC (masked SigLIP2 CP and PF) as an HTTP service; see docs/service.md.",
    )
    app.state.masc = state
    max_bytes = int(cfg.max_body_mb * 2**20)
    app.guard_options = {
        "max_bytes": max_bytes,
        "body_timeout_s": cfg.body_timeout_s,
        "max_in_flight": cfg.max_connections,
        "metrics": state.metrics,
        "api_key": cfg.api_key,
    }
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_bytes)  # chunked bodies
    add_error_handlers(app, cfg, state)
    add_probe_routes(app, cfg, state)
    add_score_routes(app, cfg, state)
    add_schemas(app, strippers=tuple(dict.fromkeys((cfg.scorer.stripper, *cfg.extra_strippers))), cfg=cfg)
    state.metrics.label_paths(r.path for r in app.routes if isinstance(r, Route))  # every route its own label
    return app


def dumps_openapi(app: FastAPI) -> str:
    return json.dumps(app.openapi(), indent=2)
