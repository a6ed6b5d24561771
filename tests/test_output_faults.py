"""masc-run against faults on the output side and against a second writer: one writer per
output, reruns with other settings refused (``--overwrite`` replaces), full disks, read-only
folders and refused permissions as one line, the sidecar's run records equal to the journal's
truth after a fault, and a bundle whose manifest disagrees with its graphs refused at load."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from support import EXAMPLES
from masc_engine.cli.run_cmd import main as run_main
from masc_engine.jobs.results import OutputLock, journal_path, lock_path, meta_path, read_output


def _one_line_error(res) -> str:
    """The run failed with click's ``Error: ...`` and nothing else (no traceback)."""
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    return errors[0]


def _pairs(tmp_path: Path, copies: int = 1) -> Path:
    """The example pairs (20 rows) with absolute paths, repeated ``copies`` times."""
    rows = list(csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))
    out = tmp_path / "pairs.csv"
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


def _run(bundle, pairs, out, *extra):
    return CliRunner().invoke(
        run_main, [str(pairs), "--bundle", str(bundle), "--out", str(out), "--no-progress", *extra]
    )


def _scores(path) -> list:
    return [(r["row_index"], r["status"], r["cp"], r["pf"], r["prompt_text"]) for r in read_output(path)]


# ------------------------------------------------------------------ one writer per output


def test_a_second_writer_stops_at_once_naming_the_holder(naflex_bundle, tmp_path):
    pairs, out = _pairs(tmp_path), tmp_path / "o.csv"
    with OutputLock(out):
        holder = json.loads(lock_path(out).read_text())
        t0 = time.time()
        line = _one_line_error(_run(naflex_bundle, pairs, out))
        assert time.time() - t0 < 30
    assert f"pid {os.getpid()}" in line and holder["host"] in line and "another --out" in line
    assert not out.exists() and not journal_path(out).exists()  # the loser wrote nothing
    assert not lock_path(out).exists()  # released and removed
    res = _run(naflex_bundle, pairs, out)
    assert res.exit_code == 0, res.output
    assert not lock_path(out).exists()


