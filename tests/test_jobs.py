"""The job layer: the one table reader, and scoring one in-memory item exactly as masc-run
scores a row (the entry point the service reuses)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from PIL import Image

from support import EXAMPLES
from masc_engine.errors import InputError
from masc_engine.jobs.pairs import RunOptions, RESULT_COLUMNS, PairsJob, RunSettings, run_pairs
from masc_engine.jobs.results import read_output
from masc_engine.jobs.tables import TableError, parse_bool, parse_number, read_table
from masc_engine.runtime.scorer import Scorer


# ------------------------------------------------------------------ tables


def test_read_table_formats_agree(tmp_path):
    rows = [{"a": "1", "b": "x, y"}, {"a": "2", "b": "naïve\nline"}]
    (tmp_path / "t.csv").write_text('\ufeffa,b\n1,"x, y"\n2,"naïve\nline"\n', encoding="utf-8")
    (tmp_path / "t.tsv").write_text('a\tb\n1\tx, y\n2\t"naïve\nline"\n', encoding="utf-8")
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    (tmp_path / "t.json").write_text(json.dumps(rows), encoding="utf-8")
    for ext in ("csv", "tsv", "jsonl", "json"):
        t = read_table(tmp_path / f"t.{ext}", ("a", "b"))
        assert t.rows == rows and t.columns == ["a", "b"], ext
    assert read_table(tmp_path / "t.csv").lines == [2, 4]  # a quoted newline: row 2 ends on line 4
    assert read_table(tmp_path / "t.jsonl").lines == [1, 2]
    assert read_table(tmp_path / "t.json").lines is None


@pytest.mark.parametrize(
    "name, text, reason, message",
    [
        ("missing.csv", None, "missing_file", r"pairs file .*missing\.csv does not exist"),
        ("empty.csv", "", "bad_pairs_file", r"empty\.csv is empty \(no header row\)"),
        ("cols.csv", "a,b\n1,2\n", "bad_pairs_file", r"cols\.csv: missing column\(s\) c; required: a, c"),
        ("wide.csv", "a,c\n1,2\n3,4,5\n", "bad_pairs_file", r"wide\.csv, line 3: more fields than the header"),
        ("bad.jsonl", '{"a": 1, "c": 2}\n{"a": \n', "bad_pairs_file", r"bad\.jsonl, line 2: invalid JSON"),
        ("list.jsonl", '{"a": 1, "c": 2}\n[1]\n', "bad_pairs_file", r"list\.jsonl, line 2: expected a JSON object"),
        ("x.xlsx", "", "bad_pairs_file", r"x\.xlsx: unknown file type '\.xlsx'"),
        ("latin.csv", b"a,c\n\xe9,1\n", "bad_pairs_file", r"latin\.csv: not UTF-8"),
    ],
)
def test_read_table_errors_name_file_line_and_reason(tmp_path, name, text, reason, message):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    elif text is not None:
        p.write_text(text, encoding="utf-8")
    with pytest.raises(TableError, match=message) as e:
        read_table(p, ("a", "c"), "pairs")
    assert e.value.reason == reason and "\n" not in str(e.value)
    assert isinstance(e.value, InputError)


def test_extra_fields_can_be_ignored(tmp_path):
    p = tmp_path / "wide.csv"
    p.write_text("a,c\n1,2\n3,4,5\n6\n", encoding="utf-8")
    assert read_table(p, extra_fields="ignore").rows == [
        {"a": "1", "c": "2"},
        {"a": "3", "c": "4"},
        {"a": "6", "c": ""},
    ]


def test_cell_parsers():
    assert parse_number(" 0.5 ") == 0.5 and parse_number(np.float32(2)) == 2.0 and parse_number(np.int64(3)) == 3
    assert all(parse_number(v) is None for v in ("", "NA", "nan", None, float("nan"), "null"))
    for bad in ("x", True, "inf"):
        with pytest.raises(ValueError):
            parse_number(bad)
    assert [parse_bool(v) for v in ("Yes", "0", 1, np.bool_(True), "cross", np.int64(1))] == [
        True,
        False,
        True,
        True,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool("maybe")


# ------------------------------------------------------------------ one in-memory item


def test_score_item_is_the_row_masc_run_writes(naflex_bundle, tmp_path):
    """PairsJob.score_item on a row's file bytes gives masc-run's record for that row: every
    result column equal (scores bit-identical), bad input reported as a status naming the field."""
    scorer = Scorer(naflex_bundle)
    out = tmp_path / "scores.jsonl"
    run_pairs(EXAMPLES / "pairs.csv", scorer, out, RunSettings(), options=RunOptions(progress=False))
    written = read_output(out)[:6]
    job = PairsJob(scorer)
    for row in written:
        files = {c: (EXAMPLES / row[c]).read_bytes() for c in ("ref_image", "ref_mask", "out_image", "out_mask")}
        got = job.score_item(
            files["ref_image"],
            files["ref_mask"],
            files["out_image"],
            files["out_mask"],
            row["prompt"],
            row["object_name"],
            row_index=row["row_index"],
        )
        for k in RESULT_COLUMNS:
            if k == "row_key":
                continue
            a, b = got.get(k), row.get(k)
            if isinstance(b, float) and math.isnan(b):
                assert math.isnan(a), k
            else:
                assert a == b, (k, a, b)
        # arrays in, same record: a PIL image and a decoded uint8 mask
        ref_m = np.array(Image.open(EXAMPLES / row["ref_mask"]).convert("L"))
        again = job.score_item(
            Image.open(EXAMPLES / row["ref_image"]),
            ref_m,
            files["out_image"],
            files["out_mask"],
            row["prompt"],
            row["object_name"],
            row_index=row["row_index"],
        )
        assert again["cp"] == got["cp"] and again["pf"] == got["pf"]
    bad = job.score_item(b"not an image", files["ref_mask"], files["out_image"], files["out_mask"], "a dog", "dog")
    assert bad["status"] == "unreadable_image" and "ref_image" in bad["status_detail"] and math.isnan(bad["cp"])
    wrong = job.score_item(
        files["ref_image"], np.zeros((4, 4), np.float64), files["out_image"], files["out_mask"], "a dog", "dog"
    )
    assert wrong["status"] == "unreadable_mask" and "ref_mask" in wrong["status_detail"]


def test_numeric_and_null_cells_of_a_json_pairs_table_are_data(naflex_bundle, tmp_path):
    """A JSON Lines pairs table may hold numbers and nulls where a CSV holds text: a numeric
    object_name is its text, a null prompt an empty one; the run scores every row, none crashes it."""
    import csv as _csv

    rows = list(_csv.DictReader(open(EXAMPLES / "pairs.csv", encoding="utf-8")))[:3]
    for r in rows:
        for c in ("ref_image", "ref_mask", "out_image", "out_mask"):
            r[c] = str(EXAMPLES / r[c])
    rows[0]["object_name"] = 5
    rows[1]["prompt"] = None
    rows[2]["object_name"] = float("nan")  # what pandas writes for a missing cell
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows).replace("NaN", "null"), encoding="utf-8")
    out = tmp_path / "scores.jsonl"
    s = run_pairs(path, Scorer(naflex_bundle), out, options=RunOptions(progress=False))
    got = read_output(out)
    assert s.rows == 3 and [r["status"] for r in got] == ["ok", "ok", "ok"]
    assert got[0]["object_name"] == "5" and got[1]["prompt_empty"] is True
    assert all(math.isfinite(float(r["cp"])) and math.isfinite(float(r["pf"])) for r in got)


def test_variant_check_accepts_either_provider_spelling(naflex_bundle):
    from masc_engine.engine.bundle import Bundle

    b = Bundle(naflex_bundle)
    assert b.resolve_variant("auto", "onnxruntime", "CPUExecutionProvider") == b.resolve_variant(
        "auto", "onnxruntime", "cpu"
    )
