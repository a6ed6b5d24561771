"""Limits that keep hostile input and slow clients cheap, and the one JSON error body.

:class:`RequestGuard` is the outermost ASGI layer of the app (outside Starlette's own error
middleware, so it sees every response the app sends, 500s included):

- **Body size** (``--max-body-mb``): a ``Content-Length`` over the limit is answered 413 before any
  of the body is read; a chunked body is cut off at the limit by Starlette's
  ``RequestBodyLimitMiddleware`` inside (the app's handler answers 413 JSON).
- **Body deadline** (``--body-timeout-s``): the whole body must arrive within this time of the
  request's headers, however it trickles in (a deadline, not a per-read timeout): else 408.
  The headers themselves have their own deadline in the HTTP protocol (serve/http.py).
- **Requests in flight** (``--max-connections``): past the limit, 503 with ``Retry-After``; the
  probes and metrics (``/healthz``, ``/readyz``, ``/metrics``) are never refused, so a liveness
  probe cannot fail because clients hold the scoring endpoints.
- **Anything that escapes the app** becomes the documented JSON 500 (``internal_error``), logged
  once with its traceback, never a plain-text body; every status code the server answers is
  counted in ``/metrics`` (``masc_requests_total{path,code}``). A client that closes its
  connection before its body is read is no fault of the server: no traceback, counted as
  ``client_disconnected`` under code 499 ("client closed request").
- **Bearer token** (``--api-key-file``, optional): every path but the probes (``/healthz``,
  ``/readyz``, ``/metrics``) needs ``Authorization: Bearer <key>``, compared in constant time
  (``hmac.compare_digest``); else 401 ``unauthorized`` before any of the body is read. Exactly
  one such header: two (or one value joining two tokens with a comma) are 401 too, whichever
  holds the key.
- **Framing**: a request with both ``Content-Length`` and ``Transfer-Encoding`` is refused (400
  ``bad_http``): a proxy in front that reads the other header would see another request.
- **Pixels** (``--max-pixels``): Pillow's decompression-bomb limit, ``Image.MAX_IMAGE_PIXELS``,
  checked from the header before decoding (runtime/io.py ``open_image``).

When the service falls idle after its memory grew (a large body, decoded images), the process's
free heap is returned to the system (jobs/loading.py ``release_free_memory``).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time

from PIL import Image
from starlette.requests import ClientDisconnect

from ..jobs.loading import release_free_memory

log = logging.getLogger("masc_engine.serve")

#: Paths never refused for load: liveness and readiness probes, and Prometheus scrapes.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: When the service falls idle with its resident memory this much above what it was after the
#: last trim, the free heap is returned to the system (the spike's memory is not kept forever).
_TRIM_GROWTH_BYTES = 32 * 2**20


def _rss() -> int | None:
    """This process's resident memory, bytes (Linux ``/proc/self/statm``; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def set_pixel_budget(max_pixels: int) -> None:
    """Set Pillow's decompression-bomb limit for this process (pixels per image)."""
    Image.MAX_IMAGE_PIXELS = int(max_pixels)


def error_body(error: str, field: str | None, detail: str) -> bytes:
    """The service's one error body: ``{"error", "field", "detail"}`` as JSON bytes."""
    return json.dumps({"error": error, "field": field, "detail": detail}, separators=(",", ":")).encode()


class BodyTimeout(Exception):
    """The request body did not arrive in time (the app answers 408)."""


