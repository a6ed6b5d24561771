"""Hostile pairs files read by the job layer's one table reader (jobs/tables.py): a stray quote,
cells the csv module misplaces, Parquet types JSON cannot hold. Each is read right or refused in
one line naming the file, the line (or column) and the way out."""

from __future__ import annotations

import pytest

from masc_engine.jobs.tables import TableError, read_table

HEADER = "key,prompt,object_name\n"


def _rows(n: int) -> str:
    return "".join(f"k{i},a backpack in the jungle,backpack\n" for i in range(1, n + 1))


def test_a_stray_opening_quote_refuses_the_file_naming_its_line_and_column(tmp_path):
    p = tmp_path / "p.csv"
    body = _rows(6).replace("k2,a backpack", 'k2,"12 inch backpack', 1)
    p.write_text(HEADER + body)
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    msg = str(e.value)
    assert e.value.reason == "bad_pairs_file" and "\n" not in msg
    assert f"{p}, line 3: a quote opening a cell (column 'prompt') is never closed" in msg


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_the_unclosed_quote_line_is_right_whatever_the_last_line_ending(tmp_path, ending):
    p = tmp_path / "p.csv"
    lines = [HEADER.strip(), "k1,ok,x", 'k2,"open,x', "k3,b,c", "k4,b,c"]
    p.write_bytes((ending or "\n").join(lines).encode() + ending.encode())
    with pytest.raises(TableError, match=r"line 3: a quote opening a cell \(column 'prompt'\)"):
        read_table(p)


def test_an_unclosed_quote_in_the_header_names_line_1(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text('key,"prompt\nk1,a,b\n')
    with pytest.raises(TableError, match=r"line 1: a quote opening a cell is never closed"):
        read_table(p)


def test_quotes_that_close_or_sit_mid_cell_are_read_as_before(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(HEADER + 'k1,a 12" backpack,bag\nk2,"two\nlines, quoted ""x""",bag\nk3,last,bag')
    t = read_table(p)
    assert [r["prompt"] for r in t.rows] == ['a 12" backpack', 'two\nlines, quoted "x"', "last"]
    assert t.lines == [2, 4, 5] and t.columns == ["key", "prompt", "object_name"]


def test_header_only_and_empty_files_read_as_before(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text(HEADER)
    assert read_table(p).rows == []
    p.write_text("")
    with pytest.raises(TableError, match="is empty"):
        read_table(p)


def test_a_cell_past_the_field_limit_is_named_on_its_own_line(tmp_path):
    from masc_engine.jobs.tables import MAX_CELL_CHARS

    p = tmp_path / "p.csv"
    p.write_text(HEADER + _rows(1) + "k2," + "x" * (MAX_CELL_CHARS + 10) + ",bag\n" + _rows(1))
    with pytest.raises(TableError, match=r"p\.csv, line 3: field larger than field limit"):
        read_table(p, max_bytes=2**30)


@pytest.mark.parametrize("name", ["o.csv", "o.tsv", "o.jsonl", "o.json", "o.parquet"])
def test_a_link_planted_at_the_temporary_name_is_never_written_through(tmp_path, name):
    from masc_engine.jobs.tables import write_table

    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / (name + ".partial")).symlink_to(victim)
    write_table(tmp_path / name, [{"a": 1, "b": "x"}], ["a", "b"])
    assert victim.read_text() == "precious"
    assert (tmp_path / name).is_file() and not (tmp_path / name).is_symlink()
    assert not (tmp_path / (name + ".partial")).exists() and not (tmp_path / (name + ".partial")).is_symlink()
    assert read_table(tmp_path / name).rows[0]["b"] == "x"


def test_a_map_written_over_a_planted_link_replaces_the_link(tmp_path):
    from PIL import Image

    from masc_engine.jobs.pairs.job import _save_png

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "0000001_cp.png"
    target.symlink_to(victim)
    _save_png(Image.new("RGB", (4, 4), (255, 0, 0)), target)
    assert victim.read_text() == "precious" and not target.is_symlink()
    assert Image.open(target).getpixel((0, 0)) == (255, 0, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0000001_cp.png", "victim.txt"]


def test_parquet_cells_json_has_no_word_for_are_read_as_text(tmp_path):
    import datetime
    import decimal
    import json

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "p.parquet"
    cols = {
        "prompt": pa.array(["a cat"]),
        "created": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5)], pa.timestamp("us")),
        "day": pa.array([datetime.date(2024, 1, 2)]),
        "price": pa.array([decimal.Decimal("12.50")], pa.decimal128(5, 2)),
        "took": pa.array([datetime.timedelta(seconds=90)], pa.duration("s")),
        "blob": pa.array([b"\x00\xff"], pa.binary()),
        "text_as_binary": pa.array(["a dog".encode()], pa.binary()),
        "tags": pa.array([[datetime.date(2024, 1, 3)]]),
        "n": pa.array([7]),
    }
    pq.write_table(pa.table(cols), p)
    row = read_table(p).rows[0]
    assert row == {
        "prompt": "a cat",
        "created": "2024-01-02T03:04:05",
        "day": "2024-01-02",
        "price": "12.50",
        "took": "0:01:30",
        "blob": "00ff",
        "text_as_binary": "a dog",
        "tags": ["2024-01-03"],
        "n": 7,
    }
    assert json.loads(json.dumps(row)) == row


def test_a_parquet_text_column_that_is_not_utf8_names_file_column_and_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    b = pa.array([b"fine", b"a backpack \xff"], pa.binary())
    prompt = pa.Array.from_buffers(pa.string(), len(b), b.buffers())
    p = tmp_path / "p.parquet"
    pq.write_table(pa.table({"key": ["k1", "k2"], "prompt": prompt}), p)
    with pytest.raises(TableError) as e:
        read_table(p, what="pairs")
    assert e.value.reason == "bad_pairs_file"
    assert f"{p}, row 2: column 'prompt' is not UTF-8 text" in str(e.value)


