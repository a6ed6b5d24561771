"""Hostile edges: clients that leave mid-body, special files where a regular file is expected,
paths and JSON built to break the readers, and sizes far over what is read."""

from __future__ import annotations

import logging
import time

import pytest


def _ready_client(naflex_bundle):
    from fastapi.testclient import TestClient

    from masc_engine.serve.app import ServeConfig, create_app

    app = create_app(ServeConfig(bundle=str(naflex_bundle)))
    client = TestClient(app)
    client.__enter__()
    deadline = time.time() + 120
    while client.get("/readyz").status_code != 200 and time.time() < deadline:
        time.sleep(0.2)
    return app, client


def test_a_client_leaving_mid_body_is_not_a_server_fault(naflex_bundle, caplog):
    """Content-Length 1000, 10 bytes, then the socket closes: no traceback, no 5xx counted, the
    disconnect counted under its own reason."""
    app, client = _ready_client(naflex_bundle)
    sent = []
    msgs = [{"type": "http.request", "body": b'{"prompt":', "more_body": True}, {"type": "http.disconnect"}]

    async def receive():
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(msg):
        sent.append(msg)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/score",
        "raw_path": b"/v1/score",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
    }
    try:
        with caplog.at_level(logging.ERROR, logger="masc_engine.serve"):
            client.portal.call(app, scope, receive, send)
        assert not [r for r in caplog.records if r.exc_info], caplog.text
        text = client.get("/metrics").text
    finally:
        client.__exit__(None, None, None)
    assert 'masc_errors_total{reason="client_disconnected"} 1.0' in text
    assert 'masc_requests_total{code="499",path="/v1/score"} 1.0' in text
    assert 'reason="internal_error"' not in text and 'code="500"' not in text


def test_an_api_key_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    """A FIFO nobody writes to: one line refusing it, at once (the start used to hang in open)."""
    import os
    import threading

    import click

    from masc_engine.cli.serve_cmd import _read_api_key

    fifo = tmp_path / "key.fifo"
    os.mkfifo(fifo)
    got = []

    def read():
        try:
            got.append(_read_api_key(str(fifo)))
        except click.ClickException as e:
            got.append(e.format_message())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # release the blocked reader before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        t.join(10)
        pytest.fail("reading a FIFO as --api-key-file blocked")
    assert got == [f"--api-key-file {fifo}: not a regular file (a FIFO, device or directory is never read)"]
    (tmp_path / "keydir").mkdir()
    with pytest.raises(click.ClickException, match="not a regular file"):
        _read_api_key(str(tmp_path / "keydir"))
    (tmp_path / "key").write_text("s3cret-key\n")
    assert _read_api_key(str(tmp_path / "key")) == b"s3cret-key"


def test_report_cells_no_file_can_have_are_placeholders(tmp_path):
    """An image cell with a NUL byte, another of 5,000 characters, a mask cell with a NUL byte: the
    report is written, each a placeholder (the command used to fail with 'embedded null byte' or
    'File name too long')."""
    import json

    from click.testing import CliRunner
    from PIL import Image

    from masc_engine.cli.report_cmd import main as report_main

    Image.new("RGB", (16, 12), (10, 200, 10)).save(tmp_path / "ok.png")
    base = {"method": "m", "ref_mask": "", "out_mask": "", "prompt": "p", "status": "ok"}
    rows = [
        {**base, "key": "k1", "ref_image": "a\0b.png", "out_image": "ok.png", "row_index": 1, "cp": 0.9, "pf": 0.1},
        {**base, "key": "k2", "ref_image": "x" * 5000, "out_image": "ok.png", "row_index": 2, "cp": 0.8, "pf": 0.2},
        {
            **base,
            "key": "k3",
            "ref_image": "ok.png",
            "out_image": "ok.png",
            "row_index": 3,
            "cp": 0.7,
            "pf": 0.3,
            "ref_mask": "m\0.png",
        },
    ]
    scores = tmp_path / "scores.jsonl"
    scores.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    page = tmp_path / "r.html"
    res = CliRunner().invoke(report_main, [str(scores), "--out", str(page), "--n-resamples", "20"])
    assert res.exit_code == 0, res.output
    text = page.read_text(encoding="utf-8")
    assert text.count('data-reason="not shown: unreadable path"') >= 2 * 2  # rows 1 and 2, in two tables at least
    assert "mask: not shown: unreadable path" in text


