"""masc-serve attacked as a production eval service is: huge prompts, formats whose decoders
run programs or crash, slow sockets, malformed HTTP, internal faults, decompression-sized images.
Each gets the documented JSON error (never plain text, never a 5xx for input), costs little, and
leaves the service and the neighbour items healthy.

Every server listens on 127.0.0.1 only; every socket and loop is bounded in time.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES
from test_serve import Server

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (test extra)")
pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")

HEADER_TIMEOUT_S, BODY_TIMEOUT_S = 3, 4


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _png(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def good_item() -> dict:
    row = {
        "ref_image": "images/cat/00.jpg",
        "ref_mask": "masks/cat/00.png",
        "out_image": "images/cat/01.jpg",
        "out_mask": "masks/cat/01.png",
    }
    return {
        **{k: b64((EXAMPLES / v).read_bytes()) for k, v in row.items()},
        "prompt": "a cat on the beach",
        "object_name": "cat",
    }


@pytest.fixture(scope="module")
def fake_gs(tmp_path_factory) -> tuple[Path, Path]:
    """A ``gs`` first on the server's PATH that records every call (Pillow's EPS plugin runs
    Ghostscript on EPS/PS files; the allowlist must keep it from ever being called)."""
    d = tmp_path_factory.mktemp("fake-gs")
    record = d / "calls.txt"
    gs = d / "gs"
    gs.write_text(f'#!/bin/sh\necho "gs $*" >> {record}\nexit 1\n')
    gs.chmod(0o755)
    return d, record


@pytest.fixture(scope="module")
def server(naflex_bundle, tmp_path_factory, fake_gs):
    """Default settings, except short header and body deadlines (so the tests wait seconds)."""
    env = {**os.environ, "PATH": f"{fake_gs[0]}{os.pathsep}{os.environ.get('PATH', '')}"}
    srv = Server(
        naflex_bundle,
        "--header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--body-timeout-s",
        str(BODY_TIMEOUT_S),
        log=tmp_path_factory.mktemp("serve-hostile") / "server.log",
        env=env,
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def _metric(srv, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M))


def _status(pid: int, key: str) -> int:
    """A /proc/PID/status field in bytes (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS


def _raw(port: int, head: bytes, body=(), timeout: float = 30) -> tuple[int, dict, int]:
    """Send ``head`` then the ``body`` chunks from a thread (a client that keeps sending after
    the answer); returns ``(status, JSON body, body bytes handed to the socket when the answer
    arrived)``: at most what the server read plus the two sockets' buffers and one chunk."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sent = [0]

    def pump():
        try:
            for chunk in body:
                s.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            pass

    s.sendall(head)
    threading.Thread(target=pump, daemon=True).start()
    reply = b""
    try:
        reply += s.recv(65536)
        sent_at_answer = sent[0] + max((len(c) for c in body), default=0)  # the chunk being sent, too
        while b"\r\n\r\n" not in reply:
            reply += s.recv(65536)
        head_part, _, rest = reply.partition(b"\r\n\r\n")
        n = int(re.search(rb"content-length: (\d+)", head_part, re.I).group(1))
        while len(rest) < n:
            rest += s.recv(65536)
    finally:
        s.close()
    return int(head_part.split()[1]), json.loads(rest[:n]), sent_at_answer


def _multipart(fields: dict, files: dict, boundary: bytes = b"masc-boundary") -> tuple[bytes, list[bytes]]:
    """A multipart body as head + chunks (the last field streamed in 1 MiB pieces)."""
    parts = []
    for k, v in files.items():
        parts.append(
            b'--%s\r\nContent-Disposition: form-data; name="%s"; filename="%s"\r\n\r\n%s\r\n'
            % (boundary, k.encode(), k.encode(), v)
        )
    for k, v in fields.items():
        parts.append(b'--%s\r\nContent-Disposition: form-data; name="%s"\r\n\r\n' % (boundary, k.encode()))
        parts.append(v)
        parts.append(b"\r\n")
    parts.append(b"--%s--\r\n" % boundary)
    chunks = [c[i : i + 2**20] for c in parts for i in range(0, max(len(c), 1), 2**20)]
    total = sum(len(c) for c in chunks)
    head = (
        b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=%s\r\n"
        b"Content-Length: %d\r\n\r\n" % (boundary, total)
    )
    return head, chunks


# ------------------------------------------------------------------ prompts


def test_huge_prompts_are_refused_cheaply(server, good_item):
    """4 MB and 60 MB prompts (JSON and multipart) get 422 prompt_too_long; a multipart text
    field is cut off while parsing, so the server's memory barely moves and the 60 MB body is
    answered long before the client has sent it (work done, not time: the sockets' timeouts only
    guard against hangs)."""
    pid = server.proc.pid
    files = {k: base64.b64decode(good_item[k]) for k in ("ref_image", "ref_mask", "out_image", "out_mask")}
    for size in (4 * 2**20, 60 * 2**20):
        rss0 = _status(pid, "VmRSS")
        _reset_peak(pid)
        head, chunks = _multipart({"object_name": b"cat", "prompt": b"a " * (size // 2)}, files)
        status, body, sent = _raw(server.port, head, chunks)
        grew = _status(pid, "VmHWM") - rss0
        assert (status, body["error"]) == (422, "prompt_too_long"), body
        assert grew < 50 * 2**20, (size, grew / 2**20)
        if size > 32 * 2**20:  # far more than the sockets buffer: the answer came before the body was read
            assert sent < size // 2, (size, sent)
    rss0 = _status(pid, "VmRSS")
    _reset_peak(pid)
    r = httpx.post(server.url + "/v1/score", json={**good_item, "prompt": "a " * 2 * 2**20}, timeout=30)
    assert _status(pid, "VmHWM") - rss0 < 50 * 2**20
    assert r.status_code == 422 and r.json() == {
        "error": "prompt_too_long",
        "field": "prompt",
        "detail": "prompt: 4194304 characters, over the budget of 4096 bytes",
    }
    # A JSON body is read whole before it is parsed (bounded by --max-body-mb), then refused on
    # its text budget: nothing of it is scored.
    body = json.dumps({"items": [good_item, {**good_item, "object_name": "c" * 60 * 2**20}]}).encode()
    decoded = _metric(server, "masc_reference_cache_misses_total")
    r = httpx.post(
        server.url + "/v1/score_batch", content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == 422 and _metric(server, "masc_reference_cache_misses_total") == decoded, r.text
    assert r.json()["field"] == "items[1].object_name"
    r = httpx.post(server.url + "/v1/score", json={**good_item, "prompt": "dog " * 700}, timeout=30)
    assert r.status_code == 422 and "tokens, over the budget of 512" in r.json()["detail"]  # bytes fit, tokens not
    ok = httpx.post(server.url + "/v1/score", json={**good_item, "prompt": "a dog " * 40}, timeout=60)
    assert ok.status_code == 200 and ok.json()["prompt_truncated"] is True  # over 64 tokens: truncated, as masc-run


def test_request_strings_come_back_intact(server, good_item):
    """Every string of a response is the request's own or the library's: path-like text in a
    prompt is data (the service feeds the job layer no fake paths and rewrites nothing)."""
    from masc_engine.runtime.stripping import pf_prompt

    prompts = [f"a cat from /{i}/ to /{i + 1}/ on the beach" for i in range(1, 9)]
    r = httpx.post(server.url + "/v1/score", json={**good_item, "prompt": prompts[1]}, timeout=60).json()
    assert r["prompt_text"] == pf_prompt(prompts[1], "cat", "regex")[0] and "/2/ to /3/" in r["prompt_text"]
    items = [{**good_item, "prompt": p} for p in prompts]
    items[0]["out_image"] = b64(b"/7/ not an image /1/")
    got = httpx.post(server.url + "/v1/score_batch", json={"items": items}, timeout=120).json()["results"]
    assert got[0]["status"] == "unreadable_image" and got[0]["status_detail"].startswith("items[0].out_image: ")
    for p, res in zip(prompts[1:], got[1:]):
        assert res["status"] == "ok" and res["prompt_text"] == pf_prompt(p, "cat", "regex")[0]


# ------------------------------------------------------------------ formats


def _dds_with_bad_pixel_format() -> bytes:
    """A DDS header whose pixel-format flags are 0 (Pillow's DDS plugin raises NotImplementedError)."""
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(out, "DDS")
    data = bytearray(out.getvalue())
    struct.pack_into("<I", data, 4 + 76, 0)  # after the magic, DDS_HEADER.ddspf.dwFlags
    return bytes(data)


def _eps() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 120, 0)).save(out, "EPS")
    return out.getvalue()


