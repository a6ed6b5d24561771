"""masc-serve's request guard (serve/limits.py ``RequestGuard``) at the exact edges of its limits,
in-process on a stand-in ASGI app and a fake clock: a body of exactly ``--max-body-mb`` is let
through and one byte more is refused; with ``--max-connections`` requests in flight the next is
refused and with one fewer it is let through; the body deadline is one deadline for the whole
body from the request's start, however the body trickles in."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
from masc_engine.serve import limits  # noqa: E402
from masc_engine.serve.limits import BodyTimeout, RequestGuard  # noqa: E402
from masc_engine.serve.metrics import ServiceMetrics  # noqa: E402

MAX_BYTES = 1000


class App:
    """A stand-in for the service's app: reads the whole body, then (when ``hold`` is set) waits
    on it before answering 200; a body past its deadline is answered 408, as the service's
    handler of ``BodyTimeout`` answers (serve/errors.py)."""

    def __init__(self, hold: asyncio.Event | None = None):
        self.hold = hold
        self.entered = 0
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send):
        self.entered += 1
        body = b""
        try:
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if not msg.get("more_body", False):
                    break
        except BodyTimeout as e:
            await send({"type": "http.response.start", "status": 408, "headers": []})
            await send({"type": "http.response.body", "body": json.dumps({"detail": str(e)}).encode()})
            return
        self.bodies.append(body)
        if self.hold is not None:
            await self.hold.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def _scope(length: int | None = None) -> dict:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": "POST", "path": "/v1/score", "headers": headers}


async def _request(guard, scope, chunks: list[bytes]) -> tuple[int, dict | None]:
    """Send ``chunks`` as the body; the answer's status and JSON body (None for the stand-in's)."""
    queue = list(chunks)
    sent: list[dict] = []

    async def receive():
        body = queue.pop(0) if queue else b""
        return {"type": "http.request", "body": body, "more_body": bool(queue)}

    async def send(msg):
        sent.append(msg)

    await guard(scope, receive, send)
    status = sent[0]["status"]
    body = sent[1].get("body", b"")
    return status, (json.loads(body) if status != 200 else None)


def _guard(app, max_in_flight=None, body_timeout_s=30.0) -> RequestGuard:
    return RequestGuard(app, MAX_BYTES, body_timeout_s, max_in_flight, ServiceMetrics())


def test_a_body_of_exactly_the_limit_is_let_through_and_one_byte_more_is_refused():
    app = App()
    guard = _guard(app)
    status, _ = asyncio.run(_request(guard, _scope(MAX_BYTES), [b"x" * MAX_BYTES]))
    assert status == 200 and app.bodies == [b"x" * MAX_BYTES]
    status, body = asyncio.run(_request(guard, _scope(MAX_BYTES + 1), [b"x" * (MAX_BYTES + 1)]))
    assert (status, body["error"]) == (413, "body_too_large")
    assert body["detail"] == f"a body of {MAX_BYTES + 1} bytes is over --max-body-mb {MAX_BYTES / 2**20:g}"
    assert app.entered == 1  # the refused request never reached the app


@pytest.mark.parametrize("limit", [1, 3])
def test_the_request_past_max_connections_is_refused_and_the_one_before_it_is_not(limit):
    async def scenario():
        hold = asyncio.Event()
        app = App(hold)
        guard = _guard(app, max_in_flight=limit)
        held = [asyncio.create_task(_request(guard, _scope(2), [b"{}"])) for _ in range(limit)]
        while app.entered < limit:  # every held request is inside the app
            await asyncio.sleep(0)
        extra = asyncio.create_task(_request(guard, _scope(2), [b"{}"]))
        # Until it is answered or it reaches the app (let through: it would wait there with the
        # held ones), then every request is released, so that a wrong guard fails, not hangs.
        while not extra.done() and app.entered == limit:
            await asyncio.sleep(0)
        hold.set()
        refused = await extra
        answered = await asyncio.gather(*held)
        after = await _request(guard, _scope(2), [b"{}"])  # all finished: room again
        return refused, answered, after, app.entered

    refused, answered, after, entered = asyncio.run(scenario())
    assert refused[0] == 503 and refused[1]["error"] == "overloaded"
    assert refused[1]["detail"] == f"{limit} requests are being handled (--max-connections {limit})"
    assert [a[0] for a in answered] == [200] * limit and after[0] == 200 and entered == limit + 1


class FakeClock:
    """``time.monotonic`` of serve/limits.py, advanced by the stand-in client, not by waiting."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


@pytest.mark.parametrize("chunks, refused", [(3, False), (4, True)])
def test_the_body_deadline_counts_from_the_request_start_not_per_read(monkeypatch, chunks, refused):
    """--body-timeout-s 0.4 and a client sending a chunk every 0.15 s: three chunks (the last read
    at 0.30 s) arrive in time; with four the last read starts at 0.45 s, past the deadline, though
    no single read took longer than 0.15 s."""
    clock = FakeClock()
    monkeypatch.setattr(limits, "time", clock)
    app = App()
    guard = _guard(app, body_timeout_s=0.4)
    left = [b"x"] * chunks

    async def receive():
        body = left.pop(0)
        clock.now += 0.15  # the chunk took this long to arrive
        return {"type": "http.request", "body": body, "more_body": bool(left)}

    sent: list[dict] = []

    async def send(msg):
        sent.append(msg)

    asyncio.run(guard(_scope(), receive, send))
    if refused:
        assert sent[0]["status"] == 408 and app.bodies == []
        assert json.loads(sent[1]["body"])["detail"] == "the body was not received within --body-timeout-s 0.4 s"
    else:
        assert sent[0]["status"] == 200 and app.bodies == [b"x" * chunks]
