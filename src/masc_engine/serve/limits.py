"""Limits that keep hostile input cheap: request body size and receive time, pixel budget.

- **Body size** (``--max-body-mb``): a ``Content-Length`` over the limit is answered 413 JSON by
  :class:`RequestGuardMiddleware` before any of the body is read; a chunked body is cut off at the
  limit by Starlette's ``RequestBodyLimitMiddleware`` (inside the guard; the app's handler answers
  413 JSON). The guard answers the first case itself because Starlette's limiter replaces any
  response to an over-long ``Content-Length`` with a plain-text one.
- **Body time** (``--body-timeout-s``): the guard also times each read of the body. A client that
  stops sending mid-body (slowloris) gets 408 instead of holding a connection and a buffer.
- **Pixels** (``--max-pixels``): Pillow's decompression-bomb limit, ``Image.MAX_IMAGE_PIXELS``.
  Pillow checks it from the header, before decoding (``Image.open``); runtime/io.py turns the
  warning into ``image_too_large``, so an image over the budget is never decoded: a 30000 x 30000
  PNG header of a few hundred bytes is refused in microseconds.
"""

from __future__ import annotations

import asyncio
import json

from PIL import Image


def set_pixel_budget(max_pixels: int) -> None:
    """Set Pillow's decompression-bomb limit for this process (pixels per image)."""
    Image.MAX_IMAGE_PIXELS = int(max_pixels)


class BodyTimeout(Exception):
    """The request body did not arrive in time (the app answers 408)."""


class RequestGuardMiddleware:
    """Pure ASGI middleware: refuse a ``Content-Length`` over ``max_bytes`` (413 JSON), and
    require each read of the request body to arrive within ``timeout_s`` (else :class:`BodyTimeout`).

    Only reads until the body is complete are timed: afterwards Starlette reads only to notice a
    disconnect, which may rightly wait as long as scoring takes.
    """

    def __init__(self, app, max_bytes: int, timeout_s: float, on_reject=None):
        self.app = app
        self.max_bytes = int(max_bytes)
        self.timeout_s = float(timeout_s)
        self.on_reject = on_reject

    async def _reject(self, send, status: int, error: str, detail: str) -> None:
        if self.on_reject is not None:
            self.on_reject(error)
        body = json.dumps({"error": error, "field": None, "detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                n = int(v) if v.isdigit() else -1
                if n < 0:
                    return await self._reject(send, 400, "bad_content_length", "Content-Length is not a number")
                if n > self.max_bytes:
                    return await self._reject(send, 413, "body_too_large", f"a body of {n} bytes is over "
                                              f"--max-body-mb {self.max_bytes / 2**20:g}")
        done = False

        async def receive_with_timeout():
            nonlocal done
            if done:
                return await receive()
            try:
                msg = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                raise BodyTimeout(f"the body was not received within --body-timeout-s {self.timeout_s:g} s") from None
            if msg["type"] != "http.request" or not msg.get("more_body", False):
                done = True
            return msg

        return await self.app(scope, receive_with_timeout, send)