def _pdf() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 0, 200)).save(out, "PDF")
    return out.getvalue()


PS = b"%!PS-Adobe-3.0\n%%BoundingBox: 0 0 32 32\nnewpath 0 0 moveto 32 32 lineto stroke showpage\n%%EOF\n"


def test_formats_outside_the_allowlist_get_422_and_spawn_nothing(server, good_item, fake_gs):
    record = fake_gs[1]
    for name, data in (("eps", _eps()), ("ps", PS), ("pdf", _pdf()), ("dds", _dds_with_bad_pixel_format())):
        for field in ("ref_image", "out_mask"):
            r = httpx.post(server.url + "/v1/score", json={**good_item, field: b64(data)}, timeout=60)
            assert r.status_code == 422, (name, r.status_code, r.text)
            body = r.json()
            want = "unreadable_image" if "image" in field else "unreadable_mask"
            assert (body["error"], body["field"]) == (want, field) and "JPEG, PNG, WebP, TIFF or BMP" in body["detail"]
        files = {k: (k, base64.b64decode(good_item[k])) for k in ("ref_image", "ref_mask", "out_image", "out_mask")}
        files["out_image"] = (f"x.{name}", data)
        r = httpx.post(server.url + "/v1/score", files=files, data={"prompt": "a cat"}, timeout=60)
        assert r.status_code == 422 and r.json()["error"] == "unreadable_image", r.text
    assert not record.exists(), record.read_text()  # Ghostscript was never run
    # Beside a bad item, a good one is scored (the bad one gets its row status).
    bad = {**good_item, "out_image": b64(_dds_with_bad_pixel_format())}
    got = httpx.post(
        server.url + "/v1/score_batch",
        json={"items": [bad, good_item, {**good_item, "ref_image": b64(PS)}]},
        timeout=120,
    ).json()["results"]
    assert [g["status"] for g in got] == ["unreadable_image", "ok", "unreadable_image"]
    assert got[1] == httpx.post(server.url + "/v1/score", json=good_item, timeout=60).json()
    assert _metric(server, 'masc_requests_total{code="500",path="/v1/score"}') == 0


