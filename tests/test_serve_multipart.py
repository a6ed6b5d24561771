"""masc-serve's multipart reading (serve/parsing.py ``parse_multipart``), in process and without a
bundle: a body is read whole or refused with one documented error, never read as another request.

- A body cut short (no closing delimiter ``--<boundary>--``) is 400 ``malformed_multipart``:
  python-multipart drops the unterminated last part, which would score another request (an
  object name left out: the prompt is not stripped; a mask left out: the segmenter's).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from support import EXAMPLES

pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from masc_engine.serve.errors import ApiError  # noqa: E402
from masc_engine.serve.parsing import parse_multipart  # noqa: E402

BOUNDARY = b"XyZ"
FILES = {
    "ref_image": "images/cat/00.jpg",
    "ref_mask": "masks/cat/00.png",
    "out_image": "images/cat/01.jpg",
    "out_mask": "masks/cat/01.png",
}


def _part(name: str, data: bytes, filename: str | None = None) -> bytes:
    cd = f'Content-Disposition: form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
    return b"--" + BOUNDARY + b"\r\n" + cd.encode() + b"\r\n\r\n" + data + b"\r\n"


def _files() -> bytes:
    return b"".join(_part(k, (EXAMPLES / v).read_bytes(), "f") for k, v in FILES.items())


def _closed(body: bytes) -> bytes:
    return body + b"--" + BOUNDARY + b"--\r\n"


def _client(segmenter: bool = False) -> TestClient:
    """An app whose one route answers what ``parse_multipart`` read (file sizes, texts) or its error."""
    cfg = SimpleNamespace(max_prompt_bytes=4096, segmenter=object() if segmenter else None)
    app = FastAPI()

    @app.post("/read")
    async def read(request: Request):
        try:
            item = await parse_multipart(request, cfg)
        except ApiError as e:
            return JSONResponse({"error": e.error, "field": e.field}, status_code=e.status)
        sizes = {k: None if v is None else len(v) for k, v in item["data"].items()}
        return {"sizes": sizes, **{k: item[k] for k in ("prompt", "object_name", "stripper")}}

    return TestClient(app)


def _post(client: TestClient, body: bytes):
    headers = {"content-type": "multipart/form-data; boundary=" + BOUNDARY.decode()}
    return client.post("/read", content=body, headers=headers)


def _sizes() -> dict:
    return {k: (EXAMPLES / v).stat().st_size for k, v in FILES.items()}


def test_a_whole_body_is_read_part_for_part():
    body = _files() + _part("prompt", b"a cat on the beach") + _part("object_name", b"cat")
    r = _post(_client(), _closed(body))
    assert r.status_code == 200, r.text
    want = {"sizes": _sizes(), "prompt": "a cat on the beach", "object_name": "cat", "stripper": None}
    assert r.json() == want
    # an epilogue after the closing delimiter is allowed (RFC 2046 5.1.1) and changes nothing
    assert _post(_client(), _closed(body) + b"an epilogue\r\n").json() == want


@pytest.mark.parametrize("trailer", [b"", b"\r\n", b"\r\n--" + BOUNDARY])
def test_a_body_cut_after_its_last_part_is_refused(trailer):
    """The last part (object_name) complete but the closing delimiter missing or cut: read by
    python-multipart as a form without object_name, so the prompt would not be stripped."""
    body = _files() + _part("prompt", b"a cat on the beach") + _part("object_name", b"cat")
    r = _post(_client(), body[:-2] + trailer)
    assert (r.status_code, r.json()) == (400, {"error": "malformed_multipart", "field": None})


def test_a_body_cut_inside_a_mask_is_refused_with_a_segmenter():
    """With a segmenter a mask may be left out: a body cut inside out_mask, its last part, would be
    scored with the segmenter's mask."""
    body = _part("prompt", b"a cat on the beach") + _part("object_name", b"cat") + _files()
    whole = _post(_client(segmenter=True), _closed(body))
    assert whole.status_code == 200 and whole.json()["sizes"] == _sizes()
    r = _post(_client(segmenter=True), body[:-500])
    assert (r.status_code, r.json()) == (400, {"error": "malformed_multipart", "field": None})


def test_text_fields_may_come_as_files_each_counted_once():
    """``curl -F prompt=@prompt.txt``: every text field as a file upload (seven files in all) reads
    as the same fields sent as text; a field sent twice is its own 422, whatever its kind."""
    texts = {"prompt": b"a cat on the beach", "object_name": b"cat", "stripper": b"none"}
    as_files = _files() + b"".join(_part(k, v, k + ".txt") for k, v in texts.items())
    as_text = _files() + b"".join(_part(k, v) for k, v in texts.items())
    want = {"sizes": _sizes(), "prompt": "a cat on the beach", "object_name": "cat", "stripper": "none"}
    assert _post(_client(), _closed(as_files)).json() == want
    assert _post(_client(), _closed(as_text)).json() == want
    for twice in (_part("prompt", b"a", "p.txt"), _part("prompt", b"a"), _part("out_mask", b"m", "m.png")):
        r = _post(_client(), _closed(as_files + twice))
        field = "out_mask" if b'"out_mask"' in twice else "prompt"
        assert (r.status_code, r.json()) == (422, {"error": "bad_value", "field": field})
    r = _post(_client(), _closed(as_text + _part("notes", b"x", "n.txt")))
    assert (r.status_code, r.json()) == (422, {"error": "unknown_field", "field": "notes"})


@pytest.mark.parametrize("name", ["prompt", "object_name", "stripper"])
@pytest.mark.parametrize("filename", [None, "t.txt"])
def test_a_text_field_not_utf8_is_wrong_type_as_text_or_as_file(name, filename):
    """``e9 74 e9`` ("été" in Latin-1) is not UTF-8: 422 ``wrong_type`` whether sent as text or as
    a file, never read as Latin-1 (the JSON route cannot carry it either)."""
    texts = {"prompt": b"a cat on the beach", "object_name": b"cat", "stripper": b"none", name: b"a cat \xe9t\xe9"}
    body = _files() + b"".join(_part(k, v, filename if k == name else None) for k, v in texts.items())
    r = _post(_client(), _closed(body))
    assert (r.status_code, r.json()) == (422, {"error": "wrong_type", "field": name})
    texts[name] = "a cat été".encode()  # the same text in UTF-8 reads back intact
    body = _files() + b"".join(_part(k, v, filename if k == name else None) for k, v in texts.items())
    r = _post(_client(), _closed(body))
    if name == "stripper":
        assert (r.status_code, r.json()) == (422, {"error": "bad_value", "field": "stripper"})
    else:
        assert r.status_code == 200 and r.json()[name] == "a cat été"
