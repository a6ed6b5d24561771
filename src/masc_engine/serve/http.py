"""uvicorn's HTTP/1.1 protocol (h11) with a header deadline and JSON error bodies.

uvicorn has no timeout for a request's headers: ``timeout_keep_alive`` covers only the idle time
between requests and is cancelled by any byte received, so a client sending one header byte at
a time holds its connection forever (slowloris; uvicorn's tracker, #157, lists
``--timeout-request-start`` as not done). :func:`guarded_protocol` makes an ``H11Protocol``
subclass that:

- gives each request ``header_timeout_s`` from its first byte (or from the connection, for the
  first request) to complete its headers; past it the connection gets 408 with the service's
  JSON error body and is closed (a connection that sent nothing is closed without a word). A
  connection that finished a request and then trickles bytes without a new complete request
  is cut off the same way;
- answers malformed HTTP with the JSON error body (400 ``bad_http``) instead of uvicorn's plain
  text;
- closes a connection whose request body is still arriving with a *lingering close*: a refusal
  answered before the body was read (413 from Content-Length, 415, 401, 503 ``not_ready`` or
  ``overloaded``) is followed by a half-close (FIN after the response) while the rest of the body
  is read and discarded, up to ``linger_s`` seconds and ``linger_bytes`` bytes, until the client
  closes its side. A plain ``close()`` with unread bytes makes the kernel send a TCP reset, and a
  client still sending its body then reads ``Connection reset by peer`` or ``Broken pipe``
  instead of the answer already on the wire: uvicorn's keep-alive timer (5 s) did exactly that to
  a client whose body paused for longer after an early refusal (a loaded machine's first request
  while the bundle loads).

What follows the headers is the app's: the body deadline, the request limit, the refusal of a
request with both ``Content-Length`` and ``Transfer-Encoding`` and every other error body live
in serve/limits.py. ``limit_concurrency`` is not used: uvicorn answers it with a
plain-text 503 and counts slow, header-less sockets against it, which would make ``/healthz``
fail while clients stall.
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import error_body

log = logging.getLogger("masc_engine.serve")


def _raw_response(status: int, error: str, detail: str) -> bytes:
    body = error_body(error, None, detail)
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _LingeringTransport:
    """The connection's transport as the protocol sees it: ``close()`` while the peer is still
    sending a request body becomes a lingering close (module docstring); all else is the transport's."""

    def __init__(self, transport, protocol):
        self._t, self._p = transport, protocol
        self.lingering = False

    def __getattr__(self, name):
        return getattr(self._t, name)

    def hard_close(self) -> None:
        """Close the socket now (the end of a lingering close)."""
        self._t.close()

    def is_closing(self) -> bool:
        return self.lingering or self._t.is_closing()

    def close(self) -> None:
        if self.lingering or self._t.is_closing():
            return
        if self._p.conn.their_state is h11.SEND_BODY and self._t.can_write_eof():
            self.lingering = True
            self._p.start_linger(self._t)
        else:
            self._t.close()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline, JSON 400/408 bodies and lingering close; its
    settings are class attributes, set per server by :func:`guarded_protocol`."""

    header_timeout_s: float = 10.0
    linger_s: float = 30.0
    linger_bytes: int = 64 * 2**20
    on_reject = None  # staticmethod(callable) or None
    # uvicorn types it asyncio.Transport; connection_made hands uvicorn the wrapper, which
    # delegates every other attribute to the real transport (a duck, not a subclass).
    transport: _LingeringTransport  # type: ignore[assignment]

    def connection_made(self, transport) -> None:
        super().connection_made(cast(asyncio.Transport, _LingeringTransport(transport, self)))
        self._header_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._discarded = 0
        self._arm()

    def start_linger(self, transport) -> None:
        """Half-close after the response; read and discard the body until the client closes,
        ``linger_s`` pass or ``linger_bytes`` arrive (then close)."""
        self._disarm()
        self._unset_keepalive_if_required()
        transport.write_eof()  # FIN once the response is flushed
        transport.resume_reading()
        self._linger_timer = self.loop.call_later(self.linger_s, transport.close)  # the real transport

    def shutdown(self) -> None:
        if self.transport.lingering:  # SIGTERM: the answer is out; do not hold the exit
            self.transport.hard_close()
            return
        super().shutdown()

    def eof_received(self):
        if self.transport.lingering:
            self.transport.hard_close()
        return super().eof_received()

    def _linger_read(self, data: bytes) -> None:
        self._discarded += len(data)
        if self._discarded > self.linger_bytes:
            self.transport.hard_close()

    def _idle(self) -> bool:
        """No request is being handled (none yet, or the last one was answered)."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_deadline)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        if self.transport.lingering:
            return self._linger_read(data)
        if self._idle() and self.conn.their_state is not h11.SEND_BODY:
            self._arm()  # a new request starts with these bytes
        cycle = self.cycle
        super().data_received(data)
        if self.cycle is not cycle:  # its headers are complete: the app has it now
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self.transport.close()  # answered before its body was read: linger, then close
            return
        if self.cycle is not None and not self.cycle.response_complete:  # a pipelined request started
            self._disarm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._idle():
            return
        partial = self.conn.their_state is not h11.IDLE or bool(self.conn.trailing_data[0])
        if partial:  # part of a request arrived, not all of its headers
            self.transport.write(
                _raw_response(
                    408,
                    "header_timeout",
                    f"the request headers were not received within --header-timeout-s {self.header_timeout_s:g} s",
                )
            )
            if self.on_reject is not None:
                self.on_reject("header_timeout", 408)
        self.transport.close()  # else an idle connection: closed without a word, as keep-alive does

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        body = error_body("bad_http", None, f"not a valid HTTP/1.1 request: {msg}")
        headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
        try:
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # h11 cannot answer in this state: the raw bytes
            self.transport.write(_raw_response(400, "bad_http", f"not a valid HTTP/1.1 request: {msg}"))
        self.transport.close()
        if self.on_reject is not None:
            self.on_reject("bad_http", 400)


def guarded_protocol(
    header_timeout_s: float, on_reject=None, linger_s: float = 30.0, linger_bytes: int = 64 * 2**20
) -> type:
    """An ``H11Protocol`` subclass with a header deadline, JSON 400/408 bodies and lingering close.

    Args:
        header_timeout_s: seconds a request's headers may take.
        on_reject (callable | None): ``on_reject(error, status)`` for each connection answered here (metrics).
        linger_s: seconds a connection answered before its body was read keeps reading (and
            discarding) the rest of the body before it is closed (``--body-timeout-s``).
        linger_bytes: most bytes so discarded (``--max-body-mb``).

    Returns:
        the class, for ``uvicorn.run(..., http=cls)``.
    """
    settings = {
        "header_timeout_s": header_timeout_s,
        "linger_s": linger_s,
        "linger_bytes": linger_bytes,
        "on_reject": staticmethod(on_reject) if on_reject is not None else None,
    }
    return type("GuardedH11Protocol", (GuardedH11Protocol,), settings)
