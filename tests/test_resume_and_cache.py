"""masc-run at scale: resume exactly once after kill -9, torn journal lines, changed rows and
settings, duplicate rows, output formats, and the persistent content-keyed cache."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import EXAMPLES
from masc_engine.jobs.pairs import RunOptions, RunSettings, run_pairs
from masc_engine.jobs.results import SettingsChangedError, journal_path, read_output
from masc_engine.runtime.scorer import Scorer
from masc_engine.tolerances import BATCH_INVARIANCE_ATOL


def _big_pairs(tmp_path: Path, copies: int = 5) -> Path:
    """The example pairs repeated ``copies`` times (distinct keys), absolute paths."""
    rows = list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))
    out = tmp_path / "big.csv"
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for c in range(copies):
            for r in rows:
                w.writerow(
                    {
                        **r,
                        "key": f"{r['key']}#{c}",
                        **{k: str(EXAMPLES / r[k]) for k in ("ref_image", "ref_mask", "out_image", "out_mask")},
                    }
                )
    return out


def _journaled(jp: Path) -> int:
    """Rows in a journal (not its header or run records)."""
    return jp.read_text(encoding="utf-8").count('"row_index"') if jp.is_file() else 0


def _scores(path) -> dict:
    return {int(r["row_index"]): (r["status"], float(r["cp"]), float(r["pf"])) for r in read_output(path)}


def _run(bundle, pairs, out, **kw):
    return run_pairs(pairs, Scorer(bundle), out, options=RunOptions(progress=False, **kw))


@pytest.mark.slow
def test_killed_run_resumes_exactly_once_with_equal_scores(naflex_bundle, tmp_path):
    pairs = _big_pairs(tmp_path, copies=5)
    clean = tmp_path / "clean.csv"
    _run(naflex_bundle, pairs, clean)
    out = tmp_path / "resumed.csv"
    cmd = [
        sys.executable,
        "-m",
        "masc_engine.cli.run_cmd",
        str(pairs),
        "--bundle",
        str(naflex_bundle),
        "--out",
        str(out),
        "--chunk-size",
        "2",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jp = journal_path(out)
    deadline = time.time() + 120
    while time.time() < deadline:
        if _journaled(jp) >= 4:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert jp.is_file() and not out.exists(), "the run must have been killed mid-way"
    done_before = _journaled(jp)
    with open(jp, "a") as f:
        f.write('{"row_index": 99, "cp": 0.1')  # a torn last line, as a kill during a write leaves
    summary = _run(naflex_bundle, pairs, out)
    assert summary.journal_repaired and summary.resumed == done_before
    rows = list(csv.DictReader(open(out)))
    assert [int(r["row_index"]) for r in rows] == list(range(1, 101))  # each row exactly once, in order
    a, b = _scores(clean), _scores(out)
    assert a.keys() == b.keys()
    for i in a:
        assert (
            a[i][0] == b[i][0]
            and abs(a[i][1] - b[i][1]) <= BATCH_INVARIANCE_ATOL
            and abs(a[i][2] - b[i][2]) <= BATCH_INVARIANCE_ATOL
        )
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
    before = out.read_bytes()
    with pytest.raises(SettingsChangedError, match="--stripper: regex -> none"):
        run_pairs(pairs, Scorer(naflex_bundle, stripper="none"), out, options=RunOptions(progress=False))
    assert out.read_bytes() == before  # refused: nothing re-scored or erased
    s = run_pairs(
        pairs, Scorer(naflex_bundle, stripper="none"), out, options=RunOptions(progress=False, overwrite=True)
    )
    assert s.resumed == 0  # another stripper, asked for: nothing reused
    s = run_pairs(
        pairs,
        Scorer(naflex_bundle),
        out,
        RunSettings(min_output_mask_frac=0.01),
        options=RunOptions(progress=False, overwrite=True),
    )
    assert s.resumed == 0


def test_duplicate_rows_reported_and_formats_agree(naflex_bundle, tmp_path):
    rows = list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))[:4]
    rows = [
        {**r, **{k: str(EXAMPLES / r[k]) for k in ("ref_image", "ref_mask", "out_image", "out_mask")}} for r in rows
    ]
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


def test_journal_of_other_settings_refuses_and_is_kept(naflex_bundle, tmp_path, caplog):
    """The journal of an interrupted run under other settings is neither reused nor deleted: the
    run stops naming the difference; --overwrite starts afresh."""
    from masc_engine.jobs.results import append_journal

    pairs = _big_pairs(tmp_path, copies=1)
    out = tmp_path / "o.csv"
    jp = journal_path(out)
    append_journal(
        jp,
        [
            {"type": "header", "fingerprint": "another-setting", "identity": {"--stripper": "none", "--exif": "apply"}},
            {"row_index": 1, "row_key": "x", "cp": 0.5, "pf": 0.1, "status": "ok"},
        ],
    )
    kept = jp.read_bytes()
    with pytest.raises(SettingsChangedError) as e:
        run_pairs(pairs, Scorer(naflex_bundle), out, options=RunOptions(progress=False))
    assert "1 rows of an interrupted run" in str(e.value) and "--stripper: none -> regex" in str(e.value)
    assert "--overwrite" in str(e.value) and "\n" not in str(e.value)
    assert jp.read_bytes() == kept and not out.exists()
    s = run_pairs(pairs, Scorer(naflex_bundle), out, options=RunOptions(progress=False, overwrite=True))
    assert s.resumed == 0 and s.rows == 20 and not jp.exists()
    assert any("--overwrite" in m for m in caplog.messages)


# ------------------------------------------------------------------ resume after an edit


def _interrupt_after(monkeypatch, n_chunks: int):
    """Make the next run stop (KeyboardInterrupt, as Ctrl-C) when chunk ``n_chunks + 1`` starts."""
    from masc_engine.jobs.pairs import PairsJob

    real, calls = PairsJob.score_chunk, []

    def score_chunk(self, chunk, loaded=None):
        calls.append(chunk.indices)
        if len(calls) > n_chunks:
            raise KeyboardInterrupt
        return real(self, chunk, loaded)

    monkeypatch.setattr(PairsJob, "score_chunk", score_chunk)
    return lambda: monkeypatch.setattr(PairsJob, "score_chunk", real)


def _poison_journal(jp: Path, rows: set[int]) -> None:
    """Give the journaled results of ``rows`` an impossible CP, so a reuse shows in the output."""
    lines = jp.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines:
        e = json.loads(line)
        if e.get("row_index") in rows:
            e["cp"] = 123.0
        out.append(json.dumps(e))
    jp.write_text("\n".join(out) + "\n", encoding="utf-8")


def _write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_rows_edited_between_interrupt_and_resume_are_rescored(naflex_bundle, tmp_path, monkeypatch):
    """The journal branch of resume: a row whose cells changed, or whose file changed (size or
    mtime), after an interrupted run is scored again; an unchanged row is reused (poisoned
    journal values show which). Fails if run_pairs stops checking row_key on the journal."""
    pairs = _big_pairs(tmp_path, copies=1)  # 20 rows
    rows = list(csv.DictReader(open(pairs, encoding="utf-8")))
    img = tmp_path / "copy.jpg"
    img.write_bytes(Path(rows[4]["out_image"]).read_bytes())
    rows[4]["out_image"] = str(img)
    _write_rows(pairs, rows)
    out = tmp_path / "o.csv"
    restore = _interrupt_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        run_pairs(pairs, Scorer(naflex_bundle), out, options=RunOptions(chunk_size=2, progress=False))
    restore()
    jp = journal_path(out)
    assert _journaled(jp) == 6 and not out.exists()  # rows 1-6 journaled, then Ctrl-C
    _poison_journal(jp, {1, 2, 5})
    rows[1]["prompt"] = "a backpack on the moon"  # row 2: a cell changed
    _write_rows(pairs, rows)
    st = img.stat()
    os.utime(img, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # row 5: its output image touched
    s = run_pairs(pairs, Scorer(naflex_bundle), out, options=RunOptions(chunk_size=2, progress=False))
    assert s.resumed == 4  # rows 1, 3, 4, 6
    got = {int(r["row_index"]): r for r in read_output(out)}
    assert float(got[1]["cp"]) == 123.0  # unchanged: taken from the journal
    assert float(got[2]["cp"]) != 123.0 and got[2]["prompt"] == "a backpack on the moon"
    assert float(got[5]["cp"]) != 123.0
    clean = tmp_path / "clean.csv"
    run_pairs(pairs, Scorer(naflex_bundle), clean, options=RunOptions(chunk_size=2, progress=False))
    ref = {int(r["row_index"]): r for r in read_output(clean)}
    for i in (2, 5):
        assert (got[i]["cp"], got[i]["pf"], got[i]["row_key"]) == (ref[i]["cp"], ref[i]["pf"], ref[i]["row_key"])


def test_csv_reordered_after_kill_resumes_each_row_once(naflex_bundle, tmp_path, monkeypatch):
    """After an interrupted run the pairs file is reordered: every row is matched to its own
    journaled result or scored again, never given another row's result."""
    pairs = _big_pairs(tmp_path, copies=1)
    rows = list(csv.DictReader(open(pairs, encoding="utf-8")))
    out = tmp_path / "o.jsonl"
    restore = _interrupt_after(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        run_pairs(pairs, Scorer(naflex_bundle), out, options=RunOptions(chunk_size=2, progress=False))
    restore()
    jp = journal_path(out)
    assert _journaled(jp) == 8
    _poison_journal(jp, {1, 2, 3})
    moved = list(rows)
    moved[1], moved[2] = rows[2], rows[1]  # journaled rows 2 and 3 trade places
    moved[14], moved[15] = rows[15], rows[14]  # and two rows not yet scored
    _write_rows(pairs, moved)
    s = run_pairs(pairs, Scorer(naflex_bundle), out, options=RunOptions(chunk_size=2, progress=False))
    assert s.resumed == 6  # rows 1, 4-8 kept their place and their cells
    got = read_output(out)
    assert [r["key"] for r in got] == [r["key"] for r in moved]  # input order, each row once
    assert got[0]["cp"] == 123.0 and all(r["cp"] != 123.0 for r in got[1:])
    clean = tmp_path / "clean.jsonl"
    run_pairs(pairs, Scorer(naflex_bundle), clean, options=RunOptions(chunk_size=2, progress=False))
    for a, b in zip(got[1:], read_output(clean)[1:]):
        assert (a["key"], a["row_key"], a["status"]) == (b["key"], b["row_key"], b["status"])
        assert a["cp"] == b["cp"] and a["pf"] == b["pf"]  # batch-independent to the bit


# ------------------------------------------------------------------ what the encoding cache is keyed by


def _exif_pairs(tmp_path: Path, n: int = 4) -> Path:
    """Example pairs whose images and masks are stored rotated with an EXIF orientation tag, so
    that ``--exif apply`` and ``--exif ignore`` encode different pixels from the same bytes."""
    from PIL import Image

    rows = list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))[:n]
    exif = Image.Exif()
    exif[0x0112] = 6  # display = stored rotated by 270 degrees
    out_rows = []
    for i, r in enumerate(rows):
        row = dict(r)
        for c in ("ref_image", "ref_mask", "out_image", "out_mask"):
            im = Image.open(EXAMPLES / r[c])
            im = (im.convert("RGB") if "image" in c else im.convert("L")).transpose(Image.Transpose.ROTATE_90)
            name = f"{i}_{c}.{'jpg' if 'image' in c else 'png'}"
            im.save(tmp_path / name, exif=exif.tobytes(), **({"quality": 95} if "image" in c else {}))
            row[c] = name
        out_rows.append(row)
    path = tmp_path / "exif_pairs.csv"
    _write_rows(path, out_rows)
    return path


