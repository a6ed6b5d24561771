"""What a rerun on an existing ``--out`` reuses (jobs/results.py ``resume``), against hostile
leftovers: results of another pairs file, a journal masc-run did not write, damaged outputs and
journals. Each is refused in one line naming the file and the way out (``--overwrite``), never
silently replaced, never a traceback."""

from __future__ import annotations

import json
import os

import pytest

from masc_engine.jobs.results import DamagedResultsError, Journal, SettingsChangedError, SidecarError, resume

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


# ------------------------------------------------------------------ a journal masc-run did not write


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_journal_masc_run_did_not_write_is_refused_and_kept(tmp_path, pairs, overwrite):
    a, _ = pairs
    out = tmp_path / "o.csv"
    notes = b'{"my": "notes"}\n{"my": "more notes"}\n'
    (tmp_path / "o.csv.journal.jsonl").write_bytes(notes)
    with pytest.raises(SidecarError) as e:
        resume(Journal(out), FP, {}, ["ka", "kb"], str(a), overwrite=overwrite)
    assert "is not a masc-run journal" in str(e.value) and "\n" not in str(e.value)
    assert (tmp_path / "o.csv.journal.jsonl").read_bytes() == notes


def test_a_journal_torn_in_its_header_starts_afresh(tmp_path, pairs):
    a, _ = pairs
    out = tmp_path / "o.csv"
    (tmp_path / "o.csv.journal.jsonl").write_bytes(b'{"type": "header", "fingerpr')
    prior = resume(Journal(out), FP, {}, ["ka", "kb"], str(a))
    assert prior.done == {} and prior.repaired


# ------------------------------------------------------------------ damaged results on a rerun


def _drop_column(out, name):
    lines = [line.split(",") for line in out.read_text().splitlines()]
    j = lines[0].index(name)
    out.write_text("".join(",".join(c for k, c in enumerate(line) if k != j) + "\n" for line in lines))


@pytest.mark.parametrize(
    "damage, said",
    [
        (lambda out: _drop_column(out, "row_index"), "o.csv: it lacks the column(s) row_index masc-run writes"),
        (lambda out: _drop_column(out, "status"), "o.csv: it lacks the column(s) status masc-run writes"),
        (lambda out: out.write_bytes(out.read_bytes()[:-4]), "o.csv: it ends mid-row"),
        (
            lambda out: out.write_text(out.read_text().replace("2,kb", "two,kb")),
            "o.csv, line 3: the row has no row_index",
        ),
        (lambda out: out.write_text(out.read_text().replace("kb,ok", "kb,")), "o.csv, line 3: the row has no status"),
        (lambda out: out.write_bytes(b"\xff" + out.read_bytes()), "o.csv: not UTF-8 text"),
    ],
)
def test_a_damaged_output_is_refused_naming_it_and_overwrite(tmp_path, pairs, damage, said):
    a, _ = pairs
    out = tmp_path / "o.csv"
    _finished(out, a)
    damage(out)
    with pytest.raises(DamagedResultsError) as e:
        resume(Journal(out), FP, {}, ["ka", "kb"], str(a))
    msg = str(e.value)
    assert said in msg and "--overwrite scores every row afresh" in msg and "\n" not in msg
    assert resume(Journal(out), FP, {}, ["ka", "kb"], str(a), overwrite=True).done == {}


def _journal_lines(out):
    return (out.parent / (out.name + ".journal.jsonl")).read_bytes().split(b"\n")


@pytest.mark.parametrize(
    "damage, said",
    [
        (
            lambda d: json.dumps({k: v for k, v in json.loads(d).items() if k != "row_index"}).encode(),
            ", line 2: the row has no row_index",
        ),
        (lambda d: json.dumps({**json.loads(d), "row_key": None}).encode(), ", line 2: the row has no row_key"),
        (lambda d: d.replace(b'"ok"', b'"o\xff"'), ": line 2 is not UTF-8 text"),
        (lambda d: b"[1, 2]", ": line 2 is not a JSON object"),
    ],
)
def test_a_damaged_journal_line_is_refused_naming_its_line_and_overwrite(tmp_path, pairs, damage, said):
    a, _ = pairs
    out = tmp_path / "o.csv"
    _interrupted(out, a, rows=(("1", "ka"), ("2", "kb")))
    lines = _journal_lines(out)
    lines[1] = damage(lines[1])
    (out.parent / (out.name + ".journal.jsonl")).write_bytes(b"\n".join(lines))
    with pytest.raises(DamagedResultsError) as e:
        resume(Journal(out), FP, {}, ["ka", "kb"], str(a))
    msg = str(e.value)
    assert f"{out}.journal.jsonl{said}" in msg and "--overwrite scores every row afresh" in msg
    assert "\n" not in msg
    assert resume(Journal(out), FP, {}, ["ka", "kb"], str(a), overwrite=True).done == {}
    assert _journal_lines(out)[0].startswith(b'{"type": "header"') and len(_journal_lines(out)) == 2


def test_a_torn_last_journal_line_is_still_cut_off_and_the_rest_reused(tmp_path, pairs):
    a, _ = pairs
    out = tmp_path / "o.csv"
    _interrupted(out, a, rows=(("1", "ka"), ("2", "kb")))
    path = out.parent / (out.name + ".journal.jsonl")
    path.write_bytes(path.read_bytes()[:-5])
    prior = resume(Journal(out), FP, {}, ["ka", "kb"], str(a))
    assert sorted(prior.done) == [1] and prior.repaired


# ------------------------------------------------------------------ one output per --save-maps folder


def test_a_maps_folder_holding_another_outputs_maps_is_refused_before_anything_runs(tmp_path):
    from masc_engine.jobs.pairs.maps_owner import MARKER, claim_maps
    from masc_engine.jobs.pairs.run import run_pairs
    from masc_engine.jobs.pairs.settings import RunSettings

    maps = tmp_path / "maps"
    claim_maps(maps, tmp_path / "a.csv")
    assert json.loads((maps / MARKER).read_text()) == {"output": str(tmp_path / "a.csv")}
    p = tmp_path / "p.csv"
    p.write_text("ref_image,ref_mask,out_image,out_mask,prompt,object_name\na.jpg,a.png,b.jpg,b.png,a cat,cat\n")
    with pytest.raises(SettingsChangedError) as e:
        run_pairs(p, None, tmp_path / "b.csv", RunSettings(save_maps=str(maps)))  # before the scorer is used
    msg = str(e.value)
    assert f"--save-maps {maps} holds the maps of {tmp_path / 'a.csv'}" in msg and "--overwrite" in msg
    assert not (tmp_path / "b.csv.journal.jsonl").exists()


def test_the_same_output_or_overwrite_may_use_the_folder(tmp_path, monkeypatch):
    from masc_engine.jobs.pairs.maps_owner import MARKER, check_maps_owner, claim_maps

    maps = tmp_path / "maps"
    claim_maps(maps, tmp_path / "a.csv")
    monkeypatch.chdir(tmp_path)
    check_maps_owner(maps, tmp_path / "sub" / ".." / "a.csv", overwrite=False)  # one output, another spelling
    check_maps_owner(maps, tmp_path / "b.csv", overwrite=True)
    claim_maps(maps, tmp_path / "b.csv")
    assert json.loads((maps / MARKER).read_text()) == {"output": str(tmp_path / "b.csv")}
    with pytest.raises(SettingsChangedError, match="holds the maps of"):
        check_maps_owner(maps, tmp_path / "a.csv", overwrite=False)
    check_maps_owner(tmp_path / "fresh", tmp_path / "a.csv", overwrite=False)  # no marker: any output
