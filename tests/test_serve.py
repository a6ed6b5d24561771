"""masc-serve as a real process on 127.0.0.1: scores equal masc-metric 0.3.0 and
masc-run, micro-batched results equal unbatched ones bit for bit, hostile input gets a 4xx that
names the field, the service stays healthy, SIGTERM drains in-flight requests, and schemathesis
finds no 5xx or schema violation against the service's own OpenAPI document.

Every server here listens on loopback only; every request loop is bounded.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES, oracle_for, read_rows
from masc_engine.tolerances import ORACLE_SCORE_ATOL

httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (test extra)")
pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")

SERVE = [sys.executable, "-m", "masc_engine.cli.serve_cmd"]
#: (width, height) of the odd sizes the real photos are resized to, with the file format used.
ODD = [((333, 517), "PNG"), ((701, 289), "JPEG"), ((123, 77), "WEBP"), ((517, 333), "TIFF"), ((1001, 999), "PNG")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A masc-serve subprocess on 127.0.0.1 and a free port."""

    def __init__(self, bundle: Path, *args: str, log: Path, env: dict | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [
                *SERVE,
                "--bundle",
                str(bundle),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *args,
            ],
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, f"masc-serve exited: {log.read_text()[-3000:]}"
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"masc-serve not ready within 120 s: {log.read_text()[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture(scope="module")
def server(naflex_bundle, tmp_path_factory):
    srv = Server(
        naflex_bundle,
        "--max-batch",
        "8",
        "--max-wait-ms",
        "100",
        "--max-body-mb",
        "16",
        "--body-timeout-s",
        "3",
        log=tmp_path_factory.mktemp("serve") / "server.log",
    )
    yield srv
    assert srv.stop() == 0, srv.log.read_text()[-3000:]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _save(im: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    im.save(out, format=fmt, **({"quality": 92} if fmt in ("JPEG", "WEBP") else {}))
    return out.getvalue()


@pytest.fixture(scope="module")
def odd_items():
    """Real DreamBooth pairs (the shipped examples/dreambooth, in every clone) with references and
    outputs resized to odd sizes, saved as PNG, JPEG, WebP and TIFF: ``(json item, oracle args)``
    per pair."""
    all_rows = read_rows(EXAMPLES)
    rows = all_rows[:: len(all_rows) // len(ODD)][: len(ODD)]
    assert len(rows) == len(ODD)
    items = []
    for i, row in enumerate(rows):
        files = {}
        for side, (size, fmt) in (("ref", ODD[i]), ("out", ODD[(i + 2) % len(ODD)])):
            im = Image.open(EXAMPLES / row[f"{side}_image"]).convert("RGB").resize(size, Image.BILINEAR)
            m = Image.open(EXAMPLES / row[f"{side}_mask"]).convert("L").resize(size, Image.NEAREST)
            files[f"{side}_image"] = _save(im, fmt)
            files[f"{side}_mask"] = _save(m, "PNG")
        item = {k: b64(v) for k, v in files.items()}
        item.update(prompt=row["prompt"], object_name=row["object_name"])
        oracle_args = (
            Image.open(io.BytesIO(files["ref_image"])),
            np.array(Image.open(io.BytesIO(files["ref_mask"]))),
            Image.open(io.BytesIO(files["out_image"])),
            np.array(Image.open(io.BytesIO(files["out_mask"]))),
            row["prompt"],
            row["object_name"],
        )
        items.append((item, oracle_args))
    return items


def _post(srv: Server, path: str, client=httpx, **kw) -> httpx.Response:
    return client.post(srv.url + path, timeout=120, **kw)


def _metric(srv: Server, name: str) -> float:
    text = httpx.get(srv.url + "/metrics", timeout=10).text
    vals = [float(v) for v in re.findall(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)]
    return sum(vals)


def test_health_and_openapi(server):
    assert httpx.get(server.url + "/healthz").json() == {"status": "alive"}
    assert httpx.get(server.url + "/readyz").status_code == 200
    doc = httpx.get(server.url + "/openapi.json").json()
    assert {"/healthz", "/readyz", "/metrics", "/v1/score", "/v1/score_batch"} <= set(doc["paths"])
    # one request content type per operation (tests/test_serve_openapi.py: standard client generators)
    assert set(doc["paths"]["/v1/score"]["post"]["requestBody"]["content"]) == {"application/json"}
    assert set(doc["paths"]["/v1/score/upload"]["post"]["requestBody"]["content"]) == {"multipart/form-data"}


@pytest.mark.oracle
def test_score_equals_oracle_on_odd_sizes(server, naflex_bundle, odd_items):
    oracle = oracle_for(naflex_bundle)
    grids = set()
    for item, args in odd_items:
        r = _post(server, "/v1/score", json=item)
        assert r.status_code == 200, r.text
        got, ref = r.json(), oracle.score(*args)
        assert got["status"] == "ok", got
        assert abs(got["cp"] - ref.cp) <= ORACLE_SCORE_ATOL and abs(got["pf"] - ref.pf) <= ORACLE_SCORE_ATOL
        assert got["prompt_text"] == ref.extras["prompt_text"]
        assert (got["cp_n_ref_fg"], got["pf_n_total"]) == (ref.extras["cp_n_ref_fg"], ref.extras["pf_n_total"])
        grids.add(got["pf_n_total"])
    assert len(grids) >= 3  # the odd sizes really gave different patch grids


def test_multipart_equals_json(server, odd_items):
    item = odd_items[0][0]
    files = {k: (f"{k}.bin", base64.b64decode(item[k])) for k in ("ref_image", "ref_mask", "out_image", "out_mask")}
    r = _post(server, "/v1/score", files=files, data={"prompt": item["prompt"], "object_name": item["object_name"]})
    assert r.status_code == 200, r.text
    assert r.json() == _post(server, "/v1/score", json=item).json()


def test_concurrent_clients_are_batched_and_bit_identical(server, odd_items):
    """32 requests from 8 clients: all succeed, with exactly the scores each request gets alone."""
    items = [it for it, _ in odd_items]
    alone = [_post(server, "/v1/score", json=it).json() for it in items]
    batches0, n0 = _metric(server, "masc_batch_size_count"), _metric(server, "masc_batch_size_sum")
    hits0 = _metric(server, 'masc_reference_cache_hits_total{tier="memory"}')

    def client(c: int):
        with httpx.Client() as cl:
            return [
                (k, _post(server, "/v1/score", client=cl, json=items[k]))
                for k in ((c + j) % len(items) for j in range(4))
            ]

    with ThreadPoolExecutor(8) as ex:
        results = [x for chunk in ex.map(client, range(8)) for x in chunk]
    assert len(results) == 32
    for k, r in results:
        assert r.status_code == 200, r.text
        assert r.json() == alone[k]  # equality of every field, floats to the bit
    batches = _metric(server, "masc_batch_size_count") - batches0
    n = _metric(server, "masc_batch_size_sum") - n0
    assert n == 32 and batches < 32, (n, batches)  # some requests really shared a batch
    assert _metric(server, 'masc_reference_cache_hits_total{tier="memory"}') > hits0


def _png_header(width: int, height: int) -> bytes:
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def test_hostile_input_gets_4xx_naming_the_field(server, odd_items):
    item = odd_items[0][0]
    good = _post(server, "/v1/score", json=item).json()
    photo = sorted((EXAMPLES / "images").rglob("*.jpg"))[0]
    cases = [  # (body kwargs, status, error, field)
        (
            {"content": b"this is not json", "headers": {"content-type": "application/json"}},
            400,
            "malformed_json",
            None,
        ),
        ({"json": {k: v for k, v in item.items() if k != "out_mask"}}, 422, "missing_field", "out_mask"),
        ({"json": {**item, "ref_image": "%%% not base64 %%%"}}, 422, "bad_base64", "ref_image"),
        (
            {"json": {**item, "out_image": b64(b"just a text file\nwith two lines\n")}},
            422,
            "unreadable_image",
            "out_image",
        ),
        ({"json": {**item, "prompt": 5}}, 422, "wrong_type", "prompt"),
        ({"json": {**item, "object_name": ["cat"]}}, 422, "wrong_type", "object_name"),
        ({"json": {**item, "out_image": b64(_png_header(30000, 30000))}}, 422, "image_too_large", "out_image"),
        ({"json": {**item, "out_mask": item["ref_mask"]}}, 422, "mask_size_mismatch", "out_mask"),
        ({"json": {**item, "stripper": "spacy"}}, 422, "bad_stripper", "stripper"),
        ({"json": {**item, "extra": 1}}, 422, "unknown_field", "extra"),
        ({"json": [item]}, 422, "wrong_type", None),
        # A server-side path is never opened: as a string it is not base64, as base64 not an image.
        ({"json": {**item, "ref_image": str(photo)}}, 422, "bad_base64", "ref_image"),
        ({"json": {**item, "ref_image": b64(str(photo).encode())}}, 422, "unreadable_image", "ref_image"),
        (
            {"content": b"x" * (17 * 2**20), "headers": {"content-type": "application/json"}},
            413,
            "body_too_large",
            None,
        ),
        (
            {"content": iter([b"y" * 2**20] * 17), "headers": {"content-type": "application/json"}},
            413,
            "body_too_large",
            None,
        ),  # chunked: no Content-Length
        (
            {"content": b"a=b", "headers": {"content-type": "application/x-www-form-urlencoded"}},
            415,
            "unsupported_media_type",
            None,
        ),
        ({"files": {"ref_image": ("a.png", b"x")}, "data": {"prompt": "p"}}, 422, "missing_field", "ref_mask"),
        (
            {"json": {"items": [item, {**item, "prompt": None}]}, "path": "/v1/score_batch"},
            422,
            "wrong_type",
            "items[1].prompt",
        ),
    ]
    for kw, status, error, field in cases:
        path = kw.pop("path", "/v1/score")
        r = _post(server, path, **kw)
        assert r.status_code == status, (error, r.status_code, r.text)
        body = r.json()
        assert body["error"] == error and body["field"] == field and body["detail"], body
        if field:
            assert field in body["detail"]
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert httpx.get(server.url + "/readyz").status_code == 200
    assert _post(server, "/v1/score", json=item).json() == good  # still scoring, same result


def test_stalled_body_gets_408(server):
    """A client that stops sending mid-body is answered 408 after --body-timeout-s (3 s here)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(
            b"POST /v1/score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"ref_image": "'
        )
        t0 = time.time()
        reply = b""
        while chunk := s.recv(65536):  # until the server closes the connection
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 408"), reply
    assert '"error":"body_timeout"' in reply and time.time() - t0 < 15
    assert httpx.get(server.url + "/healthz").status_code == 200


def test_batch_records_equal_masc_run(server, naflex_bundle, odd_items, tmp_path):
    """/v1/score_batch gives masc-run's statuses and values for the same files, a bad item
    costing only its own record."""
    from masc_engine.jobs.pairs import RunOptions, run_pairs
    from masc_engine.runtime.scorer import Scorer

    item = odd_items[1][0]
    out_size = Image.open(io.BytesIO(base64.b64decode(item["out_image"]))).size
    ref_size = Image.open(io.BytesIO(base64.b64decode(item["ref_image"]))).size
    blank = lambda size, v: _save(Image.fromarray(np.full(size[::-1], v, np.uint8)), "PNG")  # noqa: E731
    variants = {
        "good": {},
        "broken": {"out_image": b64(b"not an image")},
        "mismatch": {"out_mask": b64(blank((40, 50), 255))},
        "empty_ref": {"ref_mask": b64(blank(ref_size, 0))},
        "no_bg": {"out_mask": b64(blank(out_size, 255))},
        "no_object": {"object_name": None},
        "other": odd_items[2][0],
    }
    items = [{**item, **v} for v in variants.values()]
    r = _post(server, "/v1/score_batch", json={"items": items})
    assert r.status_code == 200, r.text
    got = r.json()["results"]
    # The same files through masc-run (graph calls one image at a time: batch size 1, no padding).
    rows = []
    for i, it in enumerate(items):
        row = {"key": list(variants)[i], "prompt": it["prompt"], "object_name": it["object_name"] or ""}
        for f in ("ref_image", "ref_mask", "out_image", "out_mask"):
            (tmp_path / f"{i}_{f}").write_bytes(base64.b64decode(it[f]))
            row[f] = f"{i}_{f}"
        rows.append(row)
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    run_pairs(
        tmp_path / "pairs.csv",
        Scorer(naflex_bundle, batch_size=1),
        tmp_path / "out.jsonl",
        options=RunOptions(progress=False),
    )
    want = [json.loads(line) for line in open(tmp_path / "out.jsonl")]
    assert (
        [g["status"] for g in got]
        == [w["status"] for w in want]
        == ["ok", "unreadable_image", "mask_size_mismatch", "empty_reference_mask", "no_background", "ok", "ok"]
    )
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        for k, v in g.items():
            if k == "status_detail":
                assert bool(v) == bool(w[k]), (k, v, w[k])
            elif isinstance(w[k], float) and math.isnan(w[k]):
                assert v is None, (i, k, v)
            else:
                assert v == w[k], (i, k, v, w[k])  # to the bit
    assert "items[1].out_image" in got[1]["status_detail"] and "items[2].out_mask" in got[2]["status_detail"]
    assert "not stripped" in got[5]["status_detail"]


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_or_schema_violation(server, tmp_path):
    """schemathesis (coverage + fuzzing phases) against /openapi.json, bounded in time.

    ``positive_data_acceptance`` is excluded: a schema-valid base64 string is rarely a valid
    image, which the service rightly refuses with 422 (no OpenAPI keyword can say "an image")."""
    st = Path(sys.executable).with_name("schemathesis")
    if not st.exists():
        pytest.skip("schemathesis is not installed (test extra)")
    res = subprocess.run(
        [
            str(st),
            "run",
            server.url + "/openapi.json",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            "25",
            "--max-time",
            "30",
            "--workers",
            "1",
            "--generation-deterministic",
            "--request-timeout",
            "30",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env={**os.environ, "NO_COLOR": "1"},
        cwd=tmp_path,
    )  # schemathesis keeps state in ./.schemathesis
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert httpx.get(server.url + "/readyz").status_code == 200


@pytest.mark.slow
def test_sigterm_finishes_in_flight_requests(naflex_bundle, odd_items, tmp_path):
    srv = Server(naflex_bundle, "--max-batch", "1", "--max-wait-ms", "0", log=tmp_path / "server.log")
    items = [it for it, _ in odd_items]  # 5 pairs per request, one pair per batch: seconds in flight
    body = json.dumps({"items": items}).encode()
    try:
        with ThreadPoolExecutor(3) as ex:
            futs = [
                ex.submit(_post, srv, "/v1/score_batch", content=body, headers={"content-type": "application/json"})
                for _ in range(3)
            ]
            deadline = time.time() + 60
            while _metric(srv, 'masc_requests_in_flight{path="/v1/score_batch"}') < 3 and time.time() < deadline:
                time.sleep(0.05)  # until all three are being handled
            assert _metric(srv, "masc_batch_size_count") < 3 * len(items)  # and not finished
            t0 = time.time()
            srv.proc.send_signal(signal.SIGTERM)
            responses = [f.result() for f in futs]
        rc = srv.proc.wait(30)
        assert time.time() - t0 < 30
    finally:
        srv.stop()
    assert rc == 0, srv.log.read_text()[-3000:]
    for r in responses:
        assert r.status_code == 200, r.text
        assert [x["status"] for x in r.json()["results"]] == ["ok"] * len(items)
    with pytest.raises(httpx.TransportError):  # it no longer accepts connections
        httpx.get(srv.url + "/healthz", timeout=2)


def test_disk_cache_is_shared_with_masc_run(naflex_bundle, odd_items, tmp_path):
    """--cache-dir: what the service encodes, masc-run finds in the same cache (and vice versa)."""
    from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
    from masc_engine.runtime.cache import EncodingStore
    from masc_engine.runtime.scorer import Scorer
    from masc_engine.serve.glue import BYTE_FIELDS, ServiceScorer

    item = odd_items[3][0]
    data = {f: base64.b64decode(item[f]) for f in BYTE_FIELDS}
    scorer = Scorer(naflex_bundle, batch_size=1)
    ns = {
        "bundle": scorer.bundle.fingerprint,
        "budget": scorer.image_settings.max_num_patches,
        "exif": "apply",
        "provider": scorer.provider,
        "backend": scorer.backend,
        "precision": scorer.precision,
        "graph_variant": scorer.graph_variant,
    }
    store = EncodingStore(tmp_path / "cache", ns)
    svc = ServiceScorer(scorer, RunSettings(), store=store)
    rec = svc.score([svc.decode(data, item["prompt"], item["object_name"], None)])[0]
    store.close()
    row = {"prompt": item["prompt"], "object_name": item["object_name"]}
    for f in BYTE_FIELDS:
        (tmp_path / f).write_bytes(data[f])
        row[f] = f
    with open(tmp_path / "pairs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    summary = run_pairs(
        tmp_path / "pairs.csv",
        Scorer(naflex_bundle, batch_size=1),
        tmp_path / "out.jsonl",
        options=RunOptions(cache_dir=tmp_path / "cache", progress=False),
    )
    assert summary.cache_hits == 2 and summary.images_encoded == 0  # both images came from the service's entries
    want = json.loads(open(tmp_path / "out.jsonl").readline())
    assert (rec["cp"], rec["pf"], rec["status"]) == (want["cp"], want["pf"], want["status"])


def test_reference_cache_is_bounded_in_bytes(naflex_bundle, odd_items):
    """The in-memory reference LRU holds at most --cache-mb of patch tokens, evicting the least
    recently used reference; outputs are never cached."""
    from masc_engine.runtime.scorer import Scorer
    from masc_engine.serve.glue import BYTE_FIELDS, ServiceScorer

    items = [{f: base64.b64decode(it[f]) for f in BYTE_FIELDS} | {"prompt": it["prompt"]} for it, _ in odd_items[:4]]
    probe = ServiceScorer(Scorer(naflex_bundle), cache_bytes=2**30)
    sizes = []
    for it in items:
        probe.score([probe.decode(it, it["prompt"], None, None)])
        sizes.append(probe.memory.nbytes - sum(sizes))
    assert len(probe.memory) == 4 and all(s > 0 for s in sizes)  # references only, one entry each
    bound = sizes[2] + sizes[3] + min(sizes[:2]) // 2  # room for the last two references, not three
    svc = ServiceScorer(Scorer(naflex_bundle), cache_bytes=bound)
    for it in items:
        svc.score([svc.decode(it, it["prompt"], None, None)])
    assert len(svc.memory) == 2 and svc.memory.nbytes == sizes[2] + sizes[3] <= bound
    assert (svc.hits, svc.misses) == (0, 4)
    svc.score([svc.decode(items[3], items[3]["prompt"], None, None)])  # still cached
    svc.score([svc.decode(items[0], items[0]["prompt"], None, None)])  # evicted
    assert (svc.hits, svc.misses) == (1, 5)