def test_a_carried_column_of_mixed_types_is_written_to_parquet_as_text(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from masc_engine.jobs.tables import write_table

    rows = [
        {"batch": 7, "n": 1, "x": None, "big": 2**70},
        {"batch": "seven", "n": 2, "x": {"a": [1]}, "big": 1},
        {"batch": None, "n": 3, "x": "s", "big": 2},
    ]
    p = write_table(tmp_path / "o.parquet", rows, ["batch", "n", "x", "big"])
    t = pq.read_table(p)
    assert t.schema.field("batch").type == pa.string() and t.schema.field("n").type == pa.int64()
    assert t.column("batch").to_pylist() == ["7", "seven", None]
    assert t.column("x").to_pylist() == [None, '{"a": [1]}', "s"]
    assert t.column("big").to_pylist() == [str(2**70), "1", "2"]


@pytest.mark.parametrize(
    "ref_mask, out_mask, sources", [("m/0.png", "", ("file", "")), ("", "m/1.png", ("", "file")), ("", "", ("", ""))]
)
def test_a_row_refused_for_its_text_reports_a_mask_source_only_where_its_cell_names_a_file(ref_mask, out_mask, sources):
    from masc_engine.errors import InputError
    from masc_engine.jobs.pairs.decoding import PairDecoding

    row = {"ref_image": "a.jpg", "ref_mask": ref_mask, "out_image": "b.jpg", "out_mask": out_mask}
    row.update(prompt="a cat", object_name="a" * 5000)
    e = InputError("object_name_too_long", "5000 tokens")
    pair = PairDecoding._row_pair(None, 2, row, "/", {}, {}, e)  # (the text's refusal reads nothing of self)
    assert pair.error is e and pair.mask_sources == sources


def test_an_input_column_named_like_a_result_column_is_refused_before_anything_runs(tmp_path):
    from masc_engine.jobs.pairs.columns import PairsFileError
    from masc_engine.jobs.pairs.run import run_pairs

    p = tmp_path / "p.csv"
    p.write_text(
        "ref_image,ref_mask,out_image,out_mask,prompt,object_name,cp,status,human\n"
        "a.jpg,a.png,b.jpg,b.png,a cat,cat,0.7 (human),approved,yes\n"
    )
    with pytest.raises(PairsFileError) as e:
        run_pairs(p, None, tmp_path / "o.csv")  # refused before the scorer is used
    assert "column(s) 'cp', 'status' are also result columns masc-run writes" in str(e.value)
    assert "rename them" in str(e.value) and "\n" not in str(e.value)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["p.csv"]


def test_cells_under_repeated_empty_header_cells_are_refused_not_folded(tmp_path):
    p = tmp_path / "p.csv"
    p.write_text("key,prompt,,\nk1,a,,\nk2,b,first,second\n")
    with pytest.raises(TableError, match=r"line 3: column 3 holds a cell \('first'\) under an empty header cell"):
        read_table(p)
    p.write_text("key,prompt,,\nk1,a,,\nk2,b,,last\n")
    with pytest.raises(TableError, match=r"line 3: column 4 holds a cell \('last'\)"):
        read_table(p)
    p.write_text("key,prompt,,\nk1,a,,\nk2,b\n")  # empty (and short) unnamed columns: read as before
    t = read_table(p)
    assert t.columns == ["key", "prompt", "", ""] and t.rows[1] == {"key": "k2", "prompt": "b", "": ""}
    p.write_text("key,prompt,\nk1,a,x\n")  # one unnamed column keeps its cells
    assert read_table(p).rows[0][""] == "x"


def test_wide_rows_count_their_cells_against_the_byte_budget(tmp_path):
    from masc_engine.jobs.tables import CELL_MEMORY_BYTES, ROW_MEMORY_BYTES

    p = tmp_path / "p.csv"
    p.write_text("ref_image," + ",".join(f"c{i}" for i in range(1000)) + "\n" + ("a.jpg" + ",x" * 1000 + "\n") * 50)
    need = p.stat().st_size + 50 * ROW_MEMORY_BYTES + 50 * 999 * CELL_MEMORY_BYTES
    assert len(read_table(p, max_bytes=need).rows) == 50
    with pytest.raises(TableError) as e:
        read_table(p, max_bytes=need - 1, budget_option="--max-pairs-mb")
    assert "line 51: 50 rows would take" in str(e.value) and "20 a cell past a row's first two (49950)" in str(e.value)
    j = tmp_path / "p.jsonl"
    j.write_text(('{"a": 1, "b": 2, "c": 3, "d": 4}\n') * 10)
    with pytest.raises(TableError, match="line 10: 10 rows"):
        read_table(j, max_bytes=j.stat().st_size + 10 * ROW_MEMORY_BYTES + 19 * CELL_MEMORY_BYTES)


def test_a_json_array_is_estimated_against_the_budget_before_it_is_parsed(tmp_path):
    from masc_engine.jobs.tables import ROW_MEMORY_BYTES

    p = tmp_path / "p.json"
    p.write_text("[" + ",".join(['{"a":1}'] * 5000) + "]")
    with pytest.raises(TableError) as e:
        read_table(p, max_bytes=p.stat().st_size + 1000 * ROW_MEMORY_BYTES)
    assert "p.json (estimated before parsing it): 5000 rows would take" in str(e.value)
    assert len(read_table(p, max_bytes=p.stat().st_size + 5000 * ROW_MEMORY_BYTES).rows) == 5000