def test_encoding_cache_never_serves_another_exif_policy_or_graph_variant(naflex_bundle, tmp_path):
    """One --cache-dir shared by runs that encode the same bytes differently: --exif apply then
    ignore, and the portable then the fused (ort-cpu) graphs. The second run of each finds no
    entry of the first (0 hits: a hit would be a stale encoding) and scores exactly as an
    uncached run with its own settings."""
    pairs = _exif_pairs(tmp_path)
    plans = [  # (first run, second run): (scorer options, run settings)
        (({}, RunSettings(exif="apply")), ({}, RunSettings(exif="ignore"))),
        (({"graph_variant": "portable"}, RunSettings()), ({"graph_variant": "ort-cpu"}, RunSettings())),
    ]
    for k, (first, second) in enumerate(plans):
        cache = tmp_path / f"cache{k}"
        f = run_pairs(
            pairs,
            Scorer(naflex_bundle, **first[0]),
            tmp_path / f"first{k}.csv",
            first[1],
            options=RunOptions(cache_dir=cache, progress=False),
        )
        s = run_pairs(
            pairs,
            Scorer(naflex_bundle, **second[0]),
            tmp_path / f"second{k}.csv",
            second[1],
            options=RunOptions(cache_dir=cache, progress=False),
        )
        assert f.images_encoded == 5 and s.cache_hits == 0 and s.images_encoded == 5, (k, s.cache_hits)
        run_pairs(
            pairs,
            Scorer(naflex_bundle, **second[0]),
            tmp_path / f"uncached{k}.csv",
            second[1],
            options=RunOptions(progress=False),
        )
        got, want = _scores(tmp_path / f"second{k}.csv"), _scores(tmp_path / f"uncached{k}.csv")
        assert got == want, k  # to the bit
        assert all(v[0] == "ok" for v in got.values())
    # the two EXIF policies really encode different pixels (else the first check proves nothing)
    assert _scores(tmp_path / "second0.csv") != _scores(tmp_path / "first0.csv")


