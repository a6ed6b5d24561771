"""masc-serve never resets a request it answered: a refusal sent before the body was read (415,
413, 503 not_ready while the bundle loads) is followed by a lingering close, so a client still
sending its body (paused by a loaded machine) reads the answer instead of ``Connection reset by
peer`` or ``Broken pipe``.

Outcomes only: every socket has a generous timeout against hangs, and no time is asserted.
Every server listens on 127.0.0.1 only.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import multiprocessing
import os
import re
import socket
import subprocess
import time

import pytest

from test_serve import SERVE, Server, _free_port

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (test extra)")
pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")

#: Longer than uvicorn's keep-alive timer (5 s), which used to close such a connection mid-body.
CLIENT_PAUSE_S = 6.5


def _post_paused(port: int, path: str, ctype: str, body: bytes, pause_s: float) -> tuple[int, dict, bytes]:
    """POST the headers, pause (a client starved of CPU), then the body; read the whole answer to
    EOF. Returns ``(status, JSON body, anything after it)``; a reset raises ``OSError``."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        s.sendall(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), ctype.encode(), len(body))
        )
        time.sleep(pause_s)
        s.sendall(body)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    finally:
        s.close()
    head, _, rest = reply.partition(b"\r\n\r\n")
    n = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    return int(head.split()[1]), json.loads(rest[:n]), rest[n:]


@pytest.fixture(scope="module")
def server(naflex_bundle, tmp_path_factory):
    srv = Server(naflex_bundle, log=tmp_path_factory.mktemp("serve-load") / "server.log")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def test_early_refusal_survives_a_paused_body(server):
    """415 is answered from the headers; the client pauses past the keep-alive timer, then sends
    its 1 MiB body: it still reads the whole 415 JSON body and a clean end of stream."""
    status, body, extra = _post_paused(server.port, "/v1/score", "text/plain", b"x" * 2**20, CLIENT_PAUSE_S)
    assert (status, body["error"], extra) == (415, "unsupported_media_type", b"")
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200


def _busy() -> None:
    while True:
        pass


@pytest.mark.slow
def test_first_request_on_a_loaded_machine_gets_an_answer(naflex_bundle, tmp_path):
    """With busy processes on every core, the first ``POST /v1/score`` (a ~1 MiB JSON body) is
    sent as soon as ``/healthz`` answers, its body delayed as a starved client's would be: it
    reads a documented answer (503 ``not_ready`` while loading, else a result or a 4xx), never a
    reset; so do two more after it, sent together."""
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(max(2, os.cpu_count() or 2))]
    for p in busy:
        p.start()
    port = _free_port()
    log = tmp_path / "server.log"
    proc = subprocess.Popen(
        [*SERVE, "--bundle", str(naflex_bundle), "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    item = json.dumps(
        {
            "ref_image": "A" * 2**20,
            "ref_mask": "",
            "out_image": "",
            "out_mask": "",
            "prompt": "a cat",
            "object_name": "cat",
        }
    ).encode()
    answers = []
    try:
        for _ in range(600):  # until /healthz answers (a hang guard, not a time bound)
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        status, body, extra = _post_paused(port, "/v1/score", "application/json", item, CLIENT_PAUSE_S)
        answers.append((status, body["error"], extra))
        # The load was for the first request; the two after it, paused alike, go out together (one
        # pause, not two) on a machine given back to the rest of the suite.
        for p in busy:
            p.terminate()
        with ThreadPoolExecutor(2) as pool:
            later = pool.map(
                lambda _: _post_paused(port, "/v1/score", "application/json", item, CLIENT_PAUSE_S), range(2)
            )
            answers += [(status, body["error"], extra) for status, body, extra in later]
    finally:
        for p in busy:
            p.terminate()
        proc.terminate()
        proc.wait(60)
    documented = {(503, "not_ready"), (422, "unreadable_image"), (422, "bad_base64"), (422, "bad_value")}
    assert all((s, e) in documented and x == b"" for s, e, x in answers), (answers, log.read_text()[-2000:])
