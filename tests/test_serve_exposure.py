"""What masc-serve shows and to whom: no answer names a server path (bundle folders, a failed
load's cause: the log has them), HEAD answers on the probes, Swagger UI and ReDoc (CDN scripts)
are off unless asked for, ``--api-key-file`` requires a bearer token everywhere but the probes,
and a request with both Content-Length and Transfer-Encoding is refused.

Every server listens on 127.0.0.1 only; every socket has a timeout against hangs.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys

import pytest

from support import EXAMPLES
from test_serve import Server

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (test extra)")
pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")

KEY = "k3y-0f-the-service"
PROBES = ("/healthz", "/readyz", "/metrics")


@pytest.fixture(scope="module")
def server(naflex_bundle, tmp_path_factory):
    """Default options: no key."""
    srv = Server(naflex_bundle, log=tmp_path_factory.mktemp("serve-exposure") / "server.log")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def keyed(naflex_bundle, tmp_path_factory):
    """With ``--api-key-file``."""
    d = tmp_path_factory.mktemp("serve-keyed")
    (d / "key").write_text(KEY + "\n")
    srv = Server(naflex_bundle, "--api-key-file", str(d / "key"), log=d / "server.log")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


@pytest.fixture(scope="module")
def item() -> dict:
    row = {
        "ref_image": "images/cat/00.jpg",
        "ref_mask": "masks/cat/00.png",
        "out_image": "images/cat/01.jpg",
        "out_mask": "masks/cat/01.png",
    }
    return {
        **{k: base64.b64encode((EXAMPLES / v).read_bytes()).decode() for k, v in row.items()},
        "prompt": "a cat on the beach",
        "object_name": "cat",
    }


def test_readyz_names_no_server_path(server, naflex_bundle):
    from masc_engine.engine.bundle import Bundle

    r = httpx.get(server.url + "/readyz", timeout=30)
    assert r.status_code == 200 and str(naflex_bundle) not in r.text and "/tmp" not in r.text
    assert r.json()["bundle"] == {"fingerprint": Bundle(naflex_bundle).fingerprint}
    assert r.json()["cache"] == "off"


def test_head_answers_on_the_probes(server):
    for path in PROBES:
        r = httpx.head(server.url + path, timeout=30)
        assert (r.status_code, r.content) == (200, b""), path


def test_docs_pages_are_off_by_default(server):
    for path in ("/docs", "/redoc"):
        r = httpx.get(server.url + path, timeout=30)
        assert r.status_code == 404 and r.json()["error"] == "not_found" and "cdn" not in r.text.lower()
    assert httpx.get(server.url + "/openapi.json", timeout=30).json()["info"]["title"] == "masc-serve"


def test_bearer_token_guards_everything_but_the_probes(keyed, item):
    server = keyed
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        r = httpx.post(server.url + "/v1/score", json=item, headers=headers, timeout=60)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
        assert r.json() == {
            "error": "unauthorized",
            "field": None,
            "detail": "send Authorization: Bearer <key> (the key of --api-key-file)",
        }
    assert httpx.get(server.url + "/openapi.json", timeout=30).status_code == 401
    for path in PROBES:
        assert httpx.get(server.url + path, timeout=30).status_code == 200, path
    ok = httpx.post(server.url + "/v1/score", json=item, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert ok.status_code == 200 and ok.json()["status"] == "ok"


def test_two_authorization_headers_are_refused_whichever_holds_the_key(keyed, item):
    for first, second in ((KEY, "wrong"), ("wrong", KEY), (KEY, KEY)):
        headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
        r = httpx.post(keyed.url + "/v1/score", json=item, headers=headers, timeout=60)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
        assert r.json() == {
            "error": "unauthorized",
            "field": None,
            "detail": "one Authorization header is expected: send Authorization: Bearer <key> once",
        }
    ok = httpx.post(keyed.url + "/v1/score", json=item, headers=[("Authorization", f"Bearer {KEY}")], timeout=120)
    assert ok.status_code == 200 and ok.json()["status"] == "ok"


def test_both_length_headers_are_refused(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    try:
        s.sendall(
            b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
        )
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    finally:
        s.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split()[1] == b"400" and json.loads(body)["error"] == "bad_http", reply


@pytest.mark.slow
def test_failed_load_names_no_path(naflex_bundle, tmp_path):
    """A bundle that fails to load: /readyz and /v1/score say load_failed / not_ready without the
    server's paths or the exception text; the log has the cause."""
    broken = tmp_path / "secret-folder" / "bundle"
    shutil.copytree(naflex_bundle, broken)
    (broken / "vision.onnx").write_bytes(b"not a graph")
    for f in broken.glob("vision.ort-*.onnx"):
        f.write_bytes(b"not a graph")
    log = tmp_path / "server.log"
    srv = Server.__new__(Server)
    srv.log, srv.port = log, __import__("test_serve")._free_port()
    srv.url = f"http://127.0.0.1:{srv.port}"
    srv.proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "masc_engine.cli.serve_cmd",
            "--bundle",
            str(broken),
            "--host",
            "127.0.0.1",
            "--port",
            str(srv.port),
            "--log-level",
            "warning",
        ],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(1200):  # until the load has failed (a hang guard, not a time bound)
            assert srv.proc.poll() is None, log.read_text()[-3000:]
            try:
                r = httpx.get(srv.url + "/readyz", timeout=30)
                if r.json()["error"] == "load_failed":
                    break
            except httpx.TransportError:
                pass
            __import__("time").sleep(0.2)
        assert r.status_code == 503 and "secret-folder" not in r.text and "/tmp" not in r.text, r.text
        s = httpx.post(srv.url + "/v1/score", json={"prompt": "x"}, timeout=30)
        assert s.status_code == 503 and s.json()["error"] == "not_ready" and "secret-folder" not in s.text
    finally:
        assert srv.stop() == 0
    assert "secret-folder" in log.read_text()  # the operator's log keeps the cause


@pytest.mark.parametrize("content", ["", "  \n", "two words"])
@pytest.mark.slow
def test_bad_api_key_file_is_one_line(naflex_bundle, tmp_path, content):
    key = tmp_path / "key"
    key.write_text(content)
    for path in (key, tmp_path / "missing"):
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "masc_engine.cli.serve_cmd",
                "--bundle",
                str(naflex_bundle),
                "--api-key-file",
                str(path),
                "--port",
                "9",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 1 and p.stderr.strip().splitlines() == [p.stderr.strip()], p.stderr
        assert p.stderr.startswith(f"Error: --api-key-file {path}: "), p.stderr
