"""The service's one error body: ``{"error": reason, "field": name or null, "detail": one line}``
for every answer that is not a result, the server's own included (docs/service.md lists every
reason)."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .limits import BodyTimeout

#: The status counted for a client that closed its connection before its body was read (nginx's
#: "client closed request"): never sent, since nobody is listening; not a fault of the server.
CLIENT_CLOSED_STATUS = 499


class ApiError(Exception):
    """An answer other than a result: HTTP ``status``, ``error`` (the reason), the request
    ``field`` at fault (or None), one line of ``detail`` and extra response headers."""

    def __init__(
        self, status: int, error: str, field: str | None, detail: str, headers: Mapping[str, str] | None = None
    ):
        self.status, self.error, self.field, self.detail, self.headers = status, error, field, detail, headers


def error_response(status: int, error: str, field: str | None, detail: str, headers=None) -> JSONResponse:
    return JSONResponse({"error": error, "field": field, "detail": detail}, status_code=status, headers=headers)


_PYDANTIC_REASON = {
    "missing": "missing_field",
    "extra_forbidden": "unknown_field",
    "json_invalid": "malformed_json",
    "literal_error": "bad_value",
    "model_type": "wrong_type",
    "model_attributes_type": "wrong_type",
}


def validation_error(e: ValidationError | RequestValidationError) -> ApiError:
    errs = e.errors()
    first = errs[0] if errs else {"type": "invalid", "loc": (), "msg": "invalid request"}
    loc = [p for p in first.get("loc", ()) if p != "body"]
    name = ""
    for p in loc:
        name += f"[{p}]" if isinstance(p, int) else (f".{p}" if name else str(p))
    t = str(first.get("type", ""))
    reason = _PYDANTIC_REASON.get(t, "wrong_type" if t.endswith("_type") else "bad_value")
    if reason == "malformed_json":
        return ApiError(400, reason, None, f"the body is not valid JSON: {first.get('msg')}")
    more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
    return ApiError(422, reason, name or None, f"{name or 'body'}: {first.get('msg')}{more}")


def add_error_handlers(app: FastAPI, cfg, state) -> None:
    """Every error the app answers, as the one JSON body."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        state.metrics.count_error(e.error)
        return error_response(e.status, e.error, e.field, e.detail, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        if e.status_code == 413:
            return await _api_error(
                request, ApiError(413, "body_too_large", None, f"the body is over --max-body-mb {cfg.max_body_mb:g}")
            )
        reason = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "http_error")
        return await _api_error(request, ApiError(e.status_code, reason, None, str(e.detail), e.headers))

    @app.exception_handler(BodyTimeout)
    async def _body_timeout(request: Request, e: BodyTimeout):
        return await _api_error(request, ApiError(408, "body_timeout", None, str(e), {"Connection": "close"}))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, e: ClientDisconnect):
        state.metrics.count_error("client_disconnected")
        return error_response(
            CLIENT_CLOSED_STATUS,
            "client_disconnected",
            None,
            "the client closed the connection before its body was read",
        )

    @app.exception_handler(RequestValidationError)
    async def _req_validation(request: Request, e: RequestValidationError):
        return await _api_error(request, validation_error(e))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        # Starlette's error middleware answers with this, then re-raises to the guard (which logs).
        state.metrics.count_error("internal_error")
        return error_response(
            500, "internal_error", None, "the server failed on this request (logged); it is not the request's fault"
        )