class RequestGuard:
    """Pure ASGI guard around the whole app (see the module docstring).

    Args:
        app (ASGI app): the ASGI app (Starlette's middleware stack).
        max_bytes: largest body, bytes.
        body_timeout_s: deadline for the whole body, seconds from the request's start.
        max_in_flight: most requests handled at once, probes excepted (None: no limit).
        metrics (ServiceMetrics): the :class:`~masc_engine.serve.metrics.ServiceMetrics` counting every response.
        api_key: the bearer token every non-probe request must carry (None: no check).
    """

    def __init__(
        self,
        app,
        max_bytes: int,
        body_timeout_s: float,
        max_in_flight: int | None,
        metrics,
        api_key: bytes | None = None,
    ):
        self.app = app
        self.api_key = api_key
        self.max_bytes = int(max_bytes)
        self.timeout_s = float(body_timeout_s)
        self.max_in_flight = max_in_flight
        self.metrics = metrics
        self.in_flight = 0
        self._rss_floor: int | None = _rss()

    async def _answer(self, send, status: int, error: str, detail: str, headers=()) -> None:
        self.metrics.count_error(error)
        body = error_body(error, None, detail)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                    *headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _refusal(self, scope) -> tuple | None:
        """An answer for a request refused before the app sees it, else None."""
        names = {k for k, _ in scope.get("headers", ())}
        if b"content-length" in names and b"transfer-encoding" in names:
            return (
                400,
                "bad_http",
                "not a valid HTTP/1.1 request: both Content-Length and Transfer-Encoding (ambiguous framing)",
                (),
            )
        if self.api_key is not None and scope["path"] not in PROBE_PATHS:
            why = self._unauthorized(scope, self.api_key)
            if why is not None:
                return 401, "unauthorized", why, ((b"www-authenticate", b"Bearer"),)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                n = int(v) if v.isdigit() else -1
                if n < 0:
                    return 400, "bad_content_length", "Content-Length is not a number", ()
                if n > self.max_bytes:
                    return (
                        413,
                        "body_too_large",
                        f"a body of {n} bytes is over --max-body-mb {self.max_bytes / 2**20:g}",
                        (),
                    )
        if self.max_in_flight is not None and scope["path"] not in PROBE_PATHS and self.in_flight >= self.max_in_flight:
            return (
                503,
                "overloaded",
                f"{self.in_flight} requests are being handled (--max-connections {self.max_in_flight})",
                ((b"retry-after", b"1"),),
            )
        return None

    def _unauthorized(self, scope, api_key: bytes) -> str | None:
        """Why the request is not authorized, or None: exactly one ``Authorization: Bearer``
        header holding one token, the key (constant-time compare). Two headers, or one whose
        value joins two with a comma (as a proxy folds repeated headers), are refused whichever
        holds the key: a proxy in front may check one and the service another."""
        values = [v for k, v in scope.get("headers", ()) if k == b"authorization"]
        given = values[0][7:].strip() if len(values) == 1 and values[0][:7].lower() == b"bearer " else b""
        ok = hmac.compare_digest(given, api_key)
        if len(values) > 1 or (b"," in given and not ok):  # a key may itself hold a comma
            return "one Authorization header is expected: send Authorization: Bearer <key> once"
        return None if ok else "send Authorization: Bearer <key> (the key of --api-key-file)"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        path = self.metrics.path_label(scope["path"])
        status: list[int] = []

        async def send_counted(msg):
            if msg["type"] == "http.response.start":
                status.append(int(msg["status"]))
            await send(msg)

        refused = self._refusal(scope)
        counted = refused is None and scope["path"] not in PROBE_PATHS
        gauge = self.metrics.in_flight.labels(path)
        gauge.inc()
        self.in_flight += counted
        body = _BodyDeadline(receive, self.timeout_s)
        try:
            if refused is not None:
                await self._answer(send_counted, *refused)
            else:
                await self.app(scope, body.receive, send_counted)
        except ClientDisconnect:  # the client left mid-body: nobody to answer, not a server fault
            self.metrics.count_error("client_disconnected")
            status.append(status[0] if status else 499)
        except Exception:  # noqa: BLE001 - the documented JSON 500, whatever escaped the app
            log.exception("masc-serve: internal error on %s %s", scope.get("method"), scope["path"])
            if not status:
                await self._answer(
                    send_counted,
                    500,
                    "internal_error",
                    "the server failed on this request (logged); it is not the request's fault",
                )
        finally:
            self.in_flight -= counted
            gauge.dec()
            self.metrics.observe_request(scope["path"], status[0] if status else 500, time.perf_counter() - t0)
            if counted and self.in_flight == 0:
                await self._trim_if_grown()

    async def _trim_if_grown(self) -> None:
        """Idle now: hand the free heap back if resident memory grew since the last trim (glibc
        keeps freed arenas of a spike: request bodies, decoded images, batch buffers)."""
        rss = _rss()
        if rss is None:
            return
        if self._rss_floor is None or rss < self._rss_floor:
            self._rss_floor = rss
        elif rss - self._rss_floor >= _TRIM_GROWTH_BYTES:
            await asyncio.to_thread(release_free_memory)
            self._rss_floor = _rss()


class _BodyDeadline:
    """``receive`` with one deadline for the whole body, counted from the request's start.

    Only reads until the body is complete are timed: afterwards Starlette reads only to notice a
    disconnect, which may rightly wait as long as scoring takes.
    """

    def __init__(self, receive, timeout_s: float):
        self._receive = receive
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.done = False

    async def receive(self):
        if self.done:
            return await self._receive()
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise asyncio.TimeoutError
            msg = await asyncio.wait_for(self._receive(), left)
        except asyncio.TimeoutError:
            raise BodyTimeout(f"the body was not received within --body-timeout-s {self.timeout_s:g} s") from None
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            self.done = True
        return msg
