"""masc-run at scale: resume exactly once after kill -9, torn journal lines, changed rows and
settings, duplicate rows, output formats, and the persistent content-keyed cache."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES
from masc_engine.jobs.pairs import RunSettings, run_pairs
from masc_engine.jobs.results import journal_path, read_output
from masc_engine.runtime.scorer import Scorer


def _big_pairs(tmp_path: Path, copies: int = 5) -> Path:
    """The example pairs repeated ``copies`` times (distinct keys), absolute paths."""
    rows = list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))
    out = tmp_path / "big.csv"
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for c in range(copies):
            for r in rows:
                w.writerow({**r, "key": f"{r['key']}#{c}",
                            **{k: str(EXAMPLES / r[k]) for k in ("ref_image", "ref_mask", "out_image", "out_mask")}})
    return out


def _scores(path) -> dict:
    return {int(r["row_index"]): (r["status"], float(r["cp"]), float(r["pf"])) for r in read_output(path)}


def _run(bundle, pairs, out, **kw):
    return run_pairs(pairs, Scorer(bundle), out, progress=False, **kw)


def test_killed_run_resumes_exactly_once_with_equal_scores(naflex_bundle, tmp_path):
    pairs = _big_pairs(tmp_path, copies=5)
    clean = tmp_path / "clean.csv"
    _run(naflex_bundle, pairs, clean)
    out = tmp_path / "resumed.csv"
    cmd = [sys.executable, "-m", "masc_engine.cli.run_cmd", str(pairs), "--bundle", str(naflex_bundle),
           "--out", str(out), "--chunk-size", "2", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jp = journal_path(out)
    deadline = time.time() + 120
    while time.time() < deadline:
        if jp.is_file() and jp.read_text().count("\n") >= 5:  # header + >= 4 rows journaled
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert jp.is_file() and not out.exists(), "the run must have been killed mid-way"
    done_before = jp.read_text().count("\n") - 1
    with open(jp, "a") as f:
        f.write('{"row_index": 99, "cp": 0.1')  # a torn last line, as a kill during a write leaves
    summary = _run(naflex_bundle, pairs, out)
    assert summary.journal_repaired and summary.resumed == done_before
    rows = list(csv.DictReader(open(out)))
    assert [int(r["row_index"]) for r in rows] == list(range(1, 101))  # each row exactly once, in order
    a, b = _scores(clean), _scores(out)
    assert a.keys() == b.keys()
    for i in a:
        assert a[i][0] == b[i][0] and abs(a[i][1] - b[i][1]) <= 1e-6 and abs(a[i][2] - b[i][2]) <= 1e-6
    assert not jp.exists()
    again = _run(naflex_bundle, pairs, out)  # nothing left to do
    assert again.resumed == 100 and again.images_encoded == 0


def test_changed_row_and_changed_setting_are_rescored(naflex_bundle, tmp_path):
    pairs = _big_pairs(tmp_path, copies=1)
    out = tmp_path / "o.jsonl"
    _run(naflex_bundle, pairs, out)
    rows = list(csv.DictReader(open(pairs, encoding="utf-8")))
    rows[3]["prompt"] = "a dog in the snow"
    with open(pairs, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    s = _run(naflex_bundle, pairs, out)
    assert s.resumed == 19
    assert [r for r in read_output(out) if r["row_index"] == 4][0]["prompt"] == "a dog in the snow"
    s = run_pairs(pairs, Scorer(naflex_bundle, stripper="none"), out, progress=False)
    assert s.resumed == 0  # another stripper: nothing reused
    s = run_pairs(pairs, Scorer(naflex_bundle), out, RunSettings(min_output_mask_frac=0.01), progress=False)
    assert s.resumed == 0


def test_duplicate_rows_reported_and_formats_agree(naflex_bundle, tmp_path):
    rows = list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))[:4]
    rows = [{**r, **{k: str(EXAMPLES / r[k]) for k in ("ref_image", "ref_mask", "out_image", "out_mask")}}
            for r in rows]
    pairs = tmp_path / "dup.csv"
    with open(pairs, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows + [rows[1]])
    results = {}
    for ext in ("csv", "parquet", "jsonl"):
        s = _run(naflex_bundle, pairs, tmp_path / f"o.{ext}")
        assert s.duplicates == [(5, 2)]
        results[ext] = _scores(tmp_path / f"o.{ext}")
        meta = json.loads((tmp_path / f"o.{ext}.meta.json").read_text())
        assert meta["counts"]["rows"] == 5 and meta["counts"]["duplicate_rows"] == 1
        assert meta["bundle_fingerprint"] and meta["runtime_versions"]["onnxruntime"]
    assert results["csv"] == results["parquet"] == results["jsonl"]
    assert results["csv"][5] == results["csv"][2]


def test_cache_hit_gives_identical_scores_and_encodes_each_image_once(naflex_bundle, tmp_path):
    pairs = _big_pairs(tmp_path, copies=2)  # 40 rows over 22 distinct images (refs reused)
    cache = tmp_path / "cache"
    cold = _run(naflex_bundle, pairs, tmp_path / "cold.csv", cache_dir=cache)
    assert cold.images_encoded == 22 and cold.cache_hits == 0
    warm = _run(naflex_bundle, pairs, tmp_path / "warm.csv", cache_dir=cache)
    assert warm.images_encoded == 0 and warm.cache_hits == 22
    assert _scores(tmp_path / "cold.csv") == _scores(tmp_path / "warm.csv")  # bit-identical


def test_cache_size_is_bounded(naflex_bundle, tmp_path):
    import diskcache

    pairs = _big_pairs(tmp_path, copies=1)
    cache = tmp_path / "small-cache"
    limit = 600_000  # a few tiny-model encodings (1024 x 64 float32 = 256 KiB each)
    _run(naflex_bundle, pairs, tmp_path / "o.csv", cache_dir=cache, cache_size_limit=limit)
    with diskcache.Cache(str(cache)) as c:
        assert c.volume() <= limit + 2 * 300_000  # diskcache culls lazily, by at most a few entries
        assert 0 < len(c) < 22


def test_journal_of_other_settings_is_kept_not_deleted(naflex_bundle, tmp_path):
    from masc_engine.jobs.results import append_journal

    pairs = _big_pairs(tmp_path, copies=1)
    out = tmp_path / "o.csv"
    jp = journal_path(out)
    append_journal(jp, [{"type": "header", "fingerprint": "another-setting"},
                        {"row_index": 1, "row_key": "x", "cp": 0.5, "pf": 0.1, "status": "ok"}])
    said: list[str] = []
    s = run_pairs(pairs, Scorer(naflex_bundle), out, progress=False, log=said.append)
    assert s.resumed == 0 and s.rows == 20
    stale = jp.with_name(jp.name + ".another-setting.stale")
    assert stale.is_file() and "row_key" in stale.read_text()
    assert any(str(stale) in m for m in said)
