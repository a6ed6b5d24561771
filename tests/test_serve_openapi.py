"""masc-serve's OpenAPI contract works with a standard client generator.

A client generated from the served document by openapi-python-client (0.29.1 was the version
whose import failed when one operation declared two request content types) imports, scores a
pair through each scoring operation (JSON, multipart upload, batch) with every record field
typed, and parses the documented ``ErrorBody``. The records the service sends hold only fields
``ScoreResult`` declares, with a segmenter too, so nothing reaches a client untyped.
"""

from __future__ import annotations

import base64
import importlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
EX = Path(__file__).resolve().parents[1] / "examples" / "dreambooth"
FILES = {
    "ref_image": "images/cat/00.jpg",
    "ref_mask": "masks/cat/00.png",
    "out_image": "images/cat/01.jpg",
    "out_mask": "masks/cat/01.png",
}


def _ready_client(app):
    from fastapi.testclient import TestClient

    client = TestClient(app)
    client.__enter__()
    deadline = time.time() + 120
    while client.get("/readyz").status_code != 200 and time.time() < deadline:
        time.sleep(0.2)
    return client


def _item() -> dict:
    item = {k: base64.b64encode((EX / v).read_bytes()).decode() for k, v in FILES.items()}
    return {**item, "prompt": "a cat on the beach", "object_name": "cat"}


def _generator() -> str:
    exe = shutil.which("openapi-python-client") or str(Path(sys.executable).with_name("openapi-python-client"))
    if not Path(exe).exists():
        pytest.skip("openapi-python-client is not installed (the [test] extra brings it)")
    return exe


@pytest.fixture(scope="module")
def served(naflex_bundle):
    from masc_engine.serve.app import ServeConfig, create_app

    app = create_app(ServeConfig(bundle=str(naflex_bundle)))
    client = _ready_client(app)
    yield app, client
    client.__exit__(None, None, None)


@pytest.mark.slow
def test_a_generated_client_imports_and_scores(served, tmp_path, monkeypatch):
    app, http = served
    doc = tmp_path / "openapi.json"
    doc.write_text(json.dumps(http.get("/openapi.json").json()))
    r = subprocess.run(
        [
            _generator(),
            "generate",
            "--path",
            str(doc),
            "--output-path",
            str(tmp_path / "masc_client"),
            "--meta",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    monkeypatch.syspath_prepend(str(tmp_path))
    c = importlib.import_module("masc_client.client")
    api = {n: importlib.import_module(f"masc_client.api.default.{n}") for n in ("score", "score_upload", "score_batch")}
    models = importlib.import_module("masc_client.models")
    types = importlib.import_module("masc_client.types")
    client = c.Client(base_url="http://testserver")
    client.set_httpx_client(http)

    want = http.post("/v1/score", json=_item()).json()
    got = api["score"].sync(client=client, body=models.ScoreItem.from_dict(_item()))
    assert isinstance(got, models.ScoreResult) and got.additional_properties == {}
    assert got.to_dict() == want and isinstance(got.cp_n_ref_fg, int) and isinstance(got.prompt_text, str)

    files = {k: types.File(payload=(EX / v).open("rb"), file_name=Path(v).name) for k, v in FILES.items()}
    up = api["score_upload"].sync(
        client=client, body=models.ScoreUploadBody(**files, prompt="a cat on the beach", object_name="cat")
    )
    assert isinstance(up, models.ScoreResult) and up.to_dict() == want

    batch = api["score_batch"].sync(client=client, body=models.ScoreBatch.from_dict({"items": [_item(), _item()]}))
    assert [r.to_dict() for r in batch.results] == [want, want]

    bad = api["score"].sync(client=client, body=models.ScoreItem.from_dict({**_item(), "ref_mask": "bm90IGFuIGltYWdl"}))
    assert isinstance(bad, models.ErrorBody) and bad.error == "unreadable_mask" and bad.field == "ref_mask"


def test_one_content_type_per_operation(served):
    _, http = served
    paths = http.get("/openapi.json").json()["paths"]
    bodies = {p: list(op["post"]["requestBody"]["content"]) for p, op in paths.items() if "post" in op}
    assert bodies == {
        "/v1/score": ["application/json"],
        "/v1/score/upload": ["multipart/form-data"],
        "/v1/score_batch": ["application/json"],
    }
    r = http.post("/v1/score/upload", json=_item())
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"


def _declared() -> set[str]:
    from masc_engine.serve.schemas import ScoreResult

    return set(ScoreResult.model_fields)


def test_records_hold_only_declared_fields(served):
    _, http = served
    good, bad = _item(), {**_item(), "out_mask": "bm90IGFuIGltYWdl"}
    records = http.post("/v1/score_batch", json={"items": [good, bad]}).json()["results"]
    assert records[0]["status"] == "ok" and records[1]["status"] == "unreadable_mask"
    for rec in records:
        assert set(rec) <= _declared(), set(rec) - _declared()


@pytest.mark.slow
def test_records_with_a_segmenter_hold_only_declared_fields(naflex_bundle, seg_bundle):
    from masc_engine.serve.app import ServeConfig, create_app
    from masc_engine.runtime.segmenter import SegmenterConfig

    app = create_app(ServeConfig(bundle=str(naflex_bundle), segmenter=SegmenterConfig(bundle=str(seg_bundle))))
    http = _ready_client(app)
    try:
        item = {k: v for k, v in _item().items() if k != "out_mask"}
        rec = http.post("/v1/score", json=item).json()
        assert rec["status"] == "ok" and rec["out_mask_source"] == "segmenter", rec
        assert set(rec) <= _declared(), set(rec) - _declared()
    finally:
        http.__exit__(None, None, None)


def _document(bundle, seed: int) -> str:
    code = (
        "from masc_engine.serve.app import ServeConfig, create_app, dumps_openapi\n"
        f"print(dumps_openapi(create_app(ServeConfig(bundle={str(bundle)!r}))))"
    )
    env = {**__import__("os").environ, "PYTHONHASHSEED": str(seed)}
    r = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.slow
def test_the_document_is_the_same_in_every_process(naflex_bundle):
    """Every operation has its own id (a probe answering HEAD too is documented once, as GET), so
    the document does not depend on the process's hash seed, and FastAPI warns of no duplicate."""
    first = _document(naflex_bundle, 1)
    assert _document(naflex_bundle, 2) == first
    doc = json.loads(first)
    ids = [op["operationId"] for path in doc["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids)), ids
    assert set(doc["paths"]["/healthz"]) == {"get"}