# ------------------------------------------------------------------ slow clients and the server's own errors


def test_slow_headers_are_cut_off_and_probes_stay_fast(server):
    """200 sockets that never finish their headers: /healthz and /readyz answer within a second
    meanwhile, and each socket gets 408 JSON once --header-timeout-s has passed."""
    socks = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-")
        socks.append(s)
    t_open = time.monotonic()
    try:
        for path in ("/healthz", "/readyz"):
            # answered while the stalled sockets wait (the client's timeout only guards a hang)
            assert httpx.get(server.url + path, timeout=5).status_code == 200
        answers = []
        for s in socks:
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            answers.append(reply)
        waited = time.monotonic() - t_open
    finally:
        for s in socks:
            s.close()
    assert all(a.startswith(b"HTTP/1.1 408 ") and b'"error":"header_timeout"' in a for a in answers), answers[0]
    assert HEADER_TIMEOUT_S - 1 <= waited < HEADER_TIMEOUT_S + 10
    assert _metric(server, 'masc_errors_total{reason="header_timeout"}') >= 200


def test_slow_bodies_hit_a_deadline_and_never_block_the_probes(server, good_item):
    """150 requests whose bodies stall (more than the default --max-connections 128): the probes
    answer within a second, a scoring request past the limit gets 503 JSON, every stalled one 408
    at --body-timeout-s; a body trickling one byte every 0.5 s gets its 408 at the deadline too
    (a whole-body deadline, not a per-read timeout)."""
    head = b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
    trickle = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    trickle.sendall(head)
    time.sleep(0.2)  # in flight before the others
    socks = []
    for _ in range(150):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(head)
        socks.append(s)
    stop = threading.Event()

    def drip():
        while not stop.wait(0.5):
            try:
                trickle.sendall(b" ")
            except OSError:
                return

    threading.Thread(target=drip, daemon=True).start()
    t_open = time.monotonic()
    try:
        time.sleep(0.5)
        for path in ("/healthz", "/readyz", "/metrics"):
            # answered while the stalled sockets wait (the client's timeout only guards a hang)
            assert httpx.get(server.url + path, timeout=5).status_code == 200
        r = httpx.post(server.url + "/v1/score", json=good_item, timeout=30)
        assert r.status_code == 503 and r.json()["error"] == "overloaded" and r.headers["retry-after"] == "1"
        replies = []
        for s in [*socks, trickle]:
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            replies.append(reply)
        waited = time.monotonic() - t_open
    finally:
        stop.set()
        for s in [*socks, trickle]:
            s.close()
    codes = [int(r.split()[1]) for r in replies]
    assert codes.count(408) >= 128 and set(codes) <= {408, 503}, codes
    assert codes[-1] == 408 and b'"error":"body_timeout"' in replies[-1]  # the trickling one
    assert waited < BODY_TIMEOUT_S + 10
    assert httpx.post(server.url + "/v1/score", json=good_item, timeout=60).status_code == 200


