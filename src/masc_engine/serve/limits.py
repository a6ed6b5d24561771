"""Limits that keep hostile input cheap: request body size and receive time, pixel budget.

- **Body size** (``--max-body-mb``): a ``Content-Length`` over the limit is answered 413 before
  any byte of the body is read; a chunked body is counted as it arrives and cut off at the limit.
- **Body time** (``--body-timeout-s``): a client that stops sending mid-body (slowloris) gets 408
  instead of holding a connection and a buffer forever.
- **Pixels** (``--max-pixels``): Pillow's decompression-bomb limit, ``Image.MAX_IMAGE_PIXELS``.
  Pillow checks it from the header, before decoding (``Image.open``); runtime/io.py turns the
  warning into ``image_too_large``, so an image over the budget is never decoded. A 30000 x 30000
  PNG of a few hundred bytes is refused in microseconds.
"""

from __future__ import annotations

import asyncio
import json

from PIL import Image


def set_pixel_budget(max_pixels: int) -> None:
    """Set Pillow's decompression-bomb limit for this process (pixels per image)."""
    Image.MAX_IMAGE_PIXELS = int(max_pixels)


class BodyLimitMiddleware:
    """Pure ASGI middleware: bound the request body's size and the time to receive it.

    The body is buffered (at most ``max_bytes``) and replayed to the app, so an over-long body is
    refused before the app parses any of it.
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
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        limit_mb = self.max_bytes / 2**20
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return await self._reject(send, 400, "bad_content_length", "Content-Length is not a number")
                if n > self.max_bytes:
                    return await self._reject(send, 413, "body_too_large",
                                              f"body of {n} bytes is over --max-body-mb {limit_mb:g}")
        chunks, size, more = [], 0, True
        while more:
            try:
                msg = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                return await self._reject(send, 408, "body_timeout",
                                          f"the body was not received within --body-timeout-s {self.timeout_s:g} s")
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await self._reject(send, 413, "body_too_large",
                                          f"body is over --max-body-mb {limit_mb:g}")
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as Starlette expects

        return await self.app(scope, replay, send)
