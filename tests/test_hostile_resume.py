"""What a rerun on an existing ``--out`` reuses (jobs/results.py ``resume``), against hostile
leftovers: results of another pairs file, a journal masc-run did not write, damaged outputs and
journals. Each is refused in one line naming the file and the way out (``--overwrite``), never
silently replaced, never a traceback."""

from __future__ import annotations

import json
import os

import pytest

from masc_engine.jobs.results import Journal, SettingsChangedError, resume

FP = "f00d"


def _finished(out, input_path, rows=(("1", "ka"), ("2", "kb"))):
    """A finished masc-run output at ``out`` (its rows and sidecar) made from ``input_path``."""
    out.write_text("row_index,row_key,status\n" + "".join(f"{i},{k},ok\n" for i, k in rows))
    meta = {"fingerprint": FP, "identity": {}, "input": str(input_path), "runs": []}
    (out.parent / (out.name + ".meta.json")).write_text(json.dumps(meta))


def _interrupted(out, input_path, rows=(("1", "ka"),)):
    header = {"type": "header", "fingerprint": FP, "identity": {}, "input": str(input_path), "earlier_runs": []}
    lines = [header] + [{"row_index": int(i), "row_key": k, "status": "ok", "_run": 1} for i, k in rows]
    (out.parent / (out.name + ".journal.jsonl")).write_text("".join(json.dumps(e) + "\n" for e in lines))


@pytest.fixture
def pairs(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "other.csv"
    a.write_text("x\n1\n2\n")
    b.write_text("x\n1\n2\n")
    return a, b


@pytest.mark.parametrize("leftover", [_finished, _interrupted])
def test_another_pairs_file_on_the_same_out_is_refused_naming_both(tmp_path, pairs, leftover):
    a, b = pairs
    out = tmp_path / "o.csv"
    leftover(out, a)
    with pytest.raises(SettingsChangedError) as e:
        resume(Journal(out), FP, {}, ["ka", "kb"], str(b))
    msg = str(e.value)
    assert f"(input: {a} -> {b})" in msg and "--overwrite" in msg and "\n" not in msg
    assert (out.parent / (out.name + ".meta.json")).exists() or (out.parent / (out.name + ".journal.jsonl")).exists()


@pytest.mark.parametrize("leftover", [_finished, _interrupted])
def test_the_same_file_by_another_path_or_a_link_resumes(tmp_path, pairs, leftover, monkeypatch):
    a, _ = pairs
    out = tmp_path / "o.csv"
    (tmp_path / "sub").mkdir()
    os.symlink(a, tmp_path / "sub" / "link.csv")
    monkeypatch.chdir(tmp_path / "sub")
    for spelling in ("../a.csv", "link.csv", str(a)):
        leftover(out, "../a.csv")  # an older record, relative to the folder it was run from
        prior = resume(Journal(out), FP, {}, ["ka", "kb"], spelling)
        assert sorted(prior.done) == ([1, 2] if leftover is _finished else [1])


def test_a_recorded_input_that_no_longer_exists_is_taken_as_moved(tmp_path, pairs):
    a, _ = pairs
    out = tmp_path / "o.csv"
    _finished(out, tmp_path / "old" / "a.csv")
    assert sorted(resume(Journal(out), FP, {}, ["ka", "kb"], str(a)).done) == [1, 2]


def test_overwrite_replaces_the_results_of_another_pairs_file(tmp_path, pairs):
    a, b = pairs
    out = tmp_path / "o.csv"
    _finished(out, a)
    assert resume(Journal(out), FP, {}, ["ka", "kb"], str(b), overwrite=True).done == {}