def test_a_sidecar_nested_too_deep_is_no_sidecar(tmp_path):
    """A ``<scores>.meta.json`` nested 100,000 deep is ignored as a corrupt one is (the report
    used to end in RecursionError)."""
    from masc_engine.report.page import load_scores

    scores = tmp_path / "scores.jsonl"
    scores.write_text('{"cp": 0.5, "pf": 0.5, "status": "ok"}\n', encoding="utf-8")
    (tmp_path / "scores.jsonl.meta.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    rows, meta = load_scores(scores)
    assert meta is None and rows[0]["cp"] in (0.5, "0.5")


def test_a_huge_manifest_is_refused_from_its_size(tmp_path):
    """A sparse 100 MB manifest.json: one-line BundleError naming the size, and not read into
    memory (it used to be read whole, then refused as invalid JSON)."""
    import tracemalloc

    from masc_engine.engine.manifest import read_manifest
    from masc_engine.errors import BundleError

    with open(tmp_path / "manifest.json", "wb") as f:
        f.truncate(100 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(BundleError) as e:
            read_manifest(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == (
        f"{tmp_path / 'manifest.json'}: 104,857,600 bytes, over 16 MiB: not a masc-bundle "
        "manifest (masc-export writes a few KiB)"
    )
    assert peak < 2**20, peak


def test_a_score_file_over_its_budget_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """masc-report checks the score file's size first (masc-run's pairs-file rule): a sparse
    64 MiB file with --max-scores-mb 16 is one Error: line and is never parsed; the default budget
    is masc-run's --max-pairs-mb default."""
    from click.testing import CliRunner

    from masc_engine.cli.report_cmd import main as report_main
    from masc_engine.jobs import results
    from masc_engine.jobs.tables import DEFAULT_MAX_PAIRS_BYTES
    from masc_engine.report.page import ReportOptions

    scores = tmp_path / "scores.jsonl"
    with open(scores, "wb") as f:
        f.truncate(64 * 2**20)
    monkeypatch.setattr(results, "read_table", lambda *a, **k: pytest.fail("the score file was read"))
    res = CliRunner().invoke(report_main, [str(scores), "--out", str(tmp_path / "r.html"), "--max-scores-mb", "16"])
    assert res.exit_code == 1, res.output
    assert (
        res.output.strip()
        == f"Error: bad_scores_file: {scores}: {64 * 2**20} bytes, over the budget of {16 * 2**20} bytes (--max-scores-mb)"
    )
    assert ReportOptions().max_scores_bytes == DEFAULT_MAX_PAIRS_BYTES == 2**30


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_5000_digit_integer_is_a_bad_pairs_file_naming_file_and_line(tmp_path, suffix):
    """Python refuses to parse an int of more than 4300 digits (ValueError, shown without file or
    line): the reader's documented one-line error instead."""
    from masc_engine.jobs.tables import TableError, read_table

    good = '{"ref_image": "a.png", "out_image": "b.png", "prompt": "p"}'
    bad = '{"ref_image": "a.png", "out_image": "b.png", "prompt": "p", "seed": ' + "7" * 5000 + "}"
    p = tmp_path / f"pairs{suffix}"
    p.write_text(f"{good}\n{bad}\n" if suffix == ".jsonl" else f"[\n{good},\n{bad}\n]\n", encoding="utf-8")
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    line = 2 if suffix == ".jsonl" else 3
    assert e.value.reason == "bad_pairs_file"
    assert str(e.value) == f"bad_pairs_file: {p}, line {line}: a number of more than 4300 digits"