def test_a_changed_metric_set_is_named_by_its_metrics_with_what_to_do():
    """Only the metric set differs: the refusal names the metrics (not the column list they imply),
    the ones the output holds and this run does not ask for, and the --cache-dir hint only where
    metrics were added; any other difference gets neither hint."""
    from masc_engine.jobs.results import _changed

    base = {"--stripper": "regex", "--bundle": "e067"}
    schema = {"result schema": "v1: cp, pf, cp_global, cp_mnn, pf_pooling, dino"}
    held = {**base, "--metrics": "dino", "--embedder dino": "86ae", **schema}
    dropped = str(_changed("o.csv holds results", held, base))
    assert "(--metrics: dino -> unset; --embedder dino: 86ae -> unset)" in dropped
    assert "they hold dino, which this run does not ask for" in dropped and "added metrics" not in dropped
    added = str(_changed("o.csv holds results", base, held))
    assert "runs only the added metrics' encoders" in added and "they hold" not in added
    both = str(_changed("o.csv holds results", held, {**base, "--stripper": "none"}))
    assert "they hold" not in both and "added metrics" not in both and "--stripper: regex -> none" in both
    plugin = str(_changed("o.csv holds results", {"result schema": "v1: cp"}, {"result schema": "v1: cp, x"}))
    assert "result schema: v1: cp -> v1: cp, x" in plugin  # a column change without --metrics is shown
    odd = str(_changed("o.csv holds results", {**base, "--metrics": ["dino"]}, base))  # an edited sidecar
    assert "--metrics: ['dino'] -> unset" in odd and "they hold" not in odd
