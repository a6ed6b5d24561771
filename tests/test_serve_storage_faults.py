"""A storage fault under the persistent cache (``--cache-dir``) degrades, never kills: SQLite
runs without WAL and without a memory map (a fault on a mapped page is SIGBUS, not an error), a
store that fails is logged once and bypassed while scores are still served (masc-serve's
``/readyz`` says ``"cache": "degraded"``, ``masc_cache_faults_total`` counts), and a folder that
cannot be used at start is one ``Error:`` line from masc-run and masc-serve.

Faults are injected as root can feel them: a database file overwritten with garbage, a
``cache.db`` that is a folder, a write failing with ENOSPC.
"""

from __future__ import annotations

import base64
import errno
import logging
import re
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from support import EXAMPLES
from masc_engine.runtime import cache as cache_module
from masc_engine.runtime.cache import EncodingStore
from masc_engine.runtime.scorer import ImageEncoding

RUN = [sys.executable, "-m", "masc_engine.cli.run_cmd"]
SERVE = [sys.executable, "-m", "masc_engine.cli.serve_cmd"]


def _corrupt(db) -> None:
    with open(db, "r+b") as f:
        f.write(b"not a database " * 8)


def test_store_keeps_no_memory_mapped_state(tmp_path):
    """No WAL (its -shm index is memory-mapped) and mmap_size 0, also for a cache made in WAL mode."""
    import diskcache

    diskcache.Cache(str(tmp_path / "old"), sqlite_journal_mode="wal").close()  # a cache from before
    for d in (tmp_path / "new", tmp_path / "old"):
        store = EncodingStore(d, {"bundle": "x"})
        store.put_text("a cat", np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(store.get_text("a cat"), np.arange(4, dtype=np.float32))
        con = sqlite3.connect(d / "cache.db")
        assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert (store.cache.sqlite_journal_mode, store.cache.sqlite_mmap_size) == ("delete", 0)
        assert sorted(p.name for p in d.iterdir() if p.name.startswith("cache.db")) == ["cache.db"]
        con.close()
        store.close()


def test_failing_store_is_logged_once_and_bypassed(tmp_path, caplog):
    store = EncodingStore(tmp_path, {"bundle": "x"})
    enc = ImageEncoding(np.ones((4, 8), np.float32), (2, 2))
    store.put_image("d1", enc)
    _corrupt(tmp_path / "cache.db")
    with caplog.at_level(logging.ERROR, logger="masc_engine.cache"):
        assert store.get_image("d1") is None  # a miss, not an exception
        store.put_image("d2", enc)
        assert store.get_text("a cat") is None and store.get_mask("k") is None
        store.put_mask("k", np.zeros((2, 2), np.uint8))
    assert store.fault.startswith("DatabaseError: ") and store.faults == 5
    lines = [r.getMessage() for r in caplog.records if r.name == "masc_engine.cache"]
    assert len(lines) == 1 and "scoring goes on without it" in lines[0], lines


def test_disk_full_write_is_dropped(tmp_path):
    store = EncodingStore(tmp_path, {"bundle": "x"})

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    store.cache.set = full
    store.put_text("a cat", np.ones(3, np.float32))
    assert store.fault == "OSError: [Errno 28] No space left on device" and store.faults == 1


def test_unusable_folder_is_a_typed_error(tmp_path):
    (tmp_path / "cache.db").mkdir()
    with pytest.raises(
        getattr(cache_module, "CacheError", ()), match=r"^the cache folder .* cannot be used \(OperationalError: "
    ):
        EncodingStore(tmp_path, {"bundle": "x"})


def _one_error_line(proc: subprocess.CompletedProcess, folder) -> str:
    err = [ln for ln in proc.stderr.strip().splitlines() if "exported from random weights" not in ln]
    assert proc.returncode == 1 and len(err) == 1, proc.stderr[-3000:]
    assert err[0].startswith(f"Error: the cache folder {folder} cannot be used (OperationalError: "), err
    return err[0]


@pytest.mark.slow
def test_unusable_cache_dir_is_one_line(naflex_bundle, tmp_path):
    """masc-run and masc-serve on a --cache-dir SQLite cannot open: exit 1, one Error: line."""
    bad = tmp_path / "cache"
    (bad / "cache.db").mkdir(parents=True)
    run = subprocess.run(
        [
            *RUN,
            str(EXAMPLES / "pairs.csv"),
            "--bundle",
            str(naflex_bundle),
            "--cache-dir",
            str(bad),
            "--out",
            str(tmp_path / "out.csv"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    _one_error_line(run, bad)
    serve = subprocess.run(
        [*SERVE, "--bundle", str(naflex_bundle), "--cache-dir", str(bad), "--port", "9"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    _one_error_line(serve, bad)


@pytest.mark.slow
def test_service_scores_through_a_failed_cache(naflex_bundle, tmp_path):
    """The cache's database turns to garbage under a running service: the next requests are
    still scored (200), /readyz stays 200 and says the cache is degraded, the metric counts the
    bypassed lookups, and the log has one line about it."""
    httpx = pytest.importorskip("httpx", reason="the serve tests need httpx (test extra)")
    pytest.importorskip("fastapi", reason="masc-serve needs the serve extra")
    from test_serve import Server

    cache = tmp_path / "cache"
    srv = Server(naflex_bundle, "--cache-dir", str(cache), log=tmp_path / "server.log")
    files = {
        "ref_image": "images/cat/00.jpg",
        "ref_mask": "masks/cat/00.png",
        "out_image": "images/cat/01.jpg",
        "out_mask": "masks/cat/01.png",
    }
    item = {k: base64.b64encode((EXAMPLES / v).read_bytes()).decode() for k, v in files.items()}
    try:
        first = httpx.post(srv.url + "/v1/score", json={**item, "prompt": "a cat", "object_name": "cat"}, timeout=120)
        assert first.status_code == 200 and httpx.get(srv.url + "/readyz", timeout=30).json()["cache"] == "ok"
        _corrupt(cache / "cache.db")
        for prompt in ("a cat on the beach", "a cat in the snow"):
            r = httpx.post(srv.url + "/v1/score", json={**item, "prompt": prompt, "object_name": "cat"}, timeout=120)
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        ready = httpx.get(srv.url + "/readyz", timeout=30)
        assert ready.status_code == 200 and ready.json()["cache"] == "degraded"
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        assert float(re.search(r"^masc_cache_faults_total (\S+)$", metrics, re.M).group(1)) >= 2
    finally:
        assert srv.stop() == 0
    log = (tmp_path / "server.log").read_text()
    assert log.count("persistent cache") == 1 and "DatabaseError" in log, log[-3000:]