def test_malformed_http_gets_the_json_error_body(server):
    for raw in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(raw)
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"application/json" in head.lower(), reply
        assert json.loads(body)["error"] == "bad_http"
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200


def test_an_internal_fault_is_a_json_500_and_counted(naflex_bundle, good_item, monkeypatch):
    """Whatever escapes the app is the documented JSON 500 (not Starlette's or uvicorn's plain
    text), the next request is served, and /metrics counts the 500."""
    from fastapi.testclient import TestClient

    from masc_engine.serve.app import ServeConfig, create_app
    from masc_engine.serve.glue import ServiceScorer

    app = create_app(ServeConfig(bundle=str(naflex_bundle)))
    with TestClient(app) as client:
        deadline = time.time() + 120
        while client.get("/readyz").status_code != 200 and time.time() < deadline:
            time.sleep(0.2)
        real = ServiceScorer.score

        def broken(self, items):
            raise RuntimeError("a bug in the engine")

        monkeypatch.setattr(ServiceScorer, "score", broken)
        r = client.post("/v1/score", json=good_item)
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["error"] == "internal_error" and "bug" not in r.json()["detail"]
        monkeypatch.setattr(ServiceScorer, "score", real)
        assert client.post("/v1/score", json=good_item).status_code == 200
        text = client.get("/metrics").text
        assert 'masc_requests_total{code="500",path="/v1/score"} 1.0' in text
        assert 'masc_errors_total{reason="internal_error"} 1.0' in text


# ------------------------------------------------------------------ memory


@pytest.mark.slow
def test_decoded_memory_stays_under_the_budget_and_returns(naflex_bundle, tmp_path):
    """Eight 6000 x 6000 images with their masks in one /v1/score_batch: the server's peak RSS
    grows by at most --max-decoded-mb plus the documented slack, and falls back after the spike
    (freed heap returned to the system)."""
    budget_mb = 512
    srv = Server(naflex_bundle, "--max-decoded-mb", str(budget_mb), log=tmp_path / "server.log")
    try:
        img, mask = _png(np.zeros((6000, 6000, 3), np.uint8)), _png(np.zeros((6000, 6000), np.uint8))
        m = np.zeros((6000, 6000), np.uint8)
        m[2000:4000, 2000:4000] = 255
        item = {
            "ref_image": b64(img),
            "ref_mask": b64(_png(m)),
            "out_image": b64(img),
            "out_mask": b64(mask),
            "prompt": "a black square",
            "object_name": "square",
        }
        time.sleep(1)
        idle = _status(srv.proc.pid, "VmRSS")
        _reset_peak(srv.proc.pid)
        r = httpx.post(srv.url + "/v1/score_batch", json={"items": [item] * 8}, timeout=300)
        assert r.status_code == 200 and [x["status"] for x in r.json()["results"]] == ["ok"] * 8, r.text[:500]
        peak = _status(srv.proc.pid, "VmHWM") - idle
        time.sleep(1)
        after = _status(srv.proc.pid, "VmRSS") - idle
    finally:
        assert srv.stop() == 0
    # docs/service.md: decoding <= --max-decoded-mb; the rest is the body, its base64 copy and
    # the reduced items (8 x 2 x 3 MiB of patches at this bundle's budget): well under 256 MiB.
    assert peak < (budget_mb + 256) * 2**20, peak / 2**20
    assert after < 128 * 2**20, after / 2**20