@pytest.mark.slow
def test_two_processes_on_one_output(naflex_bundle, tmp_path):
    """A running masc-run holds --out: a second one with another stripper exits 1 with one line
    and the first finishes with its own, complete output."""
    pairs, out = _pairs(tmp_path, copies=3), tmp_path / "o.csv"
    clean = tmp_path / "clean.csv"
    assert _run(naflex_bundle, pairs, clean, "--chunk-size", "2").exit_code == 0
    first = subprocess.Popen(
        [
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
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.time() + 120
        while not journal_path(out).is_file() and time.time() < deadline:
            assert first.poll() is None, first.stdout.read().decode()
            time.sleep(0.05)
        line = _one_line_error(_run(naflex_bundle, pairs, out, "--stripper", "none"))
        assert f"pid {first.pid}" in line
    finally:
        log = first.communicate(timeout=300)[0].decode()
    assert first.returncode == 0, log
    assert _scores(out) == _scores(clean)
    meta = json.loads(meta_path(out).read_text())
    assert meta["settings"]["stripper"] == "regex" and len(meta["runs"]) == 1


# ------------------------------------------------------------------ reruns with other settings


def test_rerun_with_other_options_refuses_and_overwrite_replaces(naflex_bundle, tmp_path):
    """The README's --save-maps command, then the same without --save-maps: refused with one
    line naming the difference, the output and its run records untouched; --overwrite replaces."""
    pairs, out = _pairs(tmp_path), tmp_path / "o.csv"
    assert _run(naflex_bundle, pairs, out, "--save-maps", str(tmp_path / "maps")).exit_code == 0
    before, meta_before = out.read_bytes(), meta_path(out).read_bytes()
    line = _one_line_error(_run(naflex_bundle, pairs, out))
    assert "--save-maps:" in line and "-> unset" in line and "--overwrite" in line
    assert out.read_bytes() == before and meta_path(out).read_bytes() == meta_before
    assert not journal_path(out).exists()
    line = _one_line_error(_run(naflex_bundle, pairs, out, "--stripper", "none", "--save-maps", str(tmp_path / "maps")))
    assert "--stripper: regex -> none" in line and "--save-maps" not in line
    res = _run(naflex_bundle, pairs, out, "--overwrite")
    assert res.exit_code == 0, res.output
    rows = read_output(out)
    assert len(rows) == 20 and "cp_map" not in rows[0]
    assert len(json.loads(meta_path(out).read_text())["runs"]) == 1
    again = _run(naflex_bundle, pairs, out)  # identical rerun: resumes, scores nothing
    assert again.exit_code == 0 and "resumed: 20" in again.output


def test_a_file_masc_run_did_not_write_is_not_replaced(naflex_bundle, tmp_path):
    pairs, out = _pairs(tmp_path), tmp_path / "notes.csv"
    out.write_text("my,own\nfile,here\n")
    line = _one_line_error(_run(naflex_bundle, pairs, out))
    assert "not a masc-run output" in line and out.read_text() == "my,own\nfile,here\n"


def test_resume_never_reuses_a_journal_of_another_stripper(naflex_bundle, tmp_path, monkeypatch):
    """An interrupted regex run, then --stripper none on the same output: refused (reusing the
    journal would keep the regex run's prompt_text); with --overwrite every row is scored with
    the new stripper, equal to a clean --stripper none run."""
    from masc_engine.jobs.pairs import PairsJob

    pairs, out = _pairs(tmp_path), tmp_path / "o.jsonl"
    real, calls = PairsJob.score_chunk, []

    def stop_after_two(self, chunk, loaded=None):
        calls.append(1)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return real(self, chunk, loaded)

    monkeypatch.setattr(PairsJob, "score_chunk", stop_after_two)
    assert _run(naflex_bundle, pairs, out, "--chunk-size", "4").exit_code == 130
    monkeypatch.setattr(PairsJob, "score_chunk", real)
    journaled = journal_path(out).read_text()
    assert journaled.count('"row_index"') == 8
    line = _one_line_error(_run(naflex_bundle, pairs, out, "--stripper", "none"))
    assert "8 rows of an interrupted run" in line and "--stripper: regex -> none" in line
    assert journal_path(out).read_text() == journaled  # kept as it was
    assert _run(naflex_bundle, pairs, out, "--stripper", "none", "--overwrite").exit_code == 0
    clean = tmp_path / "clean.jsonl"
    assert _run(naflex_bundle, pairs, clean, "--stripper", "none").exit_code == 0
    got = read_output(out)
    assert _scores(out) == _scores(clean)
    assert all(r["prompt_text"] == r["prompt"] for r in got)  # nothing stripped


# ------------------------------------------------------------------ full disk, read-only, permission


def _enospc_after(monkeypatch, calls_ok: int):
    """The journal's disk fills up during append ``calls_ok + 1``: half its lines are written,
    then ENOSPC (as a write cut by a full disk leaves a journal)."""
    import masc_engine.jobs.results as results_mod  # the journal's writer (jobs/results.py Journal)

    real, n = results_mod.append_journal, []

    def append(path, entries):
        n.append(1)
        if len(n) > calls_ok:
            real(path, entries[: len(entries) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, entries)

    monkeypatch.setattr(results_mod, "append_journal", append)
    return lambda: monkeypatch.setattr(results_mod, "append_journal", real)


def test_full_disk_is_one_line_and_the_resumed_run_is_exact(naflex_bundle, tmp_path, monkeypatch):
    pairs, out = _pairs(tmp_path), tmp_path / "o.csv"
    restore = _enospc_after(monkeypatch, calls_ok=4)  # header, reused rows, two chunks; the third is cut
    line = _one_line_error(_run(naflex_bundle, pairs, out, "--chunk-size", "4"))
    restore()
    assert "No space left on device" in line and "ENOSPC" in line and str(journal_path(out)) in line
    assert not out.exists()
    journaled = journal_path(out).read_text().count('"row_index"')
    assert journaled == 10  # 4 + 4 + half of the third chunk's 4 rows and its run record
    res = _run(naflex_bundle, pairs, out, "--chunk-size", "4")
    assert res.exit_code == 0 and "resumed: 10" in res.output, res.output
    clean = tmp_path / "clean.csv"
    assert _run(naflex_bundle, pairs, clean, "--chunk-size", "4").exit_code == 0
    assert _scores(out) == _scores(clean)
    runs = json.loads(meta_path(out).read_text())["runs"]
    # The runs' records equal the journal's truth: 10 rows by the first run, 10 by the second.
    assert [r["rows_scored"] for r in runs] == [10, 10] and [r["run"] for r in runs] == [1, 2]
    assert json.loads(meta_path(out).read_text())["counts"]["rows"] == 20


@pytest.mark.parametrize(
    "where, err", [("write_output", errno.EROFS), ("write_meta", errno.EACCES), ("write_meta", errno.ENOSPC)]
)
def test_output_and_sidecar_faults_are_one_line(naflex_bundle, tmp_path, monkeypatch, where, err):
    import masc_engine.jobs.pairs.run as run_mod
    import masc_engine.jobs.pairs.metadata as sidecar_mod

    pairs_mod = run_mod if where == "write_output" else sidecar_mod
    pairs, out = _pairs(tmp_path), tmp_path / "o.jsonl"
    real = getattr(pairs_mod, where)

    def fail(path, *a, **kw):
        raise OSError(err, os.strerror(err), str(path))

    monkeypatch.setattr(pairs_mod, where, fail)
    line = _one_line_error(_run(naflex_bundle, pairs, out))
    assert os.strerror(err) in line and errno.errorcode[err] in line
    assert ("output" if where == "write_output" else "sidecar") in line
    assert journal_path(out).read_text().count('"row_index"') == 20  # every finished row kept
    monkeypatch.setattr(pairs_mod, where, real)
    res = _run(naflex_bundle, pairs, out)
    assert res.exit_code == 0 and "resumed: 20" in res.output, res.output


def test_a_lock_that_cannot_be_created_is_one_line(naflex_bundle, tmp_path, monkeypatch):
    import filelock

    class ReadOnlyFolder:
        def __init__(self, path, **kw):
            self.path = path

        def acquire(self):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), self.path)

    monkeypatch.setattr(filelock, "FileLock", ReadOnlyFolder)
    out = tmp_path / "o.csv"
    line = _one_line_error(_run(naflex_bundle, _pairs(tmp_path), out))
    assert "Read-only file system" in line and "lock" in line and not out.exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores folder permissions")
def test_a_read_only_output_folder_is_one_line(naflex_bundle, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        line = _one_line_error(_run(naflex_bundle, _pairs(tmp_path), folder / "o.csv"))
    finally:
        folder.chmod(0o755)
    assert "Permission denied" in line


# ------------------------------------------------------------------ a manifest that lies


def test_manifest_disagreeing_with_its_graphs_is_one_line_at_load(naflex_bundle, tmp_path):
    bad = tmp_path / "bundle"
    shutil.copytree(naflex_bundle, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["image"]["patch_size"] = 14
    (bad / "manifest.json").write_text(json.dumps(m))
    out = tmp_path / "o.csv"
    line = _one_line_error(_run(bad, _pairs(tmp_path), out))
    assert "image.patch_size is 14" in line and "768" in line and "re-export" in line
    assert not out.exists() and not journal_path(out).exists()
    # The declared shapes edited to match the lie: the graph itself disagrees, still before any batch.
    m["graphs"]["vision"]["inputs"][0]["shape"][-1] = 3 * 14 * 14
    (bad / "manifest.json").write_text(json.dumps(m))
    line = _one_line_error(_run(bad, _pairs(tmp_path), out))
    assert "vision graph's pixel_values" in line and "588" in line
